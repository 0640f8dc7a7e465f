// Host-side argument checks of the embedding launcher: bad sizes and null or misaligned
// pointers return cudaErrorInvalidValue before anything reaches the GPU, so this runs on any machine.
#include <gtest/gtest.h>

#include <cstdint>

#include "deepfuse/kernels/embedding.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::fake_device_pointer;

kernels::EmbeddingParams valid_embedding() {
  kernels::EmbeddingParams p;
  p.table = fake_device_pointer<const __nv_bfloat16>(0x100000);
  p.ids = fake_device_pointer<const int32_t>(0x200000);
  p.out = fake_device_pointer<__nv_bfloat16>(0x300000);
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
  p = valid_embedding(), p.table = fake_device_pointer<const __nv_bfloat16>(0x100008), expect_invalid(p, "misaligned table");
  p = valid_embedding(), p.out = fake_device_pointer<__nv_bfloat16>(0x300002), expect_invalid(p, "misaligned out");
}

}  // namespace
}  // namespace deepfuse
