// The CUDA engine end to end against the CPU reference decoder, on tiny random checkpoints of each
// architecture written to a temp dir and loaded the way users load theirs (Engine::from_checkpoint):
//   - teacher-forced prompt + decode steps (Engine::score): logits per position, top-1 agreement;
//   - prefill only, longer than prefill_chunk so the prompt is cut into chunks;
//   - a ragged batch (score_batch: prompts of different lengths decoded together);
//   - CUDA graphs vs eager launches: the same greedy tokens and (nearly) the same logits;
//   - greedy generation through step() against the reference's greedy tokens;
//   - presence/frequency penalties and logprobs against the CPU backend's rule on the reference's
//     logits, in continuous batching and for a resumed sequence;
//   - finish reasons, and bad requests rejected by add_sequence with a one-line error.
// The reference runs in fp32 on exactly the checkpoint's bf16 weights; the engine computes in
// bf16 with fp32 accumulation, hence 2e-2 relative error per position (logits_check.hpp explains
// how top-1 near ties are counted).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/logprobs.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "logits_check.hpp"
#include "runtime/engine_tuning.hpp"
#include "runtime/tuner.hpp"
#include "scheduler/tuning_cache.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"
#include "engine_test_util.hpp"

namespace deepfuse {
namespace {

using testing::compare_logits;
using testing::greedy_request;
using testing::random_ids;
using testing::ScratchDir;
using testing::tiny_config;
using testing::tiny_models;
using testing::TinyModel;

using testing::kMaxLogitsError;
using testing::kMinTop1Agreement;

// Small pools and one or two batch buckets: GPU tests run side by side under ctest -j.
EngineOptions tiny_engine_options(int max_batch = 4, int max_context = 128, size_t kv_cache_mb = 16) {
  EngineOptions options;
  options.max_batch = max_batch;
  options.max_context = max_context;
  options.kv_cache_bytes = kv_cache_mb << 20;
  return options;
}

// A checkpoint of the parameter's model with fresh random bf16 weights, and the reference decoder
// over exactly those weights.
class EngineVsReference : public ::testing::TestWithParam<int> {
 protected:
  // max_position > 0: the model takes that many positions instead of its own.
  void make_model(uint64_t salt, int max_position = 0) {
    rng_ = testing::make_rng(salt * 16 + GetParam());
    TinyModel model = tiny_models()[GetParam()];
    if (max_position > 0) model.config.max_position_embeddings = max_position;
    MakeModelOptions options;
    options.seed = rng_();
    write_random_checkpoint(model.config, scratch_.path(), options);
    config_ = load_model_config(scratch_.path());
    reference_ = std::make_unique<reference::Decoder>(config_,
                                                      load_reference_weights(Checkpoint(scratch_.path()), config_));
    vocab_ = static_cast<size_t>(config_.vocab_size);
  }

  Engine load_engine(const EngineOptions& options) {
    return Engine::from_checkpoint(scratch_.path(), options);
  }

  // Reference logits [ids.size(), vocab]; its prompt and one-token-at-a-time paths agree exactly.
  std::vector<float> reference_logits(std::span<const int32_t> ids) const {
    reference::KvCache cache = reference_->new_cache();
    return reference_->forward(ids, cache);
  }

  // The RMS of the reference's logits after a random prompt: penalties in this unit move greedy
  // picks on every tiny model, whatever its logits' scale (tied embeddings give larger logits).
  float logit_scale() {
    const std::vector<float> logits = reference_logits(random_ids(rng_, 8, config_.vocab_size));
    return static_cast<float>(testing::rms(std::span<const float>(logits.end() - vocab_, logits.end())));
  }

  void expect_matches_reference(const std::vector<float>& logits, std::span<const int32_t> ids,
                                const std::string& what) const {
    ASSERT_EQ(logits.size(), ids.size() * vocab_) << what;
    EXPECT_EQ(testing::count_nan(logits), 0u) << what;
    const testing::LogitsComparison c = compare_logits(logits, reference_logits(ids), vocab_);
    std::printf("[ %s ] %s: %s\n", tiny_models()[GetParam()].name.c_str(), what.c_str(), c.describe().c_str());
    EXPECT_LT(c.worst_error, kMaxLogitsError) << what << ": " << c.describe();
    EXPECT_GT(c.top1_agreement(), kMinTop1Agreement) << what << ": " << c.describe();
  }

  // Fresh random ids for sequences of `totals` tokens each.
  std::vector<std::vector<int32_t>> random_sequences(const std::vector<int>& totals) {
    std::vector<std::vector<int32_t>> sequences;
    for (int total : totals) sequences.push_back(random_ids(rng_, total, config_.vocab_size));
    return sequences;
  }

  // Teacher-forced logits of `sequences` scored as one ragged batch (prompt s of prompts[s]
  // tokens, the rest decode steps), each against the reference.
  void expect_batch_matches_reference(Engine& engine, const std::vector<std::vector<int32_t>>& sequences,
                                      const std::vector<int>& prompts, const std::string& what) const {
    const std::vector<std::vector<float>> logits = engine.score_batch(sequences, prompts);
    ASSERT_EQ(logits.size(), sequences.size()) << what;
    for (size_t s = 0; s < sequences.size(); ++s)
      expect_matches_reference(logits[s], sequences[s],
                               what + ", sequence " + std::to_string(s) + " (prompt " + std::to_string(prompts[s]) +
                                   ", " + std::to_string(sequences[s].size()) + " tokens)");
  }

  int follows_reference_greedy(std::span<const int32_t> prompt, std::span<const int32_t> ours,
                               const std::string& what) const {
    return testing::reference_greedy_matches(*reference_, prompt, ours, config_.vocab_size, what);
  }

  // The tokens a request produced (penalties, logprobs: SequenceRequest) against the CPU backend's
  // rule: the reference decoder runs along the engine's own tokens, and at each step its logits,
  // penalized over the tokens generated so far (the prompt's last prior_generated ids, then the
  // engine's), must make a greedy token their argmax or a near tie of it, and give the reported
  // logprobs (token_logprobs) within kLogprobTolerance of the row's RMS. Sampled tokens follow the
  // GPU's draws, so only their logprobs are checked. Adds to `changed` how many greedy picks the
  // penalties changed in the reference.
  void expect_choices_follow_reference(const SequenceRequest& request, const std::vector<StepToken>& tokens,
                                       const std::string& what, int& changed) const {
    // A logit may be off by ~kMaxLogitsError of the row's RMS (more at its largest entries); a
    // logprob carries two such errors, its logit's and the log-sum-exp's.
    constexpr double kLogprobTolerance = 5 * kMaxLogitsError;
    const int vocab = config_.vocab_size;
    const bool greedy = request.sampling.temperature <= 0.0f;
    reference::KvCache cache = reference_->new_cache();
    std::vector<float> logits = reference_->forward(request.prompt, cache);
    std::vector<int32_t> generated(request.prompt.end() - request.prior_generated, request.prompt.end());
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::string at = what + ", token " + std::to_string(t);
      const StepToken& token = tokens[t];
      ASSERT_TRUE(token.id >= 0 && token.id < vocab) << at << ": id " << token.id;
      std::vector<float> row(logits.end() - vocab, logits.end());
      const size_t plain_best = testing::argmax(row);
      reference::apply_presence_frequency_penalties(row, request.presence_penalty, request.frequency_penalty,
                                                    generated);
      const size_t best = testing::argmax(row);
      if (greedy) {
        changed += best != plain_best;
        EXPECT_TRUE(static_cast<size_t>(token.id) == best || testing::near_tie(row, token.id, best))
            << at << ": engine " << token.id << ", reference " << best << " (penalized logits " << row[token.id]
            << " vs " << row[best] << ", row RMS " << testing::rms(row) << ")";
      }
      if (request.top_logprobs < 0) {
        EXPECT_TRUE(token.top_logprobs.empty()) << at << ": alternatives nobody asked for";
      } else {
        const double tolerance = kLogprobTolerance * testing::rms(row);
        const TokenLogprobs expected = token_logprobs(row, token.id, request.top_logprobs);
        const double log_sum = row[token.id] - static_cast<double>(expected.logprob);
        auto reference_logprob = [&](int32_t id) { return row[id] - log_sum; };
        EXPECT_NEAR(token.logprob, expected.logprob, tolerance) << at;
        ASSERT_EQ(token.top_logprobs.size(), expected.top.size()) << at;
        for (size_t i = 0; i < token.top_logprobs.size(); ++i) {
          const TokenLogprob& alternative = token.top_logprobs[i];
          ASSERT_TRUE(alternative.id >= 0 && alternative.id < vocab) << at << ", alternative " << i;
          EXPECT_NEAR(alternative.logprob, reference_logprob(alternative.id), tolerance) << at << ", alternative " << i;
          // One of the reference's most likely, or a near tie of its last.
          EXPECT_GE(reference_logprob(alternative.id), expected.top.back().logprob - tolerance)
              << at << ": alternative " << i << " (id " << alternative.id << ") is not among the reference's top "
              << expected.top.size();
          if (i > 0) EXPECT_LE(alternative.logprob, token.top_logprobs[i - 1].logprob) << at << ", alternative " << i;
        }
        // The engine's own top pick is the id its sampler took: the logits it reports are the ones sampled.
        if (greedy && !token.top_logprobs.empty()) {
          EXPECT_EQ(token.top_logprobs[0].id, token.id) << at;
          EXPECT_EQ(token.top_logprobs[0].logprob, token.logprob) << at;
        }
      }
      generated.push_back(token.id);
      logits = reference_->forward(std::span(&token.id, 1), cache);
    }
  }

  ScratchDir scratch_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  std::unique_ptr<reference::Decoder> reference_;
  size_t vocab_ = 0;
};

TEST_P(EngineVsReference, TeacherForcedDecodeMatchesReference) {
  DF_REQUIRE_GPU();
  make_model(1);
  Engine engine = load_engine(tiny_engine_options());
  const int prompt = 40, decode_steps = 32;
  const std::vector<int32_t> ids = random_ids(rng_, prompt + decode_steps, config_.vocab_size);
  expect_matches_reference(engine.score(ids, prompt), ids, "prompt 40 + 32 decode steps");
}

// Short sequences decode under the short-context plans (splits merged in thread-block clusters)
// and longer ones under the buckets' plans (merged in L2): one sequence and a ragged pair, steps
// well inside the short plans and on either side of the switch at 2048 keys (these models' few
// kv heads keep the 16 pages per cluster split), each plan's graph captured mid-sequence.
TEST_P(EngineVsReference, DecodeAcrossTheShortContextPlan) {
  DF_REQUIRE_GPU();
  make_model(9, 4096);
  Engine engine = load_engine(tiny_engine_options(2, 4096, 64));
  for (int prompt : {1016, 2040}) {  // keys prompt + 1 .. prompt + 16 in the decode steps
    const std::vector<int32_t> ids = random_ids(rng_, prompt + 16, config_.vocab_size);
    expect_matches_reference(engine.score(ids, prompt), ids, "prompt " + std::to_string(prompt) + " + 16 decode steps");
  }
  expect_batch_matches_reference(engine, random_sequences({2056, 300}), {2040, 284}, "a pair across 2048 keys");
}

// Steps of different buckets share the decode attention workspace, laid out by the batch: a
// 32-sequence step's log-sum-exps lie where a 64-sequence step's merge counters are (two kv heads:
// 64 against 128 counters, split 4 and 2 ways on 132 SMs). Each step clears its counters, else
// the second batch's splits never merge (found reviewing the speculative verify step).
TEST_P(EngineVsReference, BucketsSharingTheAttentionWorkspaceFollowReference) {
  DF_REQUIRE_GPU();
  make_model(11, 512);
  EngineOptions options = tiny_engine_options(64, 256, 64);
  options.plan_overrides = parse_plan_overrides("attention.short_context=off,attention.merge=workspace");
  Engine engine = load_engine(options);
  for (int count : {32, 64, 32}) {
    const std::vector<int> prompts(count, 180);
    expect_batch_matches_reference(engine, random_sequences(std::vector<int>(count, 184)), prompts,
                                   std::to_string(count) + " sequences of 180 + 4 decode steps");
  }
}

TEST_P(EngineVsReference, ChunkedPrefillMatchesReference) {
  DF_REQUIRE_GPU();
  make_model(2);
  EngineOptions options = tiny_engine_options();
  options.prefill_chunk = 16;  // 45 tokens: chunks of 16, 16 and 13
  Engine engine = load_engine(options);
  const std::vector<int32_t> ids = random_ids(rng_, 45, config_.vocab_size);
  expect_matches_reference(engine.score(ids, static_cast<int>(ids.size())), ids, "prefill only, chunks of 16");
  // And chunked prefill followed by decode steps reading the chunked cache.
  expect_matches_reference(engine.score(ids, 33), ids, "prefill 33 in chunks of 16 + 12 decode steps");
}

TEST_P(EngineVsReference, RaggedBatchMatchesReferencePerSequence) {
  DF_REQUIRE_GPU();
  make_model(3);
  Engine engine = load_engine(tiny_engine_options());
  // Three sequences (batch bucket 4, one padded slot) whose prompts and decode lengths all differ,
  // so some sit out the last steps.
  expect_batch_matches_reference(engine, random_sequences({32, 49, 37}), {5, 40, 17}, "ragged batch");
}

TEST_P(EngineVsReference, EitherMlpCopyServesAnyStep) {
  DF_REQUIRE_GPU();
  make_model(6);
  // The built-in plan sends the 40-token prefill above to the MLP's unfused copy and the decode
  // steps to the fused kernel. "fused": the fused kernel serves every step, prefills included;
  // "bucket 4 unfused": the batch of three decodes through the unfused copy.
  const std::vector<std::vector<int32_t>> sequences = random_sequences({30, 47, 35});
  std::map<std::string, int> launches_per_layer;
  for (const std::string plan : {"mlp=fused,prefill.mlp=fused", "mlp@4=unfused"}) {
    EngineOptions options = tiny_engine_options();
    options.plan_overrides = parse_plan_overrides(plan);
    Engine engine = load_engine(options);
    expect_batch_matches_reference(engine, sequences, {5, 40, 17}, plan);
    // The captured step's kernels, counted from the graph: at least one per launch of the op list.
    const EngineStats stats = engine.stats(3);
    EXPECT_GE(stats.kernels_per_decode_step, stats.launches_per_decode_step) << plan;
    launches_per_layer[plan] = stats.launches_per_layer;
  }
  // The unfused copy's gate_up GEMM, silu_and_mul and down GEMM replace one launch.
  EXPECT_EQ(launches_per_layer["mlp@4=unfused"], launches_per_layer["mlp=fused,prefill.mlp=fused"] + 2);
}

// Every variant the tuner can pick, and the Hopper MLP pair it does not time yet (fused_wgmma,
// sm_90), forced in turn by an override: the engine's logits still match the reference decoder's
// (the tiny models' buckets are 1, 2 and 4).
TEST_P(EngineVsReference, EveryPlanVariantMatchesReference) {
  DF_REQUIRE_GPU();
  make_model(8);
  const std::vector<std::vector<int32_t>> sequences = random_sequences({30, 47, 35});
  for (const std::string plan :
       {"mlp=unfused", "mlp=fused,prefill.mlp=fused", "front=unfused,o_proj=cublaslt", "o_proj=cublaslt",
        "mlp=unfused,o_proj=gemv", "attention.merge=workspace", "attention.warps=4", "attention.warps=8",
        "attention.splits=1", "attention.splits=3", "attention.short_context=off", "attention.merge@1=cluster",
        "mlp@1=fused_batched,mlp@2=fused_batched,mlp@4=fused_batched",
        "mlp@1=fused_wgmma,mlp@2=fused_wgmma,mlp@4=fused_wgmma"}) {
    EngineOptions options = tiny_engine_options();
    try {
      options.plan_overrides = parse_plan_overrides(plan);
      Engine engine = load_engine(options);
      expect_batch_matches_reference(engine, sequences, {5, 40, 17}, plan);
    } catch (const Error& e) {
      // Only a variant this model or GPU cannot run may be refused, and the message names it.
      const std::string what = e.what();
      EXPECT_NE(what.find(plan.substr(0, plan.find('='))), std::string::npos) << plan << ": " << what;
    }
  }
}

// EngineOptions::tune_gemms: the algorithms timed at construction serve the decode steps' cuBLASLt
// GEMMs (the lm_head at every bucket, o_proj where the tiny models run it through cuBLASLt, the
// unfused MLP of the batch-4 bucket), and the logits still match the reference.
TEST_P(EngineVsReference, TimedGemmAlgorithmsMatchReference) {
  DF_REQUIRE_GPU();
  make_model(7);
  EngineOptions options = tiny_engine_options();
  options.plan_overrides = parse_plan_overrides("mlp@4=unfused");
  options.tune_gemms = true;
  Engine engine = load_engine(options);
  std::set<std::string> tuned;  // "op at m"
  for (const GemmTuning& t : engine.gemm_tunings()) {
    tuned.insert(t.op + " at " + std::to_string(t.m));
    EXPECT_GE(t.candidates, 1) << t.op;
    EXPECT_LT(t.chosen, t.candidates) << t.op;
    // Each call reads its weights (n x k bf16): not faster than 20 TB/s, above any GPU's HBM or L2.
    EXPECT_GE(t.chosen_us, 2.0 * t.n * t.k / 20e6) << t.op << " " << t.n << "x" << t.k;
    EXPECT_LE(t.chosen_us, t.heuristic_us) << t.op;
  }
  for (const char* op : {"lm_head at 1", "lm_head at 2", "lm_head at 4", "mlp gate_up at 4", "mlp down at 4"})
    EXPECT_TRUE(tuned.count(op)) << op << " was not timed";
  EXPECT_FALSE(tuned.count("mlp gate_up at 2")) << "the fused MLP serves 2 tokens";

  expect_batch_matches_reference(engine, random_sequences({30, 47, 35}), {5, 40, 17}, "timed GEMM algorithms");
}

// Steps until every one of `sequences` reported its finish (at most max_steps steps); returns
// what step() produced for each, in order.
std::map<SequenceId, std::vector<StepToken>> step_until_finished(Engine& engine, const std::vector<SequenceId>& sequences,
                                                                 int max_steps) {
  std::map<SequenceId, std::vector<StepToken>> produced;
  size_t finished = 0;
  for (int step = 0; step < max_steps && finished < sequences.size(); ++step)
    for (const StepToken& token : engine.step()) {
      produced[token.sequence].push_back(token);
      if (token.finish != FinishReason::none) ++finished;
    }
  EXPECT_EQ(finished, sequences.size()) << "sequences still running after " << max_steps << " steps";
  return produced;
}

// Greedy tokens for each prompt (decoded together), in prompt order.
std::vector<std::vector<int32_t>> generate_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                  int max_new_tokens) {
  std::vector<SequenceId> sequences;
  for (const auto& prompt : prompts) sequences.push_back(engine.add_sequence(greedy_request(prompt, max_new_tokens)));
  auto produced = step_until_finished(engine, sequences, max_new_tokens + 2);
  EXPECT_EQ(engine.running_sequences(), 0) << "finished sequences must leave the engine";
  std::vector<std::vector<int32_t>> tokens;
  for (SequenceId sequence : sequences) {
    tokens.emplace_back();
    for (const StepToken& token : produced[sequence]) tokens.back().push_back(token.id);
  }
  return tokens;
}

TEST_P(EngineVsReference, CudaGraphsAndEagerLaunchesAgree) {
  DF_REQUIRE_GPU();
  make_model(4);
  // Every kernel of the unfused engine is deterministic, so there graphs and eager launches must
  // agree bit for bit. The fused MLP sums partial products with fp32 atomics in whatever order
  // blocks arrive, so two runs of the same engine (graphs or not) can round the bf16 residual
  // stream differently in a few elements: there the greedy tokens must agree and the logits stay
  // within the bf16 rounding of the stream.
  // "cuBLASLt": every op of the step through cuBLASLt and the deterministic kernels.
  for (const bool cublaslt : {true, false}) {
    SCOPED_TRACE(cublaslt ? "cuBLASLt plan" : "built-in plan");
    const MlpVariant variant = cublaslt ? MlpVariant::unfused : MlpVariant::fused;
    EngineOptions graph_options = tiny_engine_options(), eager_options = tiny_engine_options();
    if (cublaslt)
      graph_options.plan_overrides = eager_options.plan_overrides =
          parse_plan_overrides("mlp=unfused,front=unfused,o_proj=cublaslt");
    eager_options.cuda_graphs = false;
    Engine graphs = load_engine(graph_options);
    Engine eager = load_engine(eager_options);
    const std::vector<std::vector<int32_t>> prompts = {random_ids(rng_, 7, config_.vocab_size),
                                                       random_ids(rng_, 33, config_.vocab_size)};
    const auto graph_tokens = generate_greedy(graphs, prompts, 20);
    const auto eager_tokens = generate_greedy(eager, prompts, 20);
    for (size_t s = 0; s < prompts.size(); ++s) {
      EXPECT_EQ(graph_tokens[s].size(), 20u) << "sequence " << s;
      if (variant == MlpVariant::unfused) {
        EXPECT_EQ(graph_tokens[s], eager_tokens[s]) << "greedy tokens of sequence " << s;
        continue;
      }
      // Fused: equal up to the first difference, and that difference only where the eager
      // engine's own logits rate both picks a near tie.
      const auto diverged = std::mismatch(graph_tokens[s].begin(), graph_tokens[s].end(), eager_tokens[s].begin(),
                                          eager_tokens[s].end());
      if (diverged.first == graph_tokens[s].end()) continue;
      std::vector<int32_t> ids = prompts[s];
      ids.insert(ids.end(), graph_tokens[s].begin(), diverged.first);
      const std::vector<float> logits = eager.score(ids, static_cast<int>(ids.size()));
      const std::span<const float> last(logits.data() + (ids.size() - 1) * vocab_, vocab_);
      EXPECT_TRUE(testing::near_tie(last, *diverged.first, *diverged.second))
          << "sequence " << s << ": graph and eager greedy tokens differ at step "
          << (diverged.first - graph_tokens[s].begin()) << " without a near tie";
    }
    const std::vector<int32_t> ids = random_ids(rng_, 40, config_.vocab_size);
    const std::vector<float> with_graphs = graphs.score(ids, 30), without = eager.score(ids, 30);
    ASSERT_EQ(with_graphs.size(), without.size());
    ASSERT_EQ(with_graphs.size(), ids.size() * vocab_);
    if (variant == MlpVariant::unfused) {
      EXPECT_EQ(with_graphs, without) << "unfused engine: graph and eager logits differ";
      continue;
    }
    for (size_t p = 0; p < ids.size(); ++p) {
      const std::span<const float> a(with_graphs.data() + p * vocab_, vocab_), b(without.data() + p * vocab_, vocab_);
      EXPECT_LT(testing::row_relative_error(a, b), 1e-2) << "position " << p;
    }
  }
}

TEST_P(EngineVsReference, GreedyGenerationFollowsReference) {
  DF_REQUIRE_GPU();
  make_model(5);
  Engine engine = load_engine(tiny_engine_options());
  const int new_tokens = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int length : {1, 20, 45}) prompts.push_back(random_ids(rng_, length, config_.vocab_size));
  const auto generated = generate_greedy(engine, prompts, new_tokens);
  int compared = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<int32_t>& ours = generated[s];
    ASSERT_EQ(ours.size(), static_cast<size_t>(new_tokens)) << "sequence " << s;
    compared += follows_reference_greedy(prompts[s], ours, "sequence " + std::to_string(s));
  }
  std::printf("[ %s ] greedy tokens equal to the reference: %d of %d\n", tiny_models()[GetParam()].name.c_str(),
              compared, new_tokens * static_cast<int>(prompts.size()));
}

// `deepfuse tune` on a tiny model: the profiler times every bucket's candidates, the plan it saves
// in a tuning cache is the one a new engine then runs, and that engine's logits match the
// reference and its greedy tokens follow the reference decoder's.
TEST_P(EngineVsReference, TunedPlanFollowsReference) {
  DF_REQUIRE_GPU();
  make_model(9);
  const std::filesystem::path cache = scratch_.path() / "tuning" / "cache.json";
  EngineOptions options = tiny_engine_options();
  {
    Engine tuning = runtime::EngineTuning::from_checkpoint(scratch_.path(), options, {});
    const runtime::TuneOutcome outcome = runtime::tune(tuning, {.context = 40, .replays = 3});
    ASSERT_EQ(outcome.tuned.buckets.size(), tuning.plan().buckets.size());
    EXPECT_EQ(outcome.tuned.source.rfind("tuned ", 0), 0u) << outcome.tuned.source;
    EXPECT_FALSE(outcome.trials.empty());
    for (const scheduler::Trial& trial : outcome.trials) EXPECT_GT(trial.ms, 0.0) << trial.op << " " << trial.variant;
    scheduler::save_tuned_plan(cache, runtime::EngineTuning::key(tuning), outcome.tuned);
  }
  options.tuning_cache = cache;
  Engine engine = load_engine(options);
  EXPECT_EQ(engine.plan_notice(), "");
  EXPECT_EQ(engine.plan().source.rfind("tuned ", 0), 0u) << engine.plan().source;
  expect_batch_matches_reference(engine, random_sequences({30, 47, 35}), {5, 40, 17}, "tuned plan");
  std::vector<std::vector<int32_t>> prompts;
  for (int length : {3, 33}) prompts.push_back(random_ids(rng_, length, config_.vocab_size));
  const auto generated = generate_greedy(engine, prompts, 16);
  for (size_t s = 0; s < prompts.size(); ++s)
    follows_reference_greedy(prompts[s], generated[s], "tuned plan, sequence " + std::to_string(s));
}

// Continuous batching with steps launched ahead (EngineOptions::overlap_steps) and without: six
// sequences through four decode rows, so two wait and join while others run; they finish at
// different steps (rows move into the holes), one on a stop id, one is removed mid-run. Each
// sequence's tokens follow the reference's greedy decode of its own prompt.
TEST_P(EngineVsReference, ContinuousBatchingFollowsReference) {
  DF_REQUIRE_GPU();
  make_model(7);
  const std::vector<int> prompt_lengths = {9, 33, 1, 20, 17, 5}, new_tokens = {14, 5, 20, 9, 12, 16};
  std::vector<std::vector<int32_t>> prompts;
  for (int length : prompt_lengths) prompts.push_back(random_ids(rng_, length, config_.vocab_size));
  // Sequence 3 stops at the reference's 6th greedy token (if that id did not come earlier).
  reference::KvCache cache = reference_->new_cache();
  std::vector<float> logits = reference_->forward(prompts[3], cache);
  std::vector<int32_t> reference_tokens;
  for (int t = 0; t < 6; ++t) {
    reference_tokens.push_back(static_cast<int32_t>(
        testing::argmax(std::span<const float>(logits.data() + logits.size() - vocab_, vocab_))));
    logits = reference_->forward(std::span(&reference_tokens.back(), 1), cache);
  }
  const int32_t stop_id = reference_tokens[5];

  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "steps overlapped" : "one step at a time");
    EngineOptions options = tiny_engine_options();
    options.overlap_steps = overlap;
    Engine engine = load_engine(options);
    std::vector<SequenceId> ids;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SequenceRequest request = greedy_request(prompts[s], new_tokens[s]);
      if (s == 3) request.stop_ids = {stop_id};
      ids.push_back(engine.add_sequence(request));
    }
    std::map<SequenceId, std::vector<StepToken>> produced;
    bool removed = false;  // sequence 5, once it has two tokens (with a step in flight when overlapped)
    for (int step = 0; engine.running_sequences() > 0 && step < 64; ++step) {
      for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
      if (!removed && produced[ids[5]].size() >= 2) {
        engine.remove_sequence(ids[5]);
        removed = true;
      }
    }
    EXPECT_EQ(engine.running_sequences(), 0);
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::string what = "sequence " + std::to_string(s);
      const std::vector<StepToken>& tokens = produced[ids[s]];
      ASSERT_FALSE(tokens.empty()) << what;
      std::vector<int32_t> generated;
      for (const StepToken& token : tokens) generated.push_back(token.id);
      const int followed = follows_reference_greedy(prompts[s], generated, what);
      for (size_t t = 0; t + 1 < tokens.size(); ++t) EXPECT_EQ(tokens[t].finish, FinishReason::none) << what;
      if (s == 5) {  // removed: no finish reported, a prefix of its tokens
        EXPECT_EQ(tokens.back().finish, FinishReason::none) << what;
        EXPECT_LT(tokens.size(), static_cast<size_t>(new_tokens[s])) << what;
        continue;
      }
      if (followed < static_cast<int>(tokens.size())) continue;  // after a near tie: other text
      const bool stopped = s == 3 && std::find(generated.begin(), generated.end(), stop_id) != generated.end();
      if (stopped) {
        EXPECT_EQ(generated.back(), stop_id) << what;
        EXPECT_EQ(std::count(generated.begin(), generated.end(), stop_id), 1) << what;
        EXPECT_EQ(tokens.back().finish, FinishReason::stop_token) << what;
      } else {
        EXPECT_EQ(tokens.size(), static_cast<size_t>(new_tokens[s])) << what;
        EXPECT_EQ(tokens.back().finish, FinishReason::max_tokens) << what;
      }
    }
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
  }
}

// The server's engine options: prompts prefilled at most 16 tokens per step (a long one spread over
// steps while others decode) and prefix caching (later prompts that share full blocks take their
// pages and report them as cached). Every sequence still follows the reference's greedy decode.
TEST_P(EngineVsReference, PrefillBudgetAndPrefixCacheFollowReference) {
  DF_REQUIRE_GPU();
  make_model(11);
  EngineOptions options = tiny_engine_options();
  options.prefill_tokens_per_step = 16;
  options.prefix_caching = true;
  Engine engine = load_engine(options);
  const std::vector<int32_t> shared = random_ids(rng_, 40, config_.vocab_size);
  std::vector<std::vector<int32_t>> prompts;
  for (int suffix : {3, 9, 1}) {
    std::vector<int32_t> prompt = shared;
    for (const int32_t id : random_ids(rng_, suffix, config_.vocab_size)) prompt.push_back(id);
    prompts.push_back(prompt);
  }
  prompts.push_back(random_ids(rng_, 70, config_.vocab_size));  // unrelated, prefilled over 5 steps
  std::map<SequenceId, std::vector<StepToken>> produced;
  auto run = [&](int max_steps) {
    for (int step = 0; engine.running_sequences() > 0 && step < max_steps; ++step)
      for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
  };
  std::vector<SequenceId> ids;
  ids.push_back(engine.add_sequence(greedy_request(prompts[0], 12)));
  run(64);  // alone: computes and registers the shared blocks
  for (size_t s = 1; s < prompts.size(); ++s) ids.push_back(engine.add_sequence(greedy_request(prompts[s], 12)));
  run(128);
  EXPECT_EQ(engine.running_sequences(), 0);
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::string what = "sequence " + std::to_string(s);
    const std::vector<StepToken>& tokens = produced[ids[s]];
    ASSERT_EQ(tokens.size(), 12u) << what;
    const int expected_cached = s == 0 || s == 3 ? 0 : 32;  // two full shared blocks of 16
    EXPECT_EQ(tokens[0].cached_tokens, expected_cached) << what;
    std::vector<int32_t> generated;
    for (const StepToken& token : tokens) generated.push_back(token.id);
    follows_reference_greedy(prompts[s], generated, what);
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
  EXPECT_GT(stats.kv_pages_cached, 0);
}

// The next turn of a chat resends the whole text: the blocks a finished sequence generated are
// cached too, so only the new tokens are prefilled.
TEST_P(EngineVsReference, PrefixCacheKeepsGeneratedBlocks) {
  DF_REQUIRE_GPU();
  make_model(12);
  EngineOptions options = tiny_engine_options();
  options.prefix_caching = true;
  Engine engine = load_engine(options);
  const std::vector<int32_t> first_prompt = random_ids(rng_, 20, config_.vocab_size);
  const std::vector<int32_t> answer = generate_greedy(engine, {first_prompt}, 30)[0];
  ASSERT_EQ(answer.size(), 30u);
  // 20 prompt + 29 fed generated tokens = 49 positions computed: three full blocks (48).
  std::vector<int32_t> next_turn = first_prompt;
  next_turn.insert(next_turn.end(), answer.begin(), answer.end());
  for (const int32_t id : random_ids(rng_, 5, config_.vocab_size)) next_turn.push_back(id);
  const SequenceId id = engine.add_sequence(greedy_request(next_turn, 8));
  std::vector<StepToken> tokens;
  while (engine.running_sequences() > 0)
    for (const StepToken& token : engine.step())
      if (token.sequence == id) tokens.push_back(token);
  ASSERT_EQ(tokens.size(), 8u);
  EXPECT_EQ(tokens[0].cached_tokens, 48);
  std::vector<int32_t> generated;
  for (const StepToken& token : tokens) generated.push_back(token.id);
  follows_reference_greedy(next_turn, generated, "the next turn");
  EXPECT_EQ(engine.stats().kv_pages_free, engine.stats().kv_pages_total) << "pages leaked";
}

TEST_P(EngineVsReference, FinishReasons) {
  DF_REQUIRE_GPU();
  make_model(6);
  Engine engine = load_engine(tiny_engine_options());
  const std::vector<int32_t> prompt = random_ids(rng_, 12, config_.vocab_size);
  const std::vector<int32_t> greedy = generate_greedy(engine, {prompt}, 6)[0];
  ASSERT_EQ(greedy.size(), 6u);

  // max_new_tokens: exactly that many tokens, only the last one marked, then the sequence is gone.
  const SequenceId counted = engine.add_sequence(greedy_request(prompt, 6));
  std::vector<StepToken> seen = step_until_finished(engine, {counted}, 8)[counted];
  ASSERT_EQ(seen.size(), 6u);
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_EQ(seen[i].finish, i + 1 < seen.size() ? FinishReason::none : FinishReason::max_tokens) << "token " << i;
  EXPECT_EQ(engine.running_sequences(), 0);

  // A stop id ends the sequence at its first occurrence. The engine is not bitwise deterministic
  // (the fused MLP reduces in fp32 in arrival order), so after a near-tie this run's greedy tokens
  // may differ from the first run's: the rule is checked against this run's own tokens.
  SequenceRequest request = greedy_request(prompt, 6);
  const int32_t stop_id = greedy[3];
  request.stop_ids = {stop_id};
  const SequenceId stopped = engine.add_sequence(request);
  seen = step_until_finished(engine, {stopped}, 8)[stopped];
  ASSERT_FALSE(seen.empty());
  const auto first_stop = std::find_if(seen.begin(), seen.end(), [&](const StepToken& s) { return s.id == stop_id; });
  if (first_stop != seen.end()) {
    EXPECT_EQ(first_stop + 1, seen.end()) << "tokens after the stop id";
    EXPECT_EQ(seen.back().finish, FinishReason::stop_token);
  } else {
    EXPECT_EQ(seen.size(), 6u) << "without its stop id the sequence runs to max_new_tokens";
    EXPECT_EQ(seen.back().finish, FinishReason::max_tokens);
  }
  for (size_t i = 0; i + 1 < seen.size(); ++i) EXPECT_EQ(seen[i].finish, FinishReason::none) << "token " << i;
  EXPECT_EQ(engine.running_sequences(), 0);
}

// Presence/frequency penalties and logprobs in continuous batching, steps launched ahead and not:
// six sequences through four rows, plain ones among them. The first to finish is a logprob row,
// so the penalized row after it moves into its hole (its counts with it); later sequences join in
// rows penalized sequences held (counts started afresh). Plain rows must stay greedy and report
// no logprobs.
TEST_P(EngineVsReference, PenaltiesAndLogprobsFollowReference) {
  DF_REQUIRE_GPU();
  make_model(13);
  struct Case {
    int prompt, new_tokens;
    float presence, frequency;
    int top_logprobs;
    float temperature;
  };
  const std::vector<Case> cases = {
      {9, 14, 0.0f, 0.0f, -1, 0.0f},    // plain
      {33, 20, -2.0f, 0.4f, -1, 0.0f},  // repeats rewarded, then pushed back: picks hang on exact counts
      {1, 6, 0.0f, 0.0f, 5, 0.0f},      // logprobs alone, finishes first
      {20, 16, 1.0f, 0.5f, 3, 0.0f},    // both
      {17, 12, 0.0f, 0.0f, 0, 0.0f},    // the chosen token's logprob alone
      {5, 16, -1.5f, 0.3f, 5, 0.8f},    // sampled (the GPU's draws): its logprobs
  };
  const float scale = logit_scale();  // the cases' penalties are in units of the logits' RMS
  std::vector<SequenceRequest> requests;
  for (const Case& c : cases) {
    SequenceRequest request = greedy_request(random_ids(rng_, c.prompt, config_.vocab_size), c.new_tokens);
    request.presence_penalty = c.presence * scale;
    request.frequency_penalty = c.frequency * scale;
    request.top_logprobs = c.top_logprobs;
    request.sampling.temperature = c.temperature;
    request.sampling.seed = rng_();
    requests.push_back(request);
  }
  int changed = 0;
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "steps overlapped" : "one step at a time");
    EngineOptions options = tiny_engine_options();
    options.overlap_steps = overlap;
    Engine engine = load_engine(options);
    std::vector<SequenceId> ids;
    for (const SequenceRequest& request : requests) ids.push_back(engine.add_sequence(request));
    auto produced = step_until_finished(engine, ids, 96);
    EXPECT_EQ(engine.running_sequences(), 0);
    for (size_t s = 0; s < requests.size(); ++s) {
      const std::vector<StepToken>& tokens = produced[ids[s]];
      ASSERT_EQ(tokens.size(), static_cast<size_t>(cases[s].new_tokens)) << "sequence " << s;
      expect_choices_follow_reference(requests[s], tokens, "sequence " + std::to_string(s), changed);
    }
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
  }
  std::printf("[ %s ] greedy picks the penalties changed in the reference: %d\n", tiny_models()[GetParam()].name.c_str(),
              changed);
  EXPECT_GT(changed, 0) << "the penalties never changed a greedy pick: nothing was tested";
}

// A sequence resumed by its caller (prompt + its tokens, as the scheduler resumes a preempted one:
// SequenceRequest::prior_generated): the tokens it generated before count for its penalties.
TEST_P(EngineVsReference, ResumedSequenceKeepsItsPenaltyCounts) {
  DF_REQUIRE_GPU();
  make_model(14);
  Engine engine = load_engine(tiny_engine_options());
  SequenceRequest first = greedy_request(random_ids(rng_, 12, config_.vocab_size), 14);
  const float scale = logit_scale();
  first.presence_penalty = -2.0f * scale;  // repeats rewarded: the prior tokens' counts decide picks
  first.frequency_penalty = 0.4f * scale;
  first.top_logprobs = 2;
  const SequenceId first_id = engine.add_sequence(first);
  const std::vector<StepToken> before = step_until_finished(engine, {first_id}, 20)[first_id];
  ASSERT_EQ(before.size(), 14u);
  int changed = 0;
  expect_choices_follow_reference(first, before, "first run", changed);

  SequenceRequest resumed = first;
  for (int t = 0; t < 7; ++t) resumed.prompt.push_back(before[t].id);
  resumed.prior_generated = 7;
  resumed.max_new_tokens = 7;
  const SequenceId resumed_id = engine.add_sequence(resumed);
  const std::vector<StepToken> after = step_until_finished(engine, {resumed_id}, 12)[resumed_id];
  ASSERT_EQ(after.size(), 7u);
  expect_choices_follow_reference(resumed, after, "resumed after 7 tokens", changed);
  std::printf("[ %s ] greedy picks the penalties changed in the reference: %d\n", tiny_models()[GetParam()].name.c_str(),
              changed);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, EngineVsReference, ::testing::Range(0, static_cast<int>(tiny_models().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return tiny_models()[info.param].name; });

TEST(EngineRequests, BadRequestsAreRejectedAndTheEngineStillWorks) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(7);
  const ScratchDir scratch;
  const ModelConfig config = tiny_models()[0].config;
  MakeModelOptions make;
  make.seed = rng();
  write_random_checkpoint(config, scratch.path(), make);
  EngineOptions options = tiny_engine_options();
  // A pool of 4 pages of 16 tokens: enough for short prompts, not for 80 tokens.
  const size_t bytes_per_token = size_t{2} * config.num_hidden_layers * config.kv_size() * sizeof(uint16_t);
  options.kv_cache_bytes = 4 * 16 * bytes_per_token;
  Engine engine = Engine::from_checkpoint(scratch.path(), options);

  const int vocab = config.vocab_size;
  testing::expect_error([&] { engine.add_sequence(greedy_request({}, 4)); }, {});
  testing::expect_error([&] { engine.add_sequence(greedy_request({1, vocab, 3}, 4)); }, {std::to_string(vocab)});
  testing::expect_error([&] { engine.add_sequence(greedy_request({1, -1, 3}, 4)); }, {"-1"});
  // 129 tokens: longer than max_context (128) by itself; 120 + 9 only together.
  testing::expect_error([&] { engine.add_sequence(greedy_request(random_ids(rng, 129, vocab), 1)); }, {"129"});
  testing::expect_error([&] { engine.add_sequence(greedy_request(random_ids(rng, 120, vocab), 9)); }, {"120"});
  // Fits max_context but not the KV pool.
  testing::expect_error([&] { engine.add_sequence(greedy_request(random_ids(rng, 80, vocab), 4)); }, {});
  EXPECT_EQ(engine.running_sequences(), 0);

  const SequenceId fine = engine.add_sequence(greedy_request(random_ids(rng, 10, vocab), 2));
  // The step that prefills a sequence reports its first token and, from the decode that follows
  // in the same step, its second.
  const std::vector<StepToken> first = engine.step();
  ASSERT_GE(first.size(), 1u);
  ASSERT_LE(first.size(), 2u);
  for (const StepToken& token : first) {
    EXPECT_EQ(token.sequence, fine);
    EXPECT_TRUE(token.id >= 0 && token.id < vocab) << token.id;
  }
}

}  // namespace
}  // namespace deepfuse
