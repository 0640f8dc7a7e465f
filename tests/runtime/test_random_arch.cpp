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

// The row-major layout of every weight alone: the parameters of the checkpoint, once.
constexpr runtime::WeightLayouts kOneLayout{.mlp_fused = false, .mlp_unfused = true, .front_packed = false,
                                           .o_proj_packed = false};

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
  EXPECT_EQ(runtime::gpu_weight_bytes(c, kOneLayout), size_t{70553706496} * 2);  // Llama 3.1 70B's 70.55e9 parameters
}

TEST(RandomArch, WeightBytesCountEveryTensorOnce) {
  // Llama 3 8B has 8.03e9 parameters; the decode step reads all but the embedding table.
  const ModelConfig c = random_arch_config("llama3-8b");
  EXPECT_EQ(runtime::gpu_weight_bytes(c, kOneLayout), size_t{8030261248} * 2);
  EXPECT_EQ(runtime::decode_weight_bytes(c), runtime::gpu_weight_bytes(c, kOneLayout) - size_t{128256} * 4096 * 2);
  // Tied embeddings (Llama 3.2 1B, 1.236e9 parameters): the table is the lm_head, read every step.
  const ModelConfig tied = random_arch_config("llama3.2-1b");
  EXPECT_EQ(runtime::gpu_weight_bytes(tied, kOneLayout), size_t{1235814400} * 2);
  EXPECT_EQ(runtime::decode_weight_bytes(tied), runtime::gpu_weight_bytes(tied, kOneLayout));
}

// Each layout the plan runs adds its bytes: the packed qkv and o_proj of the fused front and the
// GEMV, and a second copy of the MLP where both MLP variants run.
TEST(RandomArch, WeightBytesFollowTheLayouts) {
  const ModelConfig c = random_arch_config("llama3.2-1b");
  const size_t one = runtime::gpu_weight_bytes(c, kOneLayout);
  runtime::WeightLayouts packed = kOneLayout;
  packed.front_packed = packed.o_proj_packed = true;
  EXPECT_EQ(runtime::gpu_weight_bytes(c, packed) - one,
            static_cast<size_t>(c.num_hidden_layers) * c.hidden_size * (c.q_size() + 2 * c.kv_size() + c.q_size()) * 2);
  runtime::WeightLayouts both = kOneLayout;
  both.mlp_fused = true;
  EXPECT_EQ(runtime::gpu_weight_bytes(c, both) - one,
            static_cast<size_t>(c.num_hidden_layers) * 3 * c.hidden_size * c.intermediate_size * 2);
}

// FP8 weights (--quantize fp8, bench decode --weights fp8): every block projection one byte an
// element plus an fp32 scale per output row; the embedding, norms and lm_head stay bf16 (the
// lm_head too only with --quantize-lm-head). The decode roofline reads these bytes; the unfused
// FP8 MLP holds its elements twice (row-major for the widened GEMMs, packed for the GEMVs) and a
// step reads one of them.
TEST(RandomArch, Fp8WeightBytesAreOneBytePerProjectionElementPlusRowScales) {
  const ModelConfig c = random_arch_config("llama3-8b");
  const size_t H = 4096, I = 14336, Q = 4096, KV = 1024, V = 128256, layers = 32;
  const size_t elements = H * (Q + 2 * KV) + H * Q + 3 * I * H;  // a block's projections
  const size_t scales = (Q + 2 * KV) + H + 2 * I + H;            // their output rows
  const size_t norms = 2 * H * 2;
  runtime::WeightLayouts fp8 = kOneLayout;
  fp8.load.quantize = WeightFormat::fp8_e4m3;
  const size_t once = layers * (elements + 4 * scales + norms) + V * H * 2 /* embedding */ +
                      V * H * 2 /* lm_head */ + H * 2 /* final norm */;
  const size_t expected = once + layers * 3 * I * H;  // the MLP's packed copy
  EXPECT_EQ(runtime::gpu_weight_bytes(c, fp8), expected);
  EXPECT_EQ(runtime::decode_weight_bytes(c, {}, fp8.load), once - V * H * 2);
  // About half of bf16's: 8.03e9 parameters, of which the embedding and lm_head stay 16-bit.
  const double ratio = static_cast<double>(runtime::decode_weight_bytes(c, {}, fp8.load)) /
                       static_cast<double>(runtime::decode_weight_bytes(c));
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.6);
  runtime::WeightLayouts head = fp8;
  head.load.quantize_lm_head = true;
  EXPECT_EQ(runtime::gpu_weight_bytes(c, head), expected - V * H * 2 + V * H + V * 4);
  // The packed copies of qkv and o_proj share the row-major copy's scales; each MLP copy has its own.
  runtime::WeightLayouts packed = fp8;
  packed.front_packed = packed.o_proj_packed = true;
  EXPECT_EQ(runtime::gpu_weight_bytes(c, packed) - expected, layers * (H * (Q + 2 * KV) + H * Q));
  // Loading stages one layer's MLP in the blocks' format: gate, up and down with their scales.
  const size_t reserve = size_t{1} << 30, staging = 3 * I * H + 4 * (2 * I + H);
  EXPECT_TRUE(runtime::fits_with_kv(c, fp8, expected + staging + reserve, reserve));
  EXPECT_FALSE(runtime::fits_with_kv(c, fp8, expected + staging + reserve - 1, reserve));
}

// Random weights in 128x128 blocks (bench decode --weights fp8-block128): one fp32 scale per block.
TEST(RandomArch, BlockFp8WeightBytesCountOneScalePerBlock) {
  const ModelConfig c = random_arch_config("llama3-8b");
  const size_t H = 4096, I = 14336, Q = 4096, KV = 1024, V = 128256, layers = 32, B = 128;
  const size_t elements = H * (Q + 2 * KV) + H * Q + 3 * I * H;
  const size_t blocks = (Q + 2 * KV) / B * (H / B) + H / B * (Q / B) + 3 * (I / B) * (H / B);
  const WeightLoadOptions load{.quantize = WeightFormat::fp8_e4m3_block128};
  EXPECT_EQ(runtime::decode_weight_bytes(c, {}, load), layers * (elements + 4 * blocks + 2 * H * 2) + V * H * 2 + H * 2);
}

// The MLP's second copy is kept only when it, the weights, their staging and the KV reserve fit.
TEST(RandomArch, SecondMlpCopyOnlyWhenItFits) {
  const ModelConfig c = random_arch_config("llama3-8b");
  runtime::WeightLayouts both = kOneLayout;
  both.mlp_fused = true;
  const size_t with_copy = runtime::gpu_weight_bytes(c, both);
  EXPECT_EQ(with_copy - runtime::gpu_weight_bytes(c, kOneLayout), size_t{32} * 3 * 4096 * 14336 * 2);
  const size_t staging = size_t{3} * 4096 * 14336 * 2, reserve = size_t{4} << 30;
  const size_t enough = with_copy + staging + reserve;
  EXPECT_TRUE(runtime::fits_with_kv(c, both, enough, reserve));
  EXPECT_FALSE(runtime::fits_with_kv(c, both, enough - 1, reserve));
  EXPECT_FALSE(runtime::fits_with_kv(c, both, size_t{24} << 30, reserve));  // a 24 GB GPU
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
