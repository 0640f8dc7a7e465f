// Mixed steps (EngineOptions::mixed_steps): a step's prompt chunks and the running sequences'
// decode rows go through one forward pass. Staggered requests (added while others decode, long
// prompts spread over several steps by a 16-token budget, more sequences than rows, one stopping
// on a stop id) run with mixing on and off, steps launched ahead and not, on the four tiny models.
// Every sequence's greedy tokens must equal the ones it gets running alone, and follow the CPU
// reference decoder's greedy decode of its prompt. Each engine's KV pools, activations, logits
// and inputs are NaN-poisoned first (EngineBench::poison_buffers), so a pass that reads a position
// or a row no step wrote changes tokens. bf16 GEMMs of other row counts may round differently, so
// two runs may part where the reference rates both picks a near tie, and only there.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "engine_test_util.hpp"
#include "logits_check.hpp"
#include "model/model_test_util.hpp"
#include "runtime/engine_bench.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::tiny_models;

// A request of the workload: added before step() call `arrival`.
struct Request {
  int arrival = 0;
  std::vector<int32_t> prompt;
  int new_tokens = 0;
  std::vector<int32_t> stop_ids;
};

struct Outcome {
  std::vector<std::vector<StepToken>> tokens;  // per request, in workload order
  SchedulingStats stats;
};

class MixedSteps : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    rng_ = testing::make_rng(700 + GetParam());
    const ModelConfig made = tiny_models()[GetParam()].config;
    MakeModelOptions options;
    options.seed = rng_();
    write_random_checkpoint(made, scratch_.path(), options);
    config_ = load_model_config(scratch_.path());
    reference_ = std::make_unique<reference::Decoder>(config_,
                                                      load_reference_weights(Checkpoint(scratch_.path()), config_));
  }

  static EngineOptions options(bool mixed, bool overlap) {
    EngineOptions o;
    o.max_batch = 4;
    o.max_context = 128;
    o.kv_cache_bytes = size_t{16} << 20;
    o.mixed_steps = mixed;
    o.overlap_steps = overlap;
    o.prefill_tokens_per_step = 16;
    o.prefix_caching = true;
    return o;
  }

  // Runs the requests through a fresh, poisoned engine, each added before its arrival step.
  Outcome run(const EngineOptions& options, const std::vector<Request>& requests) const {
    Engine engine = Engine::from_checkpoint(scratch_.path(), options);
    runtime::EngineBench::poison_buffers(engine);
    Outcome outcome;
    outcome.tokens.resize(requests.size());
    std::map<SequenceId, size_t> index;
    size_t added = 0;
    for (int step = 0; step < 2000; ++step) {
      for (; added < requests.size() && requests[added].arrival <= step; ++added) {
        SequenceRequest request;
        request.prompt = requests[added].prompt;
        request.max_new_tokens = requests[added].new_tokens;
        request.stop_ids = requests[added].stop_ids;
        index[engine.add_sequence(request)] = added;
      }
      if (added == requests.size() && engine.running_sequences() == 0) break;
      for (const StepToken& token : engine.step()) outcome.tokens[index.at(token.sequence)].push_back(token);
    }
    EXPECT_EQ(engine.running_sequences(), 0);
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
    outcome.stats = engine.scheduling_stats();
    return outcome;
  }

  static std::vector<int32_t> ids_of(const std::vector<StepToken>& tokens) {
    std::vector<int32_t> ids;
    for (const StepToken& token : tokens) ids.push_back(token.id);
    return ids;
  }

  bool same_or_near_tie(const std::vector<int32_t>& prompt, const std::vector<int32_t>& ours,
                        const std::vector<int32_t>& alone, const std::string& what) const {
    return testing::same_or_parted_at_near_tie(*reference_, prompt, ours, alone, what);
  }

  testing::ScratchDir scratch_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  std::unique_ptr<reference::Decoder> reference_;
};

TEST_P(MixedSteps, StaggeredRequestsGiveEachSequenceItsSoloTokens) {
  DF_REQUIRE_GPU();
  // Six requests through four rows: two wait; prompts of 40 and 70 tokens take 3 and 5 steps of the
  // 16-token budget while the others decode; request 4 repeats request 1's first 32 tokens (two
  // prefix-cached blocks) and stops on its own 4th greedy token (or where that id comes first).
  const int vocab = config_.vocab_size;
  std::vector<Request> requests = {
      {0, testing::random_ids(rng_, 9, vocab), 20},  {0, testing::random_ids(rng_, 40, vocab), 12},
      {2, testing::random_ids(rng_, 1, vocab), 16},  {3, testing::random_ids(rng_, 70, vocab), 10},
      {5, {}, 14},                                   {9, testing::random_ids(rng_, 23, vocab), 8},
  };
  requests[4].prompt.assign(requests[1].prompt.begin(), requests[1].prompt.begin() + 32);
  for (const int32_t id : testing::random_ids(rng_, 5, vocab)) requests[4].prompt.push_back(id);

  // Alone: each request by itself on an engine without mixing, budget or prefix cache.
  EngineOptions solo_options = options(false, true);
  solo_options.prefill_tokens_per_step = 0;
  solo_options.prefix_caching = false;
  std::vector<std::vector<int32_t>> alone;
  for (Request request : requests) {
    request.arrival = 0;
    alone.push_back(ids_of(run(solo_options, {request}).tokens[0]));
  }
  ASSERT_EQ(alone[4].size(), 14u);
  requests[4].stop_ids = {alone[4][3]};  // alone it then stops where the id first comes
  alone[4].resize(std::find(alone[4].begin(), alone[4].end(), alone[4][3]) - alone[4].begin() + 1);

  for (const bool mixed : {true, false}) {
    for (const bool overlap : {true, false}) {
      const std::string trace = std::string(mixed ? "mixed" : "separate") + (overlap ? ", overlapped" : "");
      SCOPED_TRACE(trace);
      const Outcome outcome = run(options(mixed, overlap), requests);
      if (mixed)
        EXPECT_GT(outcome.stats.mixed_steps, 0u) << "no step carried prompt tokens and decode rows together";
      else
        EXPECT_EQ(outcome.stats.mixed_steps, 0u);
      int equal = 0;
      for (size_t r = 0; r < requests.size(); ++r) {
        const std::string what = trace + ", request " + std::to_string(r);
        const std::vector<StepToken>& tokens = outcome.tokens[r];
        ASSERT_FALSE(tokens.empty()) << what;
        const std::vector<int32_t> ours = ids_of(tokens);
        const bool same = same_or_near_tie(requests[r].prompt, ours, alone[r], what);
        equal += same;
        testing::reference_greedy_matches(*reference_, requests[r].prompt, ours, vocab, what);
        if (!same) continue;  // after a near tie: other text, maybe another length
        for (size_t t = 0; t + 1 < tokens.size(); ++t) EXPECT_EQ(tokens[t].finish, FinishReason::none) << what;
        EXPECT_EQ(tokens.back().finish, r == 4 ? FinishReason::stop_token : FinishReason::max_tokens) << what;
        EXPECT_EQ(tokens[0].cached_tokens, r == 4 ? 32 : 0) << what;
      }
      std::printf("[ %s ] %s: %d of %zu requests equal to their solo tokens\n", tiny_models()[GetParam()].name.c_str(),
                  trace.c_str(), equal, requests.size());
    }
  }
}

// A prompt longer than one pass holds (prefill_chunk 16, no per-step budget) is spread over steps
// by the mixed-step cap while a sampled sequence decodes. The sampled one's draws must stay its
// own: draw t for its token t, whatever steps its row sat out or rode along in.
TEST_P(MixedSteps, LongPromptsAndSampledRowsKeepTheirDraws) {
  DF_REQUIRE_GPU();
  const int vocab = config_.vocab_size;
  EngineOptions options = MixedSteps::options(true, true);
  options.prefill_chunk = 16;
  options.prefill_tokens_per_step = 0;
  Engine engine = Engine::from_checkpoint(scratch_.path(), options);
  runtime::EngineBench::poison_buffers(engine);
  SequenceRequest sampled;
  sampled.prompt = testing::random_ids(rng_, 6, vocab);
  sampled.max_new_tokens = 24;
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = rng_();
  SequenceRequest long_prompt;
  long_prompt.prompt = testing::random_ids(rng_, 75, vocab);
  long_prompt.max_new_tokens = 10;
  std::map<SequenceId, std::vector<int32_t>> out;
  const SequenceId seeded = engine.add_sequence(sampled);
  SequenceId greedy = 0;
  for (int step = 0; engine.running_sequences() > 0 && step < 500; ++step) {
    if (step == 2) greedy = engine.add_sequence(long_prompt);  // while the sampled one decodes
    for (const StepToken& token : engine.step()) out[token.sequence].push_back(token.id);
  }
  EXPECT_GE(engine.scheduling_stats().mixed_steps, 5u) << "75 prompt tokens in passes of at most 16";
  ASSERT_EQ(out[seeded].size(), 24u);
  ASSERT_EQ(out[greedy].size(), 10u);
  testing::reference_greedy_matches(*reference_, long_prompt.prompt, out[greedy], vocab, "the 75-token prompt");

  // Along the engine's own tokens: token t must be the reference's inverse-CDF pick at draw t's
  // uniform, or the GPU's logits (within bf16 rounding of the reference's) moved a CDF boundary
  // across it: the uniform lies within kCdfTolerance of the token's interval.
  constexpr double kCdfTolerance = 0.05;
  reference::KvCache cache = reference_->new_cache();
  std::vector<float> logits = reference_->forward(sampled.prompt, cache);
  int exact = 0;
  for (size_t t = 0; t < out[seeded].size(); ++t) {
    const int32_t id = out[seeded][t];
    ASSERT_TRUE(id >= 0 && id < vocab) << "token " << t;
    const std::span<const float> row(logits.data() + logits.size() - vocab, vocab);
    const std::vector<double> p = reference::sampling_distribution(row, sampled.sampling, {});
    double below = 0;
    for (int32_t i = 0; i < id; ++i) below += p[i];
    const double u = reference::sampling_uniform(sampled.sampling.seed, t);
    EXPECT_TRUE(u >= below - kCdfTolerance && u < below + p[id] + kCdfTolerance)
        << "token " << t << " (id " << id << ", interval [" << below << ", " << below + p[id]
        << ")) is not draw " << t << "'s pick (uniform " << u << ")";
    exact += u >= below && u < below + p[id];
    logits = reference_->forward(std::span(&id, 1), cache);
  }
  std::printf("[ %s ] sampled tokens the reference's own picks: %d of %zu\n", tiny_models()[GetParam()].name.c_str(),
              exact, out[seeded].size());
}

INSTANTIATE_TEST_SUITE_P(TinyModels, MixedSteps, ::testing::Range(0, static_cast<int>(tiny_models().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return tiny_models()[info.param].name; });

}  // namespace
}  // namespace deepfuse
