// kernels::quantize_rows_fp8 against the host quantizer (src/model, quantize_row_fp8), bit for
// bit: fresh random bf16 rows of several magnitudes (subnormal e4m3 codes included), an all-zero
// row, a row with one huge value, outputs poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/tensor.hpp"
#include "model/fp8_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(QuantizeFp8, RowsMatchTheHostQuantizerBitForBit) {
  DF_REQUIRE_GPU();
  std::mt19937_64 rng = testing::make_rng(51);
  for (const auto [rows, columns] : {std::pair{5, 64}, std::pair{37, 1000}, std::pair{130, 4096}}) {
    std::vector<uint16_t> bits(static_cast<size_t>(rows) * columns);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int r = 0; r < rows; ++r) {
      const float magnitude = std::ldexp(1.0f, r % 24 - 16);  // 2^-16 .. 2^7 across the rows
      for (int c = 0; c < columns; ++c) bits[r * columns + c] = float_to_bf16_bits(uniform(rng) * magnitude);
    }
    for (int c = 0; c < columns; ++c) bits[c] = 0;                      // row 0: all zero
    bits[static_cast<size_t>(rows - 1) * columns] = float_to_bf16_bits(3e4f);  // last row: one outlier
    const DeviceBuffer in = DeviceBuffer::from_host(bits);
    DeviceBuffer out(bits.size()), scales(rows * sizeof(float));
    out.upload(std::vector<uint8_t>(bits.size(), 0x7f).data(), bits.size());  // e4m3 NaN
    const std::vector<float> poison(rows, std::nanf(""));
    scales.upload(poison.data(), poison.size() * sizeof(float));
    ASSERT_EQ(kernels::quantize_rows_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), rows, columns,
                                         nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint8_t> got = out.to_host<uint8_t>(bits.size());
    const std::vector<float> got_scales = scales.to_host<float>(rows);
    std::vector<uint8_t> want(static_cast<size_t>(columns));
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row(static_cast<size_t>(columns));
      for (int c = 0; c < columns; ++c) row[c] = bf16_bits_to_float(bits[r * columns + c]);
      const float scale = quantize_row_fp8(row, want);
      EXPECT_EQ(got_scales[r], scale) << rows << "x" << columns << " row " << r;
      size_t differ = 0;
      for (int c = 0; c < columns; ++c) differ += got[r * columns + c] != want[c];
      EXPECT_EQ(differ, 0u) << rows << "x" << columns << " row " << r;
    }
  }
}

TEST(QuantizeFp8, RefusesBadArguments) {
  DF_REQUIRE_GPU();
  DeviceBuffer in(64 * 2), out(64), scales(4);
  EXPECT_EQ(kernels::quantize_rows_fp8(nullptr, out.as<uint8_t>(), scales.as<float>(), 1, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::quantize_rows_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), 0, 64, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
