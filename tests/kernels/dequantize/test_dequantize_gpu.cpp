// FP8 -> bf16 widening against the host's e4m3 decoding times the scales, on fresh random
// weights (both scale granularities), the output poisoned with NaN first.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/dequantize.hpp"
#include "kernels/fp8_test_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;

TEST(Dequantize, WidensFp8ToTheRoundedProductOfBytesAndScales) {
  DF_REQUIRE_GPU();
  uint64_t salt = 10;
  for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128})
    for (auto [rows, columns] : {std::pair{256, 384}, {128, 128}, {1024, 4096}}) {
      SCOPED_TRACE(std::string(weight_format_name(format)) + " " + std::to_string(rows) + "x" + std::to_string(columns));
      auto rng = testing::make_rng(++salt);
      std::vector<float> w = testing::random_uniform(rng, static_cast<size_t>(rows) * columns, 0.05f);
      w[3] = 0.0f;  // zero and a subnormal e4m3 value decode exactly
      w[5] = 1e-7f;
      const testing::Fp8TestWeights q = testing::quantize_fp8_for_test(w, rows, columns, format);
      const DeviceBuffer bytes = DeviceBuffer::from_host(q.bytes), scales = DeviceBuffer::from_host(q.scales);
      DeviceBuffer out = DeviceBuffer::from_host(std::vector<uint16_t>(w.size(), kNanBits));
      const LinearWeight weight{format, WeightLayout::row_major, bytes.data(), scales.as<float>(), nullptr, rows, columns};
      DF_CHECK_CUDA(kernels::launch_dequantize_to_bf16(weight, out.as<__nv_bfloat16>(), nullptr));
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = out.to_host<uint16_t>(w.size());
      size_t wrong = 0;
      for (size_t i = 0; i < w.size(); ++i) wrong += got[i] != float_to_bf16_bits(q.dequantized[i]);
      EXPECT_EQ(wrong, 0u) << "every value is bf16(e4m3 * scale), rounded once";
    }
}

TEST(Dequantize, RejectsBf16AndMissingScales) {
  DF_REQUIRE_GPU();
  DeviceBuffer bytes(128 * 128), out(128 * 128 * 2);
  LinearWeight weight{WeightFormat::bf16, WeightLayout::row_major, bytes.data(), nullptr, nullptr, 128, 128};
  EXPECT_EQ(kernels::launch_dequantize_to_bf16(weight, out.as<__nv_bfloat16>(), nullptr), cudaErrorInvalidValue);
  weight.format = WeightFormat::fp8_e4m3;  // no scales
  EXPECT_EQ(kernels::launch_dequantize_to_bf16(weight, out.as<__nv_bfloat16>(), nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
