// EngineOptions::persistent_decode: batch-1 decode steps whose transformer blocks run as one
// persistent kernel (kernels/persistent/persistent_decode.cuh), against the CPU reference decoder
// on tiny random checkpoints of each architecture feature the kernel must get right (GQA, head_dim
// 64 and 128, Llama 3 RoPE scaling, Qwen2 biases with tied embeddings, Mistral's sliding window),
// sized to the kernel's rules (H, I and q_size multiples of 256):
//   - teacher-forced prompt + decode steps: logits per position;
//   - a context long enough that the attention splits it and merges the splits (the tiny models'
//     two KV heads take up to half the SMs' splits each);
//   - greedy generation through step() with graphs, and without;
//   - the step is 4 launches (kernel, final norm, lm_head, sampler), captured as 4 graph nodes;
//   - a shape outside the rules is refused at construction with the reason.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"
#include "logits_check.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"
#include "engine_test_util.hpp"

namespace deepfuse {
namespace {

using testing::random_ids;
using testing::ScratchDir;
using testing::tiny_config;
using testing::TinyModel;

using testing::kMaxLogitsError;
using testing::kMinTop1Agreement;

std::vector<TinyModel> tiny_models() {
  using A = Architecture;
  std::vector<TinyModel> models;
  // GQA 4:2, head_dim 64.
  models.push_back({"llama_gqa", tiny_config(A::llama, 512, 256, 512, 2, 4, 2, 64, 10000.0, 1024)});
  // head_dim 128, q_size 512 != hidden 256, Llama 3 RoPE scaling; eight query heads per KV head.
  ModelConfig llama3 = tiny_config(A::llama, 1000, 256, 768, 3, 8, 1, 128, 500000.0, 1024);
  testing::use_llama3_rope_scaling(llama3);
  models.push_back({"llama3_rope_headdim128_group8", llama3});
  // q/k/v biases, tied embeddings, GQA 4:1.
  ModelConfig qwen2 = tiny_config(A::qwen2, 997, 256, 512, 2, 4, 1, 64, 1000000.0, 1024);
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  models.push_back({"qwen2_bias_tied", qwen2});
  // A 24-token sliding window, shorter than the prompts below.
  ModelConfig mistral = tiny_config(A::mistral, 771, 512, 256, 3, 4, 2, 64, 10000.0, 1024);
  mistral.sliding_window = 24;
  models.push_back({"mistral_window24", mistral});
  return models;
}

EngineOptions persistent_options() {
  EngineOptions options;
  options.max_batch = 2;
  options.max_context = 1024;
  options.kv_cache_bytes = size_t{32} << 20;
  options.persistent_decode = true;
  return options;
}

class PersistentDecode : public ::testing::TestWithParam<int> {
 protected:
  void make_model(uint64_t salt) {
    rng_ = testing::make_rng(salt * 16 + GetParam());
    MakeModelOptions options;
    options.seed = rng_();
    write_random_checkpoint(tiny_models()[GetParam()].config, scratch_.path(), options);
    config_ = load_model_config(scratch_.path());
    reference_ = std::make_unique<reference::Decoder>(config_,
                                                      load_reference_weights(Checkpoint(scratch_.path()), config_));
    vocab_ = static_cast<size_t>(config_.vocab_size);
  }

  void expect_matches_reference(const std::vector<float>& logits, std::span<const int32_t> ids,
                                const std::string& what) const {
    ASSERT_EQ(logits.size(), ids.size() * vocab_) << what;
    EXPECT_EQ(testing::count_nan(logits), 0u) << what;
    reference::KvCache cache = reference_->new_cache();
    const testing::LogitsComparison c = testing::compare_logits(logits, reference_->forward(ids, cache), vocab_);
    std::printf("[ %s ] %s: %s\n", tiny_models()[GetParam()].name.c_str(), what.c_str(), c.describe().c_str());
    EXPECT_LT(c.worst_error, kMaxLogitsError) << what << ": " << c.describe();
    EXPECT_GT(c.top1_agreement(), kMinTop1Agreement) << what << ": " << c.describe();
  }

  // Greedy tokens after `prompt` through step(); each must be the reference's greedy pick, up to
  // a first divergence at a near tie of the reference. Returns how many were compared.
  int expect_greedy_follows_reference(Engine& engine, const std::vector<int32_t>& prompt, int new_tokens) {
    SequenceRequest request;
    request.prompt = prompt;
    request.max_new_tokens = new_tokens;
    const SequenceId id = engine.add_sequence(request);
    std::vector<int32_t> ours;
    for (int step = 0; step < new_tokens + 2 && engine.running_sequences() > 0; ++step)
      for (const StepToken& token : engine.step())
        if (token.sequence == id) ours.push_back(token.id);
    EXPECT_EQ(ours.size(), static_cast<size_t>(new_tokens));
    return testing::reference_greedy_matches(*reference_, prompt, ours, config_.vocab_size, "greedy");
  }

  ScratchDir scratch_;
  std::mt19937_64 rng_;
  ModelConfig config_;
  std::unique_ptr<reference::Decoder> reference_;
  size_t vocab_ = 0;
};

TEST_P(PersistentDecode, TeacherForcedDecodeMatchesReference) {
  DF_REQUIRE_GPU();
  make_model(1);
  Engine engine = Engine::from_checkpoint(scratch_.path(), persistent_options());
  const int prompt = 40, decode_steps = 32;
  const std::vector<int32_t> ids = random_ids(rng_, prompt + decode_steps, config_.vocab_size);
  expect_matches_reference(engine.score(ids, prompt), ids, "prompt 40 + 32 decode steps");
}

TEST_P(PersistentDecode, LongContextSplitsMatchReference) {
  DF_REQUIRE_GPU();
  make_model(2);
  Engine engine = Engine::from_checkpoint(scratch_.path(), persistent_options());
  // 700 + 12 keys: three or four splits of at least 256 keys per KV head, merged in the kernel.
  const std::vector<int32_t> ids = random_ids(rng_, 712, config_.vocab_size);
  expect_matches_reference(engine.score(ids, 700), ids, "prompt 700 + 12 decode steps");
}

TEST_P(PersistentDecode, GreedyGenerationFollowsReference) {
  DF_REQUIRE_GPU();
  make_model(3);
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "CUDA graphs" : "eager");
    EngineOptions options = persistent_options();
    options.cuda_graphs = graphs;
    Engine engine = Engine::from_checkpoint(scratch_.path(), options);
    const int compared = expect_greedy_follows_reference(engine, random_ids(rng_, 21, config_.vocab_size), 24);
    std::printf("[ %s ] %s: greedy tokens equal to the reference: %d of 24\n", tiny_models()[GetParam()].name.c_str(),
                graphs ? "graphs" : "eager", compared);
    const EngineStats stats = engine.stats(1);
    EXPECT_EQ(stats.launches_per_decode_step, 4);
    if (graphs) EXPECT_EQ(stats.kernels_per_decode_step, 4);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PersistentDecode, ::testing::Range(0, static_cast<int>(tiny_models().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return tiny_models()[info.param].name; });

TEST(PersistentDecodeRules, ShapeOutsideTheRulesIsRefusedWithTheReason) {
  DF_REQUIRE_GPU();
  ScratchDir scratch;
  // H = 192: not a multiple of 256.
  write_random_checkpoint(tiny_config(Architecture::llama, 300, 192, 256, 1, 3, 1, 64, 10000.0, 1024), scratch.path(),
                          {});
  testing::expect_error([&] { Engine::from_checkpoint(scratch.path(), persistent_options()); },
                        {"persistent_decode", "multiples of 256"});
}

}  // namespace
}  // namespace deepfuse
