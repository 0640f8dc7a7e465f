// The GPU engine on small random-weight models (head_dim 64, two layers): generation runs every
// sequence to its finish reason with ids in range, the KV cache running out ends one sequence and
// not the others, the decode path agrees with the prefill path, ragged score_batch agrees with
// score, graphs agree with eager launches, and bad requests fail up front with one-line errors.
// Engine-vs-reference logits live in the end-to-end tests; this file tests the runtime's own logic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "runtime/engine_bench.hpp"
#include "runtime/gpu_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr double kTolerance = 1e-2;

// Small enough for a quick test, shaped like the real thing: GQA (2 query heads per KV head),
// head_dim 64, and an odd vocabulary for Llama (lm_head and sampling rows that are not a
// multiple of anything).
ModelConfig small_config(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = architecture == Architecture::llama ? 509 : 512;
  c.hidden_size = 128;
  c.intermediate_size = 320;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-5;
  c.rope.head_dim = 64;
  c.rope.theta = 10000.0;
  c.qkv_bias = architecture == Architecture::qwen2;
  c.sliding_window = architecture == Architecture::mistral ? 40 : 0;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Llama with attention_bias: q/k/v and o_proj biases (o_proj's rides in the GEMM epilogue).
ModelConfig small_config_with_attention_bias() {
  ModelConfig c = small_config(Architecture::llama);
  c.qkv_bias = true;
  c.o_proj_bias = true;
  return c;
}

// The bytes a decode step reads from weights (EngineStats::weight_bytes), from the config alone,
// bf16 throughout: per layer the two RMSNorm weights, q/k/v and their biases, o_proj and its bias,
// gate/up/down; the final norm; and the lm_head (the embedding for tied models). The embedding
// itself is a gather of one row per token and is not counted.
size_t expected_decode_weight_bytes(const ModelConfig& c) {
  const size_t hidden = c.hidden_size, inter = c.intermediate_size;
  const size_t q = static_cast<size_t>(c.num_attention_heads) * c.head_dim;
  const size_t kv = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  const size_t per_layer = 2 * hidden + (q + 2 * kv) * hidden + (c.qkv_bias ? q + 2 * kv : 0) + q * hidden +
                           (c.o_proj_bias ? hidden : 0) + 3 * hidden * inter;
  const size_t lm_head = static_cast<size_t>(c.vocab_size) * hidden;
  return 2 * (c.num_hidden_layers * per_layer + hidden + lm_head);
}

EngineOptions small_options(bool cuda_graphs, MlpVariant mlp = MlpVariant::fused) {
  EngineOptions o;
  o.max_batch = 4;        // buckets 1, 2, 4
  o.prefill_chunk = 8;    // prompts below cross several chunks
  o.cuda_graphs = cuda_graphs;
  if (mlp == MlpVariant::unfused) o.plan_overrides = parse_plan_overrides("mlp=unfused,front=unfused,o_proj=cublaslt");
  return o;
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int count, int vocab) {
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> ids(count);
  for (int32_t& v : ids) v = id(rng);
  return ids;
}

// Every token each sequence produced, in order, stepping until nothing is left.
std::map<SequenceId, std::vector<StepToken>> run_to_completion(Engine& engine, int max_steps = 400) {
  std::map<SequenceId, std::vector<StepToken>> produced;
  for (int step = 0; engine.running_sequences() > 0; ++step) {
    if (step == max_steps) {
      ADD_FAILURE() << "sequences still running after " << max_steps << " steps";
      break;
    }
    for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
  }
  return produced;
}

// A sequence's tokens: ids in range, exactly one finish reason, on the last token.
void expect_well_formed(const std::vector<StepToken>& tokens, int vocab, const std::string& what) {
  ASSERT_FALSE(tokens.empty()) << what;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = i + 1 == tokens.size();
    EXPECT_EQ(tokens[i].finish != FinishReason::none, last) << what << " token " << i;
    EXPECT_GE(tokens[i].id, 0) << what << " token " << i;
    EXPECT_LT(tokens[i].id, vocab) << what << " token " << i;
  }
}

template <typename F>
void expect_error(F&& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected a deepfuse::Error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "not one line: " << e.what();
  }
}

struct EngineCase {
  std::string name;
  ModelConfig config;
  bool cuda_graphs;
};

class EngineGeneration : public ::testing::TestWithParam<EngineCase> {};

// Five sequences with a decode batch of four: one waits in the queue; odd prompt lengths cross
// pages (16 tokens) and prefill chunks (8 tokens); greedy and sampled sequences side by side.
TEST_P(EngineGeneration, EverySequenceGetsItsTokensAndFinishReason) {
  DF_REQUIRE_GPU();
  const EngineCase& c = GetParam();
  auto rng = testing::make_rng(101);
  Engine engine = Engine::with_random_weights(c.config, small_options(c.cuda_graphs), rng());
  const int vocab = c.config.vocab_size;
  const std::vector<int> prompt_lengths = {1, 7, 17, 33, 16};
  const std::vector<int> new_tokens = {9, 1, 20, 5, 3};
  std::map<SequenceId, int> expected_tokens;
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    SequenceRequest request;
    request.prompt = random_ids(rng, prompt_lengths[i], vocab);
    request.max_new_tokens = new_tokens[i];
    if (i % 2 == 1) {
      request.sampling.temperature = 0.8f;
      request.sampling.top_k = 40;
      request.sampling.top_p = 0.9f;
      request.sampling.min_p = 0.02f;
      request.sampling.seed = rng();
    }
    expected_tokens[engine.add_sequence(request)] = new_tokens[i];
  }
  EXPECT_EQ(engine.running_sequences(), 5);
  const auto produced = run_to_completion(engine);
  ASSERT_EQ(produced.size(), expected_tokens.size());
  for (const auto& [id, count] : expected_tokens) {
    const std::string what = c.name + " sequence " + std::to_string(id);
    ASSERT_TRUE(produced.count(id)) << what;
    const std::vector<StepToken>& tokens = produced.at(id);
    expect_well_formed(tokens, vocab, what);
    EXPECT_EQ(static_cast<int>(tokens.size()), count) << what;
    EXPECT_EQ(tokens.back().finish, FinishReason::max_tokens) << what << ": " << finish_reason_name(tokens.back().finish);
  }
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv_pages_free, stats.kv_pages_total) << "pages leaked";
  EXPECT_EQ(stats.weight_bytes, expected_decode_weight_bytes(c.config));
  EXPECT_GE(stats.launches_per_layer, 4) << "a layer launches at least its qkv projection, attention, o_proj and MLP";
  EXPECT_GT(stats.launches_per_decode_step, c.config.num_hidden_layers * stats.launches_per_layer);
}

// Prefill-only, decode-only and mixed teacher forcing must give the same logits: the decode path
// (split-KV attention, graphs) against the prefill path (causal attention, chunked) over 67
// positions, past Mistral's 40-token window and over several pages.
TEST_P(EngineGeneration, DecodeLogitsMatchPrefillLogits) {
  DF_REQUIRE_GPU();
  const EngineCase& c = GetParam();
  auto rng = testing::make_rng(102);
  EngineOptions options = small_options(c.cuda_graphs);
  options.prefill_chunk = 100;  // one chunk of 67 rows: lm_head runs in groups of 64 + 3
  Engine engine = Engine::with_random_weights(c.config, options, rng());
  const std::vector<int32_t> ids = random_ids(rng, 67, c.config.vocab_size);
  const std::vector<float> prefill_only = engine.score(ids, static_cast<int>(ids.size()));
  ASSERT_EQ(prefill_only.size(), ids.size() * c.config.vocab_size);
  EXPECT_EQ(testing::count_nan(prefill_only), 0u);
  const std::vector<double> reference(prefill_only.begin(), prefill_only.end());
  for (int prefill_tokens : {1, 30}) {
    const std::vector<float> mixed = engine.score(ids, prefill_tokens);
    EXPECT_EQ(testing::count_nan(mixed), 0u) << c.name << " prefill_tokens=" << prefill_tokens;
    EXPECT_LT(testing::relative_error(mixed, reference), kTolerance) << c.name << " prefill_tokens=" << prefill_tokens;
  }
  EXPECT_EQ(engine.stats().kv_pages_free, engine.stats().kv_pages_total);
}

// A ragged batch (one sequence done after its prefill and padded from then on, the others with
// different prefill lengths) gives each sequence the logits it gets alone.
TEST_P(EngineGeneration, ScoreBatchMatchesScoreAlone) {
  DF_REQUIRE_GPU();
  const EngineCase& c = GetParam();
  auto rng = testing::make_rng(103);
  Engine engine = Engine::with_random_weights(c.config, small_options(c.cuda_graphs), rng());
  const std::vector<std::vector<int32_t>> sequences = {random_ids(rng, 5, c.config.vocab_size),
                                                       random_ids(rng, 20, c.config.vocab_size),
                                                       random_ids(rng, 33, c.config.vocab_size)};
  const std::vector<int> prefill_tokens = {5, 3, 17};
  const auto batched = engine.score_batch(sequences, prefill_tokens);
  ASSERT_EQ(batched.size(), sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::vector<float> alone = engine.score(sequences[i], prefill_tokens[i]);
    ASSERT_EQ(batched[i].size(), alone.size());
    EXPECT_EQ(testing::count_nan(batched[i]), 0u);
    EXPECT_LT(testing::relative_error(batched[i], std::vector<double>(alone.begin(), alone.end())), kTolerance)
        << c.name << " sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, EngineGeneration,
                         ::testing::Values(EngineCase{"llama_graphs", small_config(Architecture::llama), true},
                                           EngineCase{"llama_eager", small_config(Architecture::llama), false},
                                           EngineCase{"qwen2_graphs", small_config(Architecture::qwen2), true},
                                           EngineCase{"mistral_graphs", small_config(Architecture::mistral), true},
                                           EngineCase{"llama_attention_bias", small_config_with_attention_bias(),
                                                      true}),
                         [](const auto& info) { return info.param.name; });

// The same op list captured or launched eagerly gives the same logits (unfused MLP: no atomics).
TEST(Engine, GraphsAndEagerLaunchesAgree) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(104);
  const ModelConfig config = small_config(Architecture::qwen2);
  const uint64_t seed = rng();
  Engine graphs = Engine::with_random_weights(config, small_options(true, MlpVariant::unfused), seed);
  Engine eager = Engine::with_random_weights(config, small_options(false, MlpVariant::unfused), seed);
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int> prefill_tokens;
  // Batches of 1, 2 and 3 sequences: buckets 1, 2 and 4 are each captured, then replayed.
  for (auto [length, prefill] : {std::pair{21, 2}, std::pair{12, 9}, std::pair{30, 4}}) {
    sequences.push_back(random_ids(rng, length, config.vocab_size));
    prefill_tokens.push_back(prefill);
    const auto with_graphs = graphs.score_batch(sequences, prefill_tokens);
    const auto without = eager.score_batch(sequences, prefill_tokens);
    // Not bitwise: split-KV partial sums may meet in any order. A replay reading a stale buffer
    // would be off by O(1), not by rounding.
    for (size_t i = 0; i < sequences.size(); ++i)
      EXPECT_LT(testing::relative_error(with_graphs[i], std::vector<double>(without[i].begin(), without[i].end())),
                1e-3)
          << "batch of " << sequences.size() << ", sequence " << i;
  }
}

TEST(Engine, StopTokenEndsOnlyThatSequence) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(105);
  const ModelConfig config = small_config(Architecture::llama);
  Engine engine = Engine::with_random_weights(config, small_options(true), rng());
  SequenceRequest stops_at_once;
  stops_at_once.prompt = random_ids(rng, 5, config.vocab_size);
  stops_at_once.max_new_tokens = 10;
  for (int32_t id = 0; id < config.vocab_size; ++id) stops_at_once.stop_ids.push_back(id);  // any id stops it
  SequenceRequest runs_on = stops_at_once;
  runs_on.stop_ids.clear();
  const SequenceId stopping = engine.add_sequence(stops_at_once);
  const SequenceId running = engine.add_sequence(runs_on);
  const auto produced = run_to_completion(engine);
  ASSERT_EQ(produced.at(stopping).size(), 1u);
  EXPECT_EQ(produced.at(stopping)[0].finish, FinishReason::stop_token);
  expect_well_formed(produced.at(running), config.vocab_size, "running");
  EXPECT_EQ(produced.at(running).size(), 10u);
  EXPECT_EQ(produced.at(running).back().finish, FinishReason::max_tokens);
}

// A cache of exactly four pages and two sequences that each need four: when both need a third
// page, the step scheduler preempts the younger (its pages go back, it waits, then recomputes its
// prompt and tokens once the older one is done) and both run to their max_new_tokens.
TEST(Engine, KvCacheFullPreemptsTheYoungestWhichRecomputesAndFinishes) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(106);
  const ModelConfig config = small_config(Architecture::llama);
  EngineOptions options = small_options(true);
  const size_t page_bytes = size_t{2} * config.num_hidden_layers * config.num_key_value_heads * 16 * config.head_dim * 2;
  options.kv_cache_bytes = 4 * page_bytes;
  Engine engine = Engine::with_random_weights(config, options, rng());
  EXPECT_EQ(engine.stats().kv_pages_total, 4);
  EXPECT_EQ(engine.stats().kv_cache_bytes, 4 * page_bytes);

  SequenceRequest request;
  request.prompt = random_ids(rng, 16, config.vocab_size);  // one page each
  request.max_new_tokens = 40;                               // 55 positions: four pages each
  const SequenceId a = engine.add_sequence(request);
  const SequenceId b = engine.add_sequence(request);
  SequenceRequest too_big = request;
  too_big.max_new_tokens = 50;  // 65 positions: five pages, more than the cache holds
  expect_error([&] { engine.add_sequence(too_big); }, "KV pages");

  const auto produced = run_to_completion(engine);
  for (SequenceId id : {a, b}) {
    const std::vector<StepToken>& tokens = produced.at(id);
    expect_well_formed(tokens, config.vocab_size, "sequence " + std::to_string(id));
    EXPECT_EQ(tokens.back().finish, FinishReason::max_tokens);
    EXPECT_EQ(tokens.size(), 40u);
  }
  const SchedulingStats scheduling = engine.scheduling_stats();
  EXPECT_GE(scheduling.preemptions, 1u);
  EXPECT_EQ(scheduling.running + scheduling.waiting, 0);
  EXPECT_EQ(engine.stats().kv_pages_free, 4);
  // The two sequences are the same greedy request: the one that ran through and the one that
  // recomputed after its preemption agree until the recomputed logits (prefill, not decode
  // kernels) tie-break differently, which a random model's first tokens do not.
  for (size_t t = 0; t < 8; ++t) EXPECT_EQ(produced.at(a)[t].id, produced.at(b)[t].id) << "token " << t;
}

TEST(Engine, BenchmarkSequencesDecodeFromAPrefilledContext) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(107);
  const ModelConfig config = small_config(Architecture::mistral);
  Engine engine = Engine::with_random_weights(config, small_options(true), rng());
  const SequenceId long_one = runtime::EngineBench::add_prefilled(engine, 601, 4);
  const SequenceId short_one = runtime::EngineBench::add_prefilled(engine, 3, 7);
  EXPECT_EQ(engine.running_sequences(), 2);
  EXPECT_EQ(runtime::EngineBench::decode_replay_ms(engine, 2), 0.0) << "no captured step before the first step()";
  std::map<SequenceId, std::vector<StepToken>> produced;
  for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
  // Replays of the captured step time the GPU alone and leave the sequences' bookkeeping as it was
  // (checked below): each replay runs the step's kernels, at least half a microsecond per launch.
  // (No upper bound: under compute-sanitizer a replay can outlast a host-timed step.)
  const double replay_ms = runtime::EngineBench::decode_replay_ms(engine, 3);
  const int launches = engine.stats(2).launches_per_decode_step;
  for (const StepToken& token : engine.step()) produced[token.sequence].push_back(token);
  EXPECT_GE(replay_ms, 0.0005 * launches) << "replay " << replay_ms << " ms for " << launches << " launches";
  EXPECT_TRUE(std::isfinite(replay_ms));
  for (auto& [id, tokens] : run_to_completion(engine)) produced[id].insert(produced[id].end(), tokens.begin(), tokens.end());
  EXPECT_EQ(produced.at(long_one).size(), 4u);
  EXPECT_EQ(produced.at(short_one).size(), 7u);
  expect_well_formed(produced.at(long_one), config.vocab_size, "long");
  expect_well_formed(produced.at(short_one), config.vocab_size, "short");
  expect_error([&] { runtime::EngineBench::add_prefilled(engine, 1020, 4); }, "max_context");
}

// With steps launched ahead, removing every running sequence leaves a step in flight that feeds
// nobody; the next sequences still get one token per step() from their first call on.
TEST(Engine, AStepLaunchedForRemovedSequencesIsDropped) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(109);
  const ModelConfig config = small_config(Architecture::llama);
  Engine engine = Engine::with_random_weights(config, small_options(true), rng());
  ASSERT_TRUE(engine.options().overlap_steps);
  const std::vector<SequenceId> first = {runtime::EngineBench::add_prefilled(engine, 20, 30),
                                         runtime::EngineBench::add_prefilled(engine, 40, 30)};
  EXPECT_EQ(engine.step().size(), 2u);
  for (SequenceId id : first) engine.remove_sequence(id);
  const std::vector<SequenceId> second = {runtime::EngineBench::add_prefilled(engine, 7, 3),
                                          runtime::EngineBench::add_prefilled(engine, 9, 3),
                                          runtime::EngineBench::add_prefilled(engine, 11, 3)};
  for (int step = 0; step < 3; ++step) {
    const std::vector<StepToken> tokens = engine.step();
    ASSERT_EQ(tokens.size(), 3u) << "step " << step;
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(tokens[i].sequence, second[i]) << "step " << step;
      EXPECT_EQ(tokens[i].finish, step == 2 ? FinishReason::max_tokens : FinishReason::none) << "step " << step;
    }
  }
  EXPECT_EQ(engine.running_sequences(), 0);
  EXPECT_EQ(engine.stats().kv_pages_free, engine.stats().kv_pages_total);
}

TEST(Engine, RemovingSequencesFreesTheirPages) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(108);
  const ModelConfig config = small_config(Architecture::llama);
  Engine engine = Engine::with_random_weights(config, small_options(false), rng());
  const int total = engine.stats().kv_pages_total;
  SequenceRequest request;
  request.prompt = random_ids(rng, 40, config.vocab_size);  // three pages
  request.max_new_tokens = 30;
  const SequenceId first = engine.add_sequence(request);
  const SequenceId second = engine.add_sequence(request);
  const SequenceId queued = engine.add_sequence(request);
  engine.remove_sequence(queued);  // never ran
  EXPECT_EQ(engine.running_sequences(), 2);
  engine.step();
  EXPECT_EQ(engine.stats().kv_pages_free, total - 6);
  engine.remove_sequence(first);  // row 0: the second moves into its row and keeps decoding
  EXPECT_EQ(engine.stats().kv_pages_free, total - 3);
  EXPECT_EQ(engine.running_sequences(), 1);
  const auto produced = run_to_completion(engine);
  ASSERT_EQ(produced.size(), 1u);
  EXPECT_EQ(produced.at(second).size(), 28u);  // two came in the first step: from the prefill and the decode
  EXPECT_EQ(engine.stats().kv_pages_free, total);
  engine.remove_sequence(second);  // finished and gone: no-op
  expect_error([&] { engine.remove_sequence(12345); }, "unknown sequence");
}

TEST(Engine, RejectsBadRequestsWithOneLineErrors) {
  DF_REQUIRE_GPU();
  const ModelConfig config = small_config(Architecture::llama);
  Engine engine = Engine::with_random_weights(config, small_options(true), 7);
  SequenceRequest good;
  good.prompt = {3, 4, 5};
  good.max_new_tokens = 4;
  auto with = [&](auto change) {
    SequenceRequest r = good;
    change(r);
    return r;
  };
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.prompt.clear(); })); }, "empty");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.prompt[1] = -1; })); }, "id -1");
  expect_error([&] { engine.add_sequence(with([&](SequenceRequest& r) { r.prompt[2] = config.vocab_size; })); },
               "outside the vocabulary");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.max_new_tokens = 0; })); }, "max_new_tokens");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.max_new_tokens = 1022; })); }, "max_context");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.sampling.repetition_penalty = 1.1f; })); },
               "repetition_penalty");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.sampling.top_p = 0.0f; })); }, "top_p");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.presence_penalty = NAN; })); },
               "presence_penalty");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.frequency_penalty = INFINITY; })); },
               "frequency_penalty");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.top_logprobs = -2; })); }, "top_logprobs");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.prior_generated = 3; })); },
               "prior_generated");
  expect_error([&] { engine.add_sequence(with([](SequenceRequest& r) { r.prior_generated = -1; })); },
               "prior_generated");
  EXPECT_EQ(engine.running_sequences(), 0) << "a rejected request must not be queued";
  engine.add_sequence(good);
  engine.step();  // now running (queued sequences do not block scoring)
  expect_error([&] { engine.score(good.prompt, 3); }, "no running sequences");
  run_to_completion(engine);
  expect_error([&] { engine.score(good.prompt, 0); }, "prefill_tokens");
  EXPECT_EQ(engine.score(good.prompt, 2).size(), good.prompt.size() * config.vocab_size);
}

TEST(Engine, RejectsModelsAndOptionsItCannotRun) {
  DF_REQUIRE_GPU();
  EngineOptions options = small_options(true);
  expect_error([&] { Engine::with_random_weights(model_preset("tiny"), options, 1); }, "head_dim 16");
  ModelConfig config = small_config(Architecture::llama);
  options.max_context = 2048;
  expect_error([&] { Engine::with_random_weights(config, options, 1); }, "max_position_embeddings");
  options = small_options(true);
  options.kv_cache_bytes = 1000;
  expect_error([&] { Engine::with_random_weights(config, options, 1); }, "holds no page");
  options = small_options(true);
  options.max_batch = 0;
  expect_error([&] { Engine::with_random_weights(config, options, 1); }, "max_batch");
}

// Weights beyond the free memory are reported before anything is allocated, naming the bytes
// needed and free, rather than failing halfway through. 800 layers of llama3-70b: 1.4 TB.
TEST(Engine, ModelsLargerThanTheGpuAreReportedUpFront) {
  DF_REQUIRE_GPU();
  ModelConfig config = random_arch_config("llama3-70b");
  config.num_hidden_layers = 800;
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  expect_error([&] { Engine::with_random_weights(config, EngineOptions{}, 1); }, "free on device");
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after + (size_t{64} << 20), free_before) << "memory was allocated before the check";
}

}  // namespace
}  // namespace deepfuse
