// Host-side argument checks of the small kernels' launchers (embedding, RMSNorm, RoPE + KV append,
// sampling): bad sizes, null or misaligned pointers and aliasing outputs return
// cudaErrorInvalidValue before anything reaches the GPU, so these run on any machine. Also the
// bf16-rounding option of reference::add_rms_norm the RMSNorm tests rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/kernels/embedding.hpp"
#include "deepfuse/kernels/swiglu_elementwise.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"
#include "deepfuse/kernels/sampling.hpp"

namespace deepfuse {
namespace {

// Fake device addresses: the launchers must reject the call before dereferencing anything.
template <typename T>
T* fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

kernels::EmbeddingParams valid_embedding() {
  kernels::EmbeddingParams p;
  p.table = fake<const __nv_bfloat16>(0x100000);
  p.ids = fake<const int32_t>(0x200000);
  p.out = fake<__nv_bfloat16>(0x300000);
  p.vocab = 100, p.hidden = 64, p.tokens = 3;
  return p;
}

TEST(SmallKernelChecks, EmbeddingRejectsBadArguments) {
  auto expect_invalid = [](kernels::EmbeddingParams p, const char* what) {
    EXPECT_EQ(kernels::launch_embedding(p, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid_embedding();
  p.table = nullptr, expect_invalid(p, "null table");
  p = valid_embedding(), p.ids = nullptr, expect_invalid(p, "null ids");
  p = valid_embedding(), p.out = nullptr, expect_invalid(p, "null out");
  p = valid_embedding(), p.hidden = 12, expect_invalid(p, "hidden not a multiple of 8");
  p = valid_embedding(), p.hidden = 0, expect_invalid(p, "hidden 0");
  p = valid_embedding(), p.tokens = 0, expect_invalid(p, "no tokens");
  p = valid_embedding(), p.vocab = 0, expect_invalid(p, "empty vocabulary");
  p = valid_embedding(), p.table = fake<const __nv_bfloat16>(0x100008), expect_invalid(p, "misaligned table");
  p = valid_embedding(), p.out = fake<__nv_bfloat16>(0x300002), expect_invalid(p, "misaligned out");
}

kernels::RmsNormParams valid_norm() {
  kernels::RmsNormParams p;
  p.residual = fake<__nv_bfloat16>(0x100000);
  p.x = fake<const __nv_bfloat16>(0x200000);
  p.weight = fake<const __nv_bfloat16>(0x300000);
  p.out = fake<__nv_bfloat16>(0x400000);
  p.rows = 4, p.hidden = 4096, p.eps = 1e-5f;
  return p;
}

TEST(SmallKernelChecks, RmsNormRejectsBadArguments) {
  auto expect_invalid = [](kernels::RmsNormParams p, const char* what) {
    EXPECT_EQ(kernels::launch_rms_norm(p, nullptr), cudaErrorInvalidValue) << what;
    EXPECT_EQ(kernels::launch_add_rms_norm(p, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid_norm();
  p.residual = nullptr, expect_invalid(p, "null residual");
  p = valid_norm(), p.weight = nullptr, expect_invalid(p, "null weight");
  p = valid_norm(), p.out = nullptr, expect_invalid(p, "null out");
  p = valid_norm(), p.rows = 0, expect_invalid(p, "no rows");
  p = valid_norm(), p.hidden = 100, expect_invalid(p, "hidden not a multiple of 8");
  p = valid_norm(), p.hidden = 40960, expect_invalid(p, "hidden beyond 32768");
  p = valid_norm(), p.eps = -1.0f, expect_invalid(p, "negative eps");
  p = valid_norm(), p.eps = std::numeric_limits<float>::quiet_NaN(), expect_invalid(p, "NaN eps");
  p = valid_norm(), p.out = p.residual, expect_invalid(p, "out aliases residual");
  p = valid_norm(), p.out = fake<__nv_bfloat16>(0x100000 + 4 * 4096 * 2 - 16), expect_invalid(p, "out overlaps residual");
  p = valid_norm(), p.weight = fake<const __nv_bfloat16>(0x300004), expect_invalid(p, "misaligned weight");
  // add_rms_norm alone also reads x: an out overlapping x is rejected there.
  p = valid_norm(), p.out = fake<__nv_bfloat16>(0x200000);
  EXPECT_EQ(kernels::launch_add_rms_norm(p, nullptr), cudaErrorInvalidValue) << "out aliases x";
  p = valid_norm(), p.x = fake<const __nv_bfloat16>(0x200002);
  EXPECT_EQ(kernels::launch_add_rms_norm(p, nullptr), cudaErrorInvalidValue) << "misaligned x";
}

kernels::RopeKvAppendParams valid_rope() {
  kernels::RopeKvAppendParams p;
  p.qkv = fake<const __nv_bfloat16>(0x1000000);
  p.inv_freq = fake<const float>(0x2000000);
  p.positions = fake<const int32_t>(0x3000000);
  p.sequences = fake<const int32_t>(0x4000000);
  p.q_out = fake<__nv_bfloat16>(0x5000000);
  p.kv.k_pages = fake<__nv_bfloat16>(0x6000000);
  p.kv.v_pages = fake<__nv_bfloat16>(0x7000000);
  p.kv.block_table = fake<const int32_t>(0x8000000);
  p.kv.max_pages_per_seq = 4, p.kv.kv_heads = 2, p.kv.head_dim = 128;
  p.tokens = 3, p.q_heads = 8;
  return p;
}

TEST(SmallKernelChecks, RopeKvAppendRejectsBadArguments) {
  auto expect_invalid = [](kernels::RopeKvAppendParams p, const char* what) {
    EXPECT_EQ(kernels::launch_rope_kv_append(p, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid_rope();
  p.qkv = nullptr, expect_invalid(p, "null qkv");
  p = valid_rope(), p.inv_freq = nullptr, expect_invalid(p, "null inv_freq");
  p = valid_rope(), p.positions = nullptr, expect_invalid(p, "null positions");
  p = valid_rope(), p.sequences = nullptr, expect_invalid(p, "null sequences");
  p = valid_rope(), p.q_out = nullptr, expect_invalid(p, "null q_out");
  p = valid_rope(), p.kv.k_pages = nullptr, expect_invalid(p, "null k_pages");
  p = valid_rope(), p.kv.v_pages = nullptr, expect_invalid(p, "null v_pages");
  p = valid_rope(), p.kv.block_table = nullptr, expect_invalid(p, "null block table");
  p = valid_rope(), p.tokens = 0, expect_invalid(p, "no tokens");
  p = valid_rope(), p.q_heads = 0, expect_invalid(p, "no q heads");
  p = valid_rope(), p.kv.kv_heads = 3, expect_invalid(p, "q_heads not a multiple of kv_heads");
  p = valid_rope(), p.kv.head_dim = 12, expect_invalid(p, "head_dim not a multiple of 8");
  p = valid_rope(), p.kv.head_dim = 0, expect_invalid(p, "head_dim 0");
  p = valid_rope(), p.kv.max_pages_per_seq = 0, expect_invalid(p, "empty block table rows");
  p = valid_rope(), p.q_out = fake<__nv_bfloat16>(0x1000000 + 256), expect_invalid(p, "q_out overlaps qkv");
  p = valid_rope(), p.qkv_bias = fake<const __nv_bfloat16>(0x9000008), expect_invalid(p, "misaligned bias");
  p = valid_rope(), p.kv.k_pages = fake<__nv_bfloat16>(0x6000004), expect_invalid(p, "misaligned k_pages");
  const kernels::FoldedRmsNorm norm{fake<const __nv_bfloat16>(0xa000000), 4096, 1e-5f};
  p = valid_rope(), p.input_norm = norm, p.input_norm.hidden = 12, expect_invalid(p, "norm hidden not a multiple of 8");
  p = valid_rope(), p.input_norm = norm, p.input_norm.hidden = 0, expect_invalid(p, "norm hidden 0");
  p = valid_rope(), p.input_norm = norm, p.input_norm.eps = -1.0f, expect_invalid(p, "negative norm eps");
  p = valid_rope(), p.input_norm = norm, p.input_norm.input = fake<const __nv_bfloat16>(0xa000004),
  expect_invalid(p, "misaligned norm input");
  p = valid_rope(), p.input_norm = norm, p.tokens = 65536, p.q_out = fake<__nv_bfloat16>(0x40000000);
  expect_invalid(p, "more tokens than grid rows");
}

TEST(SmallKernelChecks, FoldedNormConsumersRejectBadArguments) {
  auto* gate_up = fake<const __nv_bfloat16>(0x1000000);
  auto* act = fake<__nv_bfloat16>(0x2000000);
  const kernels::FoldedRmsNorm norm{fake<const __nv_bfloat16>(0x3000000), 4096, 1e-5f};
  auto bad = norm;
  bad.hidden = 100;
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 4, 14336, nullptr, bad), cudaErrorInvalidValue) << "norm hidden";
  bad = norm, bad.input = fake<const __nv_bfloat16>(0x3000002);
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 4, 14336, nullptr, bad), cudaErrorInvalidValue) << "misaligned";
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 65536, 64, nullptr, norm), cudaErrorInvalidValue) << "tokens";

  auto* matrix = fake<__nv_bfloat16>(0x4000000);
  auto* weight = fake<const __nv_bfloat16>(0x5000000);
  EXPECT_EQ(kernels::launch_fold_norm_weight(nullptr, 4, 64, weight, nullptr), cudaErrorInvalidValue) << "null matrix";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 64, nullptr, nullptr), cudaErrorInvalidValue) << "null weight";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 0, 64, weight, nullptr), cudaErrorInvalidValue) << "no rows";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 60, weight, nullptr), cudaErrorInvalidValue) << "cols % 8";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 64, fake<const __nv_bfloat16>(0x5000002), nullptr),
            cudaErrorInvalidValue)
      << "misaligned weight";
}

kernels::SamplingParams valid_sampling() {
  kernels::SamplingParams p;
  p.logits = fake<const float>(0x100000);
  p.slots = fake<kernels::SamplingSlot>(0x200000);
  p.ids = fake<int32_t>(0x300000);
  p.batch = 4, p.vocab = 152064;
  return p;
}

TEST(SmallKernelChecks, SamplingRejectsBadArguments) {
  auto expect_invalid = [](kernels::SamplingParams p, const char* what) {
    EXPECT_EQ(kernels::launch_sampling(p, nullptr), cudaErrorInvalidValue) << what;
    EXPECT_EQ(kernels::launch_sampling_with_cluster_size(p, 1, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid_sampling();
  p.logits = nullptr, expect_invalid(p, "null logits");
  p = valid_sampling(), p.slots = nullptr, expect_invalid(p, "null slots");
  p = valid_sampling(), p.ids = nullptr, expect_invalid(p, "null ids");
  p = valid_sampling(), p.batch = 0, expect_invalid(p, "batch 0");
  p = valid_sampling(), p.vocab = 0, expect_invalid(p, "empty vocabulary");
  p = valid_sampling(), p.vocab = (1 << 30) + 1, expect_invalid(p, "vocabulary beyond 2^30");
  for (int unsupported : {0, 2, 32})  // 1, 4, 8 and 16 are the sizes there are kernels for
    EXPECT_EQ(kernels::launch_sampling_with_cluster_size(valid_sampling(), unsupported, nullptr), cudaErrorInvalidValue)
        << "cluster size " << unsupported;
  EXPECT_EQ(kernels::sampling_workspace_bytes(8, 152064), 0u);
}

TEST(SmallKernelChecks, ReferenceAddRmsNormCanRoundTheResidualToBf16) {
  const int hidden = 3;
  std::vector<float> residual = {1.0f, -2.0f, 0.5f};
  const std::vector<float> x = {0.00390625f * 1.5f, 1e-3f, 3.0f};  // 1 + 1.5 * 2^-8 rounds to 1 + 2^-7 in bf16
  const std::vector<float> weight = {1.0f, 1.0f, 1.0f};
  std::vector<float> rounded = residual, out(hidden), expected(hidden);
  reference::add_rms_norm(rounded.data(), x.data(), weight.data(), 1, hidden, 1e-6f, out.data(), true);
  for (int i = 0; i < hidden; ++i) EXPECT_EQ(rounded[i], round_to_bf16(residual[i] + x[i])) << i;
  EXPECT_NE(rounded[0], residual[0] + x[0]);
  reference::rms_norm(rounded.data(), weight.data(), 1, hidden, 1e-6f, expected.data());
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace deepfuse
