// Tensor parallel engines against the one-GPU engine on the same weights: TP 2 and TP 4 logits
// within the bf16 tolerance (the sums over ranks round differently, nothing else differs), greedy
// tokens equal up to near ties, on tiny checkpoints (sharded files, odd vocabularies, fewer
// key/value heads than ranks, Qwen2 biases with tied embeddings, a prompt cut into prefill
// chunks) and on a Llama-3-8B-shaped random model; both all-reduces (NCCL, one-shot); penalties
// and logprobs (computed on rank 0). Skips where
// the machine has fewer GPUs than a case needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "runtime/engine_test_util.hpp"
#include "logits_check.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::compare_logits;
using testing::kMaxLogitsError;
using testing::kMinTop1Agreement;

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

#define REQUIRE_GPUS(n)                                                                   \
  if (gpu_count() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << gpu_count()

struct TinyCase {
  std::string name;
  ModelConfig config;
};

std::vector<TinyCase> tiny_cases() {
  using A = Architecture;
  std::vector<TinyCase> cases;
  // 2 key/value heads: replicated at TP 4; vocabulary 1001 splits unevenly.
  cases.push_back({"llama_kv2_vocab1001", testing::tiny_config(A::llama, 1001, 512, 1024, 2, 8, 2, 64, 10000.0, 1024)});
  // Qwen2: q/k/v biases split with their columns; tied embeddings (the lm_head slice comes from
  // the replicated table).
  ModelConfig qwen = testing::tiny_config(A::qwen2, 1003, 512, 768, 2, 8, 4, 64, 1000000.0, 1024);
  qwen.qkv_bias = true;
  qwen.tie_word_embeddings = true;
  cases.push_back({"qwen2_bias_tied", qwen});
  return cases;
}

// all_reduce overrides mean nothing to one GPU: dropped there, the others kept.
EngineOptions options_with(int tp, std::string overrides = "") {
  if (tp == 1) {
    std::string kept;
    for (size_t begin = 0; begin < overrides.size();) {
      const size_t end = std::min(overrides.find(',', begin), overrides.size());
      const std::string item = overrides.substr(begin, end - begin);
      if (item.rfind("all_reduce", 0) != 0) kept += (kept.empty() ? "" : ",") + item;
      begin = end + 1;
    }
    overrides = kept;
  }
  EngineOptions o;
  o.max_batch = 4;
  o.max_context = 1024;
  o.prefill_chunk = 128;  // the 300-token prompts below take three chunks
  o.kv_cache_bytes = size_t{64} << 20;
  o.tensor_parallel = tp;
  if (!overrides.empty()) o.plan_overrides = parse_plan_overrides(overrides);
  return o;
}

void expect_close(const std::vector<float>& ours, const std::vector<float>& one_gpu, size_t vocab,
                  const std::string& what) {
  ASSERT_EQ(ours.size(), one_gpu.size()) << what;
  const testing::LogitsComparison c = compare_logits(ours, one_gpu, vocab);
  EXPECT_LE(c.worst_error, kMaxLogitsError) << what << ": " << c.describe();
  EXPECT_GE(c.top1_agreement(), kMinTop1Agreement) << what << ": " << c.describe();
}

// Greedy tokens of several prompts decoded together.
std::vector<std::vector<int32_t>> greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int tokens) {
  std::vector<SequenceId> ids;
  for (const auto& prompt : prompts) {
    SequenceRequest r;
    r.prompt = prompt;
    r.max_new_tokens = tokens;
    ids.push_back(engine.add_sequence(r));
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  while (engine.running_sequences() > 0)
    for (const StepToken& t : engine.step())
      for (size_t i = 0; i < ids.size(); ++i)
        if (t.sequence == ids[i] && t.finish != FinishReason::kv_cache_full) out[i].push_back(t.id);
  return out;
}

class TensorParallelTiny : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  int tp() const { return std::get<0>(GetParam()); }
  const TinyCase& model() const { return cases_[std::get<1>(GetParam())]; }
  void write_model() {
    MakeModelOptions options;
    options.seed = 17 + std::get<1>(GetParam());
    options.shards = 2;  // a rank reads its slices across files
    write_random_checkpoint(model().config, scratch_.path(), options);
  }
  void expect_logits_match(const std::string& overrides);
  std::vector<TinyCase> cases_ = tiny_cases();
  testing::ScratchDir scratch_;
};

// Prefill in 3 chunks, then 20 decode steps, under `overrides`.
void TensorParallelTiny::expect_logits_match(const std::string& overrides) {
  write_model();
  auto rng = testing::make_rng(5 + tp());
  const int vocab = model().config.vocab_size;
  const std::vector<int32_t> ids = testing::random_ids(rng, 300, vocab);
  Engine one = Engine::from_checkpoint(scratch_.path(), options_with(1, overrides));
  const std::vector<float> expected = one.score(ids, 280);
  Engine split = Engine::from_checkpoint(scratch_.path(), options_with(tp(), overrides));
  EXPECT_EQ(split.plan().tensor_parallel, tp());
  expect_close(split.score(ids, 280), expected, vocab, model().name + " --tp " + std::to_string(tp()) + " " + overrides);
}

TEST_P(TensorParallelTiny, LogitsMatchOneGpuNccl) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=nccl");
}

TEST_P(TensorParallelTiny, LogitsMatchOneGpuOneShot) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=one_shot");
}

// The fused MLP sums over the ranks in its own finish (the block's other sum is the one-shot
// kernel's); with the unfused MLP every sum is the one-shot kernel's.
TEST_P(TensorParallelTiny, LogitsMatchOneGpuEpilogue) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=epilogue");
}

TEST_P(TensorParallelTiny, LogitsMatchOneGpuEpilogueUnfusedMlp) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=epilogue,mlp=unfused");
}

// The fused MLP also sums the attention block's partials at its start: no all-reduce kernel in the
// block; with the unfused MLP every sum is the one-shot kernel's.
TEST_P(TensorParallelTiny, LogitsMatchOneGpuInMlp) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=in_mlp");
}

TEST_P(TensorParallelTiny, LogitsMatchOneGpuInMlpUnfusedMlp) {
  REQUIRE_GPUS(tp());
  expect_logits_match("all_reduce=in_mlp,mlp=unfused");
}

// Counted from the captured graphs: the fused MLP's own sum leaves a layer one kernel fewer than
// the one-shot kernel after it, and its input's sum one more fewer.
TEST_P(TensorParallelTiny, MlpSumsLaunchNoAllReduceKernel) {
  REQUIRE_GPUS(tp());
  write_model();
  auto rng = testing::make_rng(13);
  const std::vector<int32_t> prompt = testing::random_ids(rng, 9, model().config.vocab_size);
  Engine lines = Engine::from_checkpoint(scratch_.path(), options_with(tp(), "all_reduce=one_shot_lines"));
  Engine epilogue = Engine::from_checkpoint(scratch_.path(), options_with(tp(), "all_reduce=epilogue"));
  Engine in_mlp = Engine::from_checkpoint(scratch_.path(), options_with(tp(), "all_reduce=in_mlp"));
  for (Engine* engine : {&lines, &epilogue, &in_mlp}) greedy(*engine, {prompt}, 3);
  const EngineStats a = lines.stats(1), b = epilogue.stats(1), c = in_mlp.stats(1);
  const int layers = model().config.num_hidden_layers;
  EXPECT_EQ(b.launches_per_layer, a.launches_per_layer - 1);
  EXPECT_EQ(c.launches_per_layer, a.launches_per_layer - 2);
  ASSERT_GT(a.kernels_per_decode_step, 0) << "no graph captured";
  EXPECT_EQ(b.kernels_per_decode_step, a.kernels_per_decode_step - layers);
  EXPECT_EQ(c.kernels_per_decode_step, a.kernels_per_decode_step - 2 * layers);
}

// The unfused variants (cuBLASLt MLP, front and o_proj) on the ranks' slices.
TEST_P(TensorParallelTiny, LogitsMatchOneGpuUnfused) {
  REQUIRE_GPUS(tp());
  expect_logits_match("mlp=unfused,front=unfused");
}

TEST_P(TensorParallelTiny, GreedyTokensMatchOneGpu) {
  REQUIRE_GPUS(tp());
  write_model();
  auto rng = testing::make_rng(9 + tp());
  const int vocab = model().config.vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int length : {5, 40, 170}) prompts.push_back(testing::random_ids(rng, length, vocab));
  Engine one = Engine::from_checkpoint(scratch_.path(), options_with(1));
  Engine split = Engine::from_checkpoint(scratch_.path(), options_with(tp()));
  const auto expected = greedy(one, prompts, 12);
  const auto ours = greedy(split, prompts, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(ours[i].size(), expected[i].size()) << "prompt " << i;
    for (size_t t = 0; t < ours[i].size(); ++t) {
      if (ours[i][t] == expected[i][t]) continue;
      // Only a near tie of the one-GPU engine's logits may go either way; then the texts differ.
      std::vector<int32_t> context = prompts[i];
      context.insert(context.end(), expected[i].begin(), expected[i].begin() + t);
      const std::vector<float> logits = one.score(context, static_cast<int>(context.size()));
      const std::span<const float> row(logits.data() + logits.size() - vocab, vocab);
      EXPECT_TRUE(testing::near_tie(row, ours[i][t], expected[i][t]))
          << "prompt " << i << " token " << t << ": --tp " << tp() << " " << ours[i][t] << ", one GPU " << expected[i][t];
      break;
    }
  }
}

// Penalties and logprobs run where the sampler runs (rank 0, on the gathered logits): a split
// engine's penalized greedy picks and their logprobs follow the one-GPU engine's, several
// sequences decoded together, one of them plain.
TEST_P(TensorParallelTiny, PenaltiesAndLogprobsMatchOneGpu) {
  REQUIRE_GPUS(tp());
  write_model();
  auto rng = testing::make_rng(11 + tp());
  const int vocab = model().config.vocab_size;
  struct Case {
    int prompt;
    float presence, frequency;
    int top_logprobs;
  };
  const std::vector<Case> cases = {{24, -2.0f, 0.4f, 3}, {7, 1.0f, 0.5f, 2}, {60, 0.0f, 0.0f, 4}, {13, 0.0f, 0.0f, -1}};
  std::vector<SequenceRequest> requests;
  for (const Case& c : cases) {
    SequenceRequest r;
    r.prompt = testing::random_ids(rng, c.prompt, vocab);
    r.max_new_tokens = 14;
    r.presence_penalty = c.presence;
    r.frequency_penalty = c.frequency;
    r.top_logprobs = c.top_logprobs;
    requests.push_back(r);
  }
  auto run = [&](Engine& engine) {
    std::vector<SequenceId> ids;
    for (const SequenceRequest& r : requests) ids.push_back(engine.add_sequence(r));
    std::vector<std::vector<StepToken>> out(requests.size());
    while (engine.running_sequences() > 0)
      for (const StepToken& t : engine.step())
        for (size_t i = 0; i < ids.size(); ++i)
          if (t.sequence == ids[i] && t.id >= 0) out[i].push_back(t);
    return out;
  };
  Engine one = Engine::from_checkpoint(scratch_.path(), options_with(1));
  Engine split = Engine::from_checkpoint(scratch_.path(), options_with(tp()));
  // Logprobs are logits less a log-sum-exp: twice the logits' error, on the logits' scale.
  const std::vector<float> scale_logits = one.score(requests[0].prompt, static_cast<int>(requests[0].prompt.size()));
  double squares = 0;
  for (float v : scale_logits) squares += static_cast<double>(v) * v;
  const double tolerance = 2 * kMaxLogitsError * std::sqrt(squares / scale_logits.size());
  const auto expected = run(one);
  const auto ours = run(split);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i) + ", --tp " + std::to_string(tp()));
    ASSERT_EQ(ours[i].size(), expected[i].size());
    for (size_t t = 0; t < ours[i].size(); ++t) {
      const StepToken &a = ours[i][t], &b = expected[i][t];
      ASSERT_EQ(a.top_logprobs.size(), static_cast<size_t>(std::max(cases[i].top_logprobs, 0)));
      if (cases[i].top_logprobs >= 0) EXPECT_NEAR(a.logprob, b.logprob, tolerance) << "token " << t;
      if (a.id == b.id) continue;
      // Only a near tie of the penalized distribution may go either way: the split engine's pick
      // is among the one-GPU engine's alternatives, as likely as its pick (the plain sequence
      // without logprobs: a near tie of the one-GPU logits).
      if (cases[i].top_logprobs < 1) {
        std::vector<int32_t> context = requests[i].prompt;
        for (size_t k = 0; k < t; ++k) context.push_back(expected[i][k].id);
        const std::vector<float> logits = one.score(context, static_cast<int>(context.size()));
        const std::span<const float> row(logits.data() + logits.size() - vocab, vocab);
        EXPECT_TRUE(testing::near_tie(row, a.id, b.id)) << "token " << t << ": " << a.id << " against " << b.id;
        break;
      }
      const auto it = std::find_if(b.top_logprobs.begin(), b.top_logprobs.end(),
                                   [&](const TokenLogprob& alternative) { return alternative.id == a.id; });
      ASSERT_NE(it, b.top_logprobs.end()) << "token " << t << ": " << a.id << " not among the one-GPU alternatives";
      EXPECT_NEAR(it->logprob, b.logprob, 2 * tolerance) << "token " << t;
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelTiny, ::testing::Combine(::testing::Values(2, 4), ::testing::Values(0, 1)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) + "_" +
                                  tiny_cases()[std::get<1>(info.param)].name;
                         });

// Real shapes (Llama-3-8B's layers, vocabulary 128256), two layers, random weights drawn whole and
// sliced: the same function at every TP.
TEST(TensorParallelRealShape, Llama3_8bLayersMatchOneGpu) {
  REQUIRE_GPUS(2);
  ModelConfig c = random_arch_config("llama3-8b");
  c.num_hidden_layers = 2;
  auto rng = testing::make_rng(77);
  const std::vector<int32_t> ids = testing::random_ids(rng, 64, c.vocab_size);
  EngineOptions o = options_with(1);
  o.max_context = 512;
  o.kv_cache_bytes = size_t{256} << 20;
  const std::vector<float> expected = Engine::with_random_weights(c, o, 3).score(ids, 48);
  for (int tp : {2, 4}) {
    if (gpu_count() < tp) break;
    o.tensor_parallel = tp;
    Engine split = Engine::with_random_weights(c, o, 3);
    expect_close(split.score(ids, 48), expected, c.vocab_size, "llama3-8b shape --tp " + std::to_string(tp));
  }
}

TEST(TensorParallelBadInput, MoreRanksThanGpusOrHeads) {
  REQUIRE_GPUS(1);
  ModelConfig c = testing::tiny_config(Architecture::llama, 1001, 512, 1024, 2, 8, 2, 64, 10000.0, 1024);
  EngineOptions o = options_with(gpu_count() + 1);
  if (o.tensor_parallel <= 8) {
    try {
      Engine::with_random_weights(c, o, 1);
      ADD_FAILURE() << "--tp beyond the visible GPUs was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("visible"), std::string::npos) << e.what();
    }
  }
  if (gpu_count() >= 3) {
    o.tensor_parallel = 3;  // 8 heads do not split three ways
    try {
      Engine::with_random_weights(c, o, 1);
      ADD_FAILURE() << "8 heads over 3 GPUs was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_attention_heads 8"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace deepfuse
