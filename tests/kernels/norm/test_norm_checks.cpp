// Host-side argument checks of the RMSNorm launchers and of the folded norm's consumers (the
// norm weight folded into the next matrix): bad sizes, null or misaligned pointers and aliasing
// outputs return cudaErrorInvalidValue before anything reaches the GPU, so these run on any
// machine. Also the bf16-rounding option of reference::add_rms_norm the RMSNorm tests rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/kernels/swiglu_elementwise.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::fake_device_pointer;

kernels::RmsNormParams valid_norm() {
  kernels::RmsNormParams p;
  p.residual = fake_device_pointer<__nv_bfloat16>(0x100000);
  p.x = fake_device_pointer<const __nv_bfloat16>(0x200000);
  p.weight = fake_device_pointer<const __nv_bfloat16>(0x300000);
  p.out = fake_device_pointer<__nv_bfloat16>(0x400000);
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
  p = valid_norm(), p.out = fake_device_pointer<__nv_bfloat16>(0x100000 + 4 * 4096 * 2 - 16), expect_invalid(p, "out overlaps residual");
  p = valid_norm(), p.weight = fake_device_pointer<const __nv_bfloat16>(0x300004), expect_invalid(p, "misaligned weight");
  // add_rms_norm alone also reads x: an out overlapping x is rejected there.
  p = valid_norm(), p.out = fake_device_pointer<__nv_bfloat16>(0x200000);
  EXPECT_EQ(kernels::launch_add_rms_norm(p, nullptr), cudaErrorInvalidValue) << "out aliases x";
  p = valid_norm(), p.x = fake_device_pointer<const __nv_bfloat16>(0x200002);
  EXPECT_EQ(kernels::launch_add_rms_norm(p, nullptr), cudaErrorInvalidValue) << "misaligned x";
}

TEST(SmallKernelChecks, FoldedNormConsumersRejectBadArguments) {
  auto* gate_up = fake_device_pointer<const __nv_bfloat16>(0x1000000);
  auto* act = fake_device_pointer<__nv_bfloat16>(0x2000000);
  const kernels::FoldedRmsNorm norm{fake_device_pointer<const __nv_bfloat16>(0x3000000), 4096, 1e-5f};
  auto bad = norm;
  bad.hidden = 100;
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 4, 14336, nullptr, bad), cudaErrorInvalidValue) << "norm hidden";
  bad = norm, bad.input = fake_device_pointer<const __nv_bfloat16>(0x3000002);
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 4, 14336, nullptr, bad), cudaErrorInvalidValue) << "misaligned";
  EXPECT_EQ(kernels::silu_and_mul(gate_up, act, 65536, 64, nullptr, norm), cudaErrorInvalidValue) << "tokens";

  auto* matrix = fake_device_pointer<__nv_bfloat16>(0x4000000);
  auto* weight = fake_device_pointer<const __nv_bfloat16>(0x5000000);
  EXPECT_EQ(kernels::launch_fold_norm_weight(nullptr, 4, 64, weight, nullptr), cudaErrorInvalidValue) << "null matrix";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 64, nullptr, nullptr), cudaErrorInvalidValue) << "null weight";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 0, 64, weight, nullptr), cudaErrorInvalidValue) << "no rows";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 60, weight, nullptr), cudaErrorInvalidValue) << "cols % 8";
  EXPECT_EQ(kernels::launch_fold_norm_weight(matrix, 4, 64, fake_device_pointer<const __nv_bfloat16>(0x5000002), nullptr),
            cudaErrorInvalidValue)
      << "misaligned weight";
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
