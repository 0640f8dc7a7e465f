// Host-side argument checks of the sampling and penalty launchers: bad sizes, null pointers and cluster sizes
// without a kernel return cudaErrorInvalidValue before anything reaches the GPU, so this runs on
// any machine.
#include <gtest/gtest.h>

#include <cstdint>

#include "deepfuse/kernels/sampling.hpp"
#include "deepfuse/kernels/token_penalties.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::fake_device_pointer;

kernels::SamplingParams valid_sampling() {
  kernels::SamplingParams p;
  p.logits = fake_device_pointer<const float>(0x100000);
  p.slots = fake_device_pointer<kernels::SamplingSlot>(0x200000);
  p.ids = fake_device_pointer<int32_t>(0x300000);
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

TEST(SmallKernelChecks, TokenPenaltiesRejectBadArguments) {
  auto valid = [] {
    kernels::TokenPenaltyParams p;
    p.logits = fake_device_pointer<float>(0x100000);
    p.counts = fake_device_pointer<int32_t>(0x200000);
    p.slots = fake_device_pointer<const kernels::PenaltySlot>(0x300000);
    p.batch = 4, p.vocab = 152064;
    return p;
  };
  auto expect_invalid = [](kernels::TokenPenaltyParams p, const char* what) {
    EXPECT_EQ(kernels::launch_token_penalties(p, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid();
  p.logits = nullptr, expect_invalid(p, "null logits");
  p = valid(), p.counts = nullptr, expect_invalid(p, "null counts");
  p = valid(), p.slots = nullptr, expect_invalid(p, "null slots");
  p = valid(), p.batch = 0, expect_invalid(p, "batch 0");
  p = valid(), p.batch = 65536, expect_invalid(p, "batch beyond the grid's rows");
  p = valid(), p.vocab = 0, expect_invalid(p, "empty vocabulary");
  p = valid(), p.vocab = (1 << 30) + 1, expect_invalid(p, "vocabulary beyond 2^30");
  EXPECT_TRUE(kernels::penalized({0.0f, 0.5f}));
  EXPECT_TRUE(kernels::penalized({-0.5f, 0.0f}));
  EXPECT_FALSE(kernels::penalized({}));
}

}  // namespace
}  // namespace deepfuse
