// RMSNorm and add + RMSNorm against reference::rms_norm / reference::add_rms_norm (with the
// residual rounded to bf16, as the kernel stores it) on fresh random rows, outputs poisoned with
// NaN. The residual must be updated in place exactly (add) or left untouched (plain norm). Also
// the load-time half of a folded norm: the weight multiplied into a matrix's columns, bit-exact.
#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;
const std::vector<int> kRows = {1, 3, 17, 256};
const std::vector<int> kHidden = {8, 64, 896, 904, 2048, 3584, 4096, 5120, 8192, 16384};

std::vector<float> random_bf16(std::mt19937_64& rng, size_t count, float scale, float offset = 0.0f) {
  std::vector<float> values = testing::random_uniform(rng, count, scale);
  for (float& v : values) v = round_to_bf16(v + offset);
  return values;
}

struct NormCase {
  int rows, hidden;
  float eps;
  std::vector<float> residual, x, weight;
};

NormCase make_case(std::mt19937_64& rng, int rows, int hidden) {
  NormCase c{rows, hidden, hidden % 3 == 0 ? 1e-5f : 1e-6f, {}, {}, {}};
  const size_t count = static_cast<size_t>(rows) * hidden;
  c.residual = random_bf16(rng, count, 2.0f);
  c.x = random_bf16(rng, count, 1.0f);
  c.weight = random_bf16(rng, hidden, 0.5f, 1.0f);  // around 1, as trained norms are
  return c;
}

struct GpuResult {
  std::vector<float> out, residual;
};

// add: launch_add_rms_norm (with x unless `without_x`); else launch_rms_norm.
GpuResult run_on_gpu(const NormCase& c, bool add, bool without_x = false) {
  const size_t count = static_cast<size_t>(c.rows) * c.hidden;
  DeviceBuffer residual = DeviceBuffer::from_host(to_bf16_bits(c.residual));
  DeviceBuffer x = DeviceBuffer::from_host(to_bf16_bits(c.x));
  DeviceBuffer weight = DeviceBuffer::from_host(to_bf16_bits(c.weight));
  DeviceBuffer out = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
  kernels::RmsNormParams params;
  params.residual = residual.as<__nv_bfloat16>();
  params.x = add && !without_x ? x.as<__nv_bfloat16>() : nullptr;
  params.weight = weight.as<__nv_bfloat16>();
  params.out = out.as<__nv_bfloat16>();
  params.rows = c.rows;
  params.hidden = c.hidden;
  params.eps = c.eps;
  DF_CHECK_CUDA(add ? kernels::launch_add_rms_norm(params, nullptr) : kernels::launch_rms_norm(params, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return {bf16_bits_to_floats(out.to_host<uint16_t>(count)), bf16_bits_to_floats(residual.to_host<uint16_t>(count))};
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// First index where a and b differ, or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

TEST(RmsNormGpu, MatchesReferenceAndLeavesResidualAlone) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(501);
  for (int hidden : kHidden) {
    for (int rows : kRows) {
      const NormCase c = make_case(rng, rows, hidden);
      const GpuResult gpu = run_on_gpu(c, false);
      std::vector<float> expected(gpu.out.size());
      reference::rms_norm(c.residual.data(), c.weight.data(), rows, hidden, c.eps, expected.data());
      EXPECT_EQ(testing::count_nan(gpu.out), 0u) << rows << "x" << hidden;
      EXPECT_LT(testing::relative_error(gpu.out, widen(expected)), kTolerance) << rows << "x" << hidden;
      EXPECT_EQ(first_difference(gpu.residual, c.residual), -1) << rows << "x" << hidden << ": residual modified";
    }
  }
}

TEST(AddRmsNormGpu, UpdatesResidualInPlaceAndNormalisesTheRoundedSum) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(502);
  for (int hidden : kHidden) {
    for (int rows : kRows) {
      const NormCase c = make_case(rng, rows, hidden);
      const GpuResult gpu = run_on_gpu(c, true);
      std::vector<float> residual = c.residual, expected(gpu.out.size());
      reference::add_rms_norm(residual.data(), c.x.data(), c.weight.data(), rows, hidden, c.eps, expected.data(),
                              /*round_residual_to_bf16=*/true);
      EXPECT_EQ(testing::count_nan(gpu.out), 0u) << rows << "x" << hidden;
      EXPECT_LT(testing::relative_error(gpu.out, widen(expected)), kTolerance) << rows << "x" << hidden;
      // bf16(residual + x) is one correctly rounded fp32 add on both sides: bit-exact.
      const long diff = first_difference(gpu.residual, residual);
      EXPECT_EQ(diff, -1) << rows << "x" << hidden << ": residual element " << diff << " is "
                          << (diff >= 0 ? gpu.residual[diff] : 0.0f) << ", expected "
                          << (diff >= 0 ? residual[diff] : 0.0f);
    }
  }
}

// The reference without bf16 rounding of the residual is what an fp32 residual stream would
// give; the kernel must track it too (rounding moves the result by far less than the tolerance).
TEST(AddRmsNormGpu, CloseToTheUnroundedReference) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(503);
  const NormCase c = make_case(rng, 5, 3584);
  const GpuResult gpu = run_on_gpu(c, true);
  std::vector<float> residual = c.residual, expected(gpu.out.size());
  reference::add_rms_norm(residual.data(), c.x.data(), c.weight.data(), c.rows, c.hidden, c.eps, expected.data());
  EXPECT_LT(testing::relative_error(gpu.out, widen(expected)), kTolerance);
}

TEST(AddRmsNormGpu, WithoutXIsThePlainNorm) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(504);
  for (int hidden : {904, 4096}) {
    const NormCase c = make_case(rng, 3, hidden);
    const GpuResult gpu = run_on_gpu(c, true, /*without_x=*/true);
    std::vector<float> expected(gpu.out.size());
    reference::rms_norm(c.residual.data(), c.weight.data(), c.rows, hidden, c.eps, expected.data());
    EXPECT_EQ(testing::count_nan(gpu.out), 0u);
    EXPECT_LT(testing::relative_error(gpu.out, widen(expected)), kTolerance) << hidden;
    EXPECT_EQ(first_difference(gpu.residual, c.residual), -1) << hidden << ": residual modified";
  }
}

// Each product is one fp32 multiply of two bf16 values, rounded once: bit-exact against the host.
TEST(FoldNormWeightGpu, MultipliesEveryColumnByItsWeight) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(505);
  for (auto [rows, cols] : {std::pair{1, 8}, std::pair{3, 904}, std::pair{6144, 4096}}) {
    const std::vector<float> matrix = random_bf16(rng, static_cast<size_t>(rows) * cols, 0.05f);
    const std::vector<float> weight = random_bf16(rng, cols, 0.5f, 1.0f);
    DeviceBuffer matrix_dev = DeviceBuffer::from_host(to_bf16_bits(matrix));
    const DeviceBuffer weight_dev = DeviceBuffer::from_host(to_bf16_bits(weight));
    DF_CHECK_CUDA(kernels::launch_fold_norm_weight(matrix_dev.as<__nv_bfloat16>(), rows, cols,
                                                   weight_dev.as<__nv_bfloat16>(), nullptr));
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    const auto folded = bf16_bits_to_floats(matrix_dev.to_host<uint16_t>(matrix.size()));
    for (size_t i = 0; i < matrix.size(); ++i)
      ASSERT_EQ(folded[i], round_to_bf16(matrix[i] * weight[i % cols])) << rows << "x" << cols << " element " << i;
  }
}

}  // namespace
}  // namespace deepfuse
