// Host-side argument checks of the RoPE + KV append launcher: bad sizes, null or misaligned
// pointers and aliasing outputs return cudaErrorInvalidValue before anything reaches the GPU, so
// this runs on any machine.
#include <gtest/gtest.h>

#include <cstdint>

#include "deepfuse/kernels/folded_norm.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::fake_device_pointer;

kernels::RopeKvAppendParams valid_rope() {
  kernels::RopeKvAppendParams p;
  p.qkv = fake_device_pointer<const __nv_bfloat16>(0x1000000);
  p.inv_freq = fake_device_pointer<const float>(0x2000000);
  p.positions = fake_device_pointer<const int32_t>(0x3000000);
  p.sequences = fake_device_pointer<const int32_t>(0x4000000);
  p.q_out = fake_device_pointer<__nv_bfloat16>(0x5000000);
  p.kv.k_pages = fake_device_pointer<__nv_bfloat16>(0x6000000);
  p.kv.v_pages = fake_device_pointer<__nv_bfloat16>(0x7000000);
  p.kv.block_table = fake_device_pointer<const int32_t>(0x8000000);
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
  p = valid_rope(), p.q_out = fake_device_pointer<__nv_bfloat16>(0x1000000 + 256), expect_invalid(p, "q_out overlaps qkv");
  p = valid_rope(), p.qkv_bias = fake_device_pointer<const __nv_bfloat16>(0x9000008), expect_invalid(p, "misaligned bias");
  p = valid_rope(), p.kv.k_pages = fake_device_pointer<__nv_bfloat16>(0x6000004), expect_invalid(p, "misaligned k_pages");
  const kernels::FoldedRmsNorm norm{fake_device_pointer<const __nv_bfloat16>(0xa000000), 4096, 1e-5f};
  p = valid_rope(), p.input_norm = norm, p.input_norm.hidden = 12, expect_invalid(p, "norm hidden not a multiple of 8");
  p = valid_rope(), p.input_norm = norm, p.input_norm.hidden = 0, expect_invalid(p, "norm hidden 0");
  p = valid_rope(), p.input_norm = norm, p.input_norm.eps = -1.0f, expect_invalid(p, "negative norm eps");
  p = valid_rope(), p.input_norm = norm, p.input_norm.input = fake_device_pointer<const __nv_bfloat16>(0xa000004),
  expect_invalid(p, "misaligned norm input");
  p = valid_rope(), p.input_norm = norm, p.tokens = 65536, p.q_out = fake_device_pointer<__nv_bfloat16>(0x40000000);
  expect_invalid(p, "more tokens than grid rows");
}

}  // namespace
}  // namespace deepfuse
