#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "deepfuse/bf16.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(bf16_bits_to_float(0xc000), -2.0f);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(float_to_bf16_bits(std::numeric_limits<float>::infinity()))));
}

TEST(Bf16, RoundTripIsExactForRepresentableValues) {
  auto rng = testing::make_rng(1);
  for (float v : testing::random_uniform(rng, 1000, 100.0f)) {
    const float r = round_to_bf16(v);
    EXPECT_EQ(round_to_bf16(r), r);
    EXPECT_LE(std::fabs(r - v), std::fabs(v) * (1.0f / 256));
  }
}

TEST(Errors, CudaCheckNamesCallFileAndLine) {
  try {
    DF_CHECK_CUDA(cudaErrorInvalidValue);
    FAIL() << "no exception";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
    EXPECT_NE(what.find("test_core.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDA error 1"), std::string::npos) << what;
  }
}

TEST(Errors, CheckThrowsTheGivenMessage) {
  EXPECT_THROW(DF_CHECK(false, "hidden size 100 is not a multiple of 64"), Error);
  try {
    DF_CHECK(1 + 1 == 3, "the message");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "the message");
  }
}

TEST(Tensor, ViewShapesAndBytes) {
  TensorView view(nullptr, DType::bf16, {4, 4096});
  EXPECT_EQ(view.rank, 2);
  EXPECT_EQ(view.numel(), 4 * 4096);
  EXPECT_EQ(view.bytes(), size_t{4} * 4096 * 2);
  EXPECT_EQ(view.describe(), "bf16[4, 4096]");
  EXPECT_THROW(TensorView(nullptr, DType::f32, {1, 2, 3, 4, 5}), Error);
}

TEST(Device, QueryFailsCleanlyOrDescribesTheGpu) {
  if (!cuda_device_available()) {
    EXPECT_THROW(query_device(), Error);
    return;
  }
  const DeviceInfo info = query_device();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.l2_bytes, 0u);
}

TEST(DeviceBuffer, RoundTripAndMove) {
  DF_REQUIRE_GPU();
  std::vector<int> host{1, 2, 3, 4, 5};
  DeviceBuffer buffer = DeviceBuffer::from_host(host);
  DeviceBuffer moved = std::move(buffer);
  EXPECT_TRUE(buffer.empty());
  EXPECT_EQ(moved.to_host<int>(5), host);
  EXPECT_THROW(moved.upload(host.data(), 100 * sizeof(int)), Error);
}

}  // namespace
}  // namespace deepfuse
