// The architectures --random-weights offers: make-model's presets plus llama3-70b at its real shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "runtime/gpu_weights.hpp"

namespace deepfuse {
namespace {

TEST(RandomArch, NamesAreThePresetsPlusLlama70b) {
  const std::vector<std::string> names = random_arch_names();
  for (const char* expected : {"llama3-8b", "llama3.2-1b", "qwen2.5-7b", "mistral-7b", "llama3-70b"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const std::string& name : names) EXPECT_NO_THROW(random_arch_config(name)) << name;
  EXPECT_EQ(random_arch_config("qwen2.5-7b").hidden_size, model_preset("qwen2.5-7b").hidden_size);
}

TEST(RandomArch, Llama70bHasItsRealShape) {
  const ModelConfig c = random_arch_config("llama3-70b");
  EXPECT_EQ(c.architecture, Architecture::llama);
  EXPECT_EQ(c.num_hidden_layers, 80);
  EXPECT_EQ(c.hidden_size, 8192);
  EXPECT_EQ(c.intermediate_size, 28672);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_TRUE(c.rope.llama3_scaling);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(runtime::gpu_weight_bytes(c, MlpVariant::unfused), size_t{70553706496} * 2);  // Llama 3.1 70B's 70.55e9 parameters
}

TEST(RandomArch, WeightBytesCountEveryTensorOnce) {
  // Llama 3 8B has 8.03e9 parameters; the decode step reads all but the embedding table.
  const ModelConfig c = random_arch_config("llama3-8b");
  EXPECT_EQ(runtime::gpu_weight_bytes(c, MlpVariant::unfused), size_t{8030261248} * 2);
  EXPECT_EQ(runtime::decode_weight_bytes(c), runtime::gpu_weight_bytes(c, MlpVariant::unfused) - size_t{128256} * 4096 * 2);
  // Tied embeddings (Llama 3.2 1B, 1.236e9 parameters): the table is the lm_head, read every step.
  const ModelConfig tied = random_arch_config("llama3.2-1b");
  EXPECT_EQ(runtime::gpu_weight_bytes(tied, MlpVariant::unfused), size_t{1235814400} * 2);
  EXPECT_EQ(runtime::decode_weight_bytes(tied), runtime::gpu_weight_bytes(tied, MlpVariant::unfused));
}

// Which decode steps run o_proj on the cluster GEMV (then the MLP before it may defer its sum):
// up to 8 sequences on large o_proj matrices, batch 1 on small ones, none without the fused MLP. DEEPFUSE_OPROJ_GEMV (an A/B switch) must not be set when this runs.
TEST(RandomArch, GemvOprojBatchLimits) {
  if (std::getenv("DEEPFUSE_OPROJ_GEMV")) GTEST_SKIP() << "DEEPFUSE_OPROJ_GEMV overrides the rule";
  EXPECT_EQ(runtime::gemv_o_proj_max_tokens(random_arch_config("llama3-8b"), MlpVariant::fused), 8);
  EXPECT_EQ(runtime::gemv_o_proj_max_tokens(random_arch_config("qwen2.5-7b"), MlpVariant::fused), 8);
  EXPECT_EQ(runtime::gemv_o_proj_max_tokens(random_arch_config("llama3.2-1b"), MlpVariant::fused), 8);
  EXPECT_EQ(runtime::gemv_o_proj_max_tokens(random_arch_config("llama3-8b"), MlpVariant::unfused), 0);
  // The packed copy is counted in the weights only when the GEMV can run.
  const ModelConfig small = random_arch_config("llama3.2-1b");
  EXPECT_EQ(runtime::gpu_weight_bytes(small, MlpVariant::fused) - runtime::gpu_weight_bytes(small, MlpVariant::unfused),
            static_cast<size_t>(small.num_hidden_layers) * small.hidden_size *
                (small.q_size() + 2 * small.kv_size() + small.q_size()) * 2);
}

// The MLP's unfused copy is kept only when it, the weights, their staging and the KV reserve fit.
TEST(RandomArch, UnfusedMlpCopyOnlyWhenItFits) {
  const ModelConfig c = random_arch_config("llama3-8b");
  const runtime::MlpPlan plan{MlpVariant::fused, 1024, 8};
  ASSERT_TRUE(plan.unfused_copy());
  const size_t with_copy = runtime::gpu_weight_bytes(c, MlpVariant::fused, true);
  const size_t copy = with_copy - runtime::gpu_weight_bytes(c, MlpVariant::fused);
  EXPECT_EQ(copy, size_t{32} * 3 * 4096 * 14336 * 2);
  const size_t staging = size_t{3} * 4096 * 14336 * 2, reserve = size_t{4} << 30;
  const size_t enough = with_copy + staging + reserve;
  EXPECT_EQ(runtime::fit_mlp_plan(c, plan, enough, reserve).fused_max_tokens, 8);
  EXPECT_EQ(runtime::fit_mlp_plan(c, plan, enough - 1, reserve).fused_max_tokens, 0);
  EXPECT_EQ(runtime::fit_mlp_plan(c, plan, size_t{24} << 30, reserve).fused_max_tokens, 0);  // a 24 GB GPU
  // Nothing to drop: limit 0, or prefill chunks and batches that never exceed the limit.
  EXPECT_EQ(runtime::fit_mlp_plan(c, {MlpVariant::fused, 1024, 0}, 0, 0).fused_max_tokens, 0);
  EXPECT_EQ(runtime::fit_mlp_plan(c, {MlpVariant::fused, 8, 8}, 0, 0).fused_max_tokens, 8);
}

TEST(RandomArch, UnknownNamesListTheKnownOnes) {
  try {
    random_arch_config("gpt-5");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama3-70b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepfuse
