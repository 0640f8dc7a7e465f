// kernels::quantize_rows_fp8 and quantize_blocks_fp8 against the host quantizer (core/float8.hpp's
// quantize_row_fp8, src/model's quantize_blocks_fp8), bit for bit: fresh random bf16 rows (blocks)
// of several magnitudes (subnormal e4m3 codes included), an all-zero row (block), one with a huge
// value, outputs poisoned first. Rows: weight shapes and the per-token activation shapes of the FP8
// GEMMs (M of 1 to 4096 tokens over hidden 4096 or intermediate 14336), on the vectorized path and
// the scalar one (columns not a multiple of 8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/float8.hpp"
#include "deepfuse/bf16.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/tensor.hpp"
#include "model/fp8_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

// The device's bytes and scales of `bits` quantized by `quantize(in, out, scales)`, into outputs
// poisoned first (e4m3 NaN bytes, NaN scales).
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

template <typename Quantize>
Quantized on_device(const std::vector<uint16_t>& bits, size_t scale_count, Quantize quantize) {
  const DeviceBuffer in = DeviceBuffer::from_host(bits);
  DeviceBuffer out(bits.size()), scales(scale_count * sizeof(float));
  out.upload(std::vector<uint8_t>(bits.size(), 0x7f).data(), bits.size());
  const std::vector<float> poison(scale_count, std::nanf(""));
  scales.upload(poison.data(), poison.size() * sizeof(float));
  EXPECT_EQ(quantize(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>()), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {out.to_host<uint8_t>(bits.size()), scales.to_host<float>(scale_count)};
}

TEST(QuantizeFp8, RowsMatchTheHostQuantizerBitForBit) {
  DF_REQUIRE_GPU();
  std::mt19937_64 rng = testing::make_rng(51);
  for (const auto [rows, columns] : {std::pair{5, 64}, std::pair{37, 1000}, std::pair{130, 4096}, std::pair{3, 1001},
                                       std::pair{1, 4096}, std::pair{17, 14336}, std::pair{64, 14336},
                                       std::pair{200, 4096}, std::pair{4096, 4096}}) {
    std::vector<uint16_t> bits(static_cast<size_t>(rows) * columns);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int r = 0; r < rows; ++r) {
      const float magnitude = std::ldexp(1.0f, r % 24 - 16);  // 2^-16 .. 2^7 across the rows
      for (int c = 0; c < columns; ++c) bits[r * columns + c] = float_to_bf16_bits(uniform(rng) * magnitude);
    }
    if (rows > 1) {
      for (int c = 0; c < columns; ++c) bits[c] = 0;                      // row 0: all zero
      bits[static_cast<size_t>(rows - 1) * columns] = float_to_bf16_bits(3e4f);  // last row: one outlier
    }
    const Quantized device = on_device(bits, rows, [&](const __nv_bfloat16* in, uint8_t* out, float* scales) {
      return kernels::quantize_rows_fp8(in, out, scales, rows, columns, nullptr);
    });
    const std::vector<uint8_t>& got = device.bytes;
    const std::vector<float>& got_scales = device.scales;
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

TEST(QuantizeFp8, BlocksMatchTheHostQuantizerBitForBit) {
  DF_REQUIRE_GPU();
  std::mt19937_64 rng = testing::make_rng(52);
  constexpr int kSide = 128;
  for (const auto [rows, columns] : {std::pair{128, 128}, std::pair{256, 640}, std::pair{1024, 384}}) {
    const int block_columns = columns / kSide, blocks = rows / kSide * block_columns;
    std::vector<uint16_t> bits(static_cast<size_t>(rows) * columns);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < columns; ++c) {
        const int block = r / kSide * block_columns + c / kSide;
        const float magnitude = std::ldexp(1.0f, block % 24 - 16);  // 2^-16 .. 2^7 across the blocks
        bits[static_cast<size_t>(r) * columns + c] = float_to_bf16_bits(uniform(rng) * magnitude);
      }
    if (blocks > 1)
      for (int r = 0; r < kSide; ++r)
        for (int c = kSide; c < 2 * kSide; ++c) bits[static_cast<size_t>(r) * columns + c] = 0;  // block (0, 1): zero
    bits[bits.size() - 1] = float_to_bf16_bits(-3e4f);  // the last block: one outlier
    const Quantized device = on_device(bits, blocks, [&](const __nv_bfloat16* in, uint8_t* out, float* scales) {
      return kernels::quantize_blocks_fp8(in, out, scales, rows, columns, kSide, nullptr);
    });
    std::vector<float> values(bits.size());
    for (size_t k = 0; k < bits.size(); ++k) values[k] = bf16_bits_to_float(bits[k]);
    std::vector<uint8_t> want(bits.size());
    const std::vector<float> want_scales = quantize_blocks_fp8(values, rows, columns, kSide, want);
    EXPECT_EQ(device.scales, want_scales) << rows << "x" << columns;
    size_t differ = 0;
    for (size_t k = 0; k < want.size(); ++k) differ += device.bytes[k] != want[k];
    EXPECT_EQ(differ, 0u) << rows << "x" << columns;
  }
}

TEST(QuantizeFp8, RefusesBadArguments) {
  DF_REQUIRE_GPU();
  DeviceBuffer in(64 * 2), out(64), scales(4);
  EXPECT_EQ(kernels::quantize_rows_fp8(nullptr, out.as<uint8_t>(), scales.as<float>(), 1, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::quantize_rows_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), 0, 64, nullptr),
            cudaErrorInvalidValue);
  // Blocks: the side must divide both sizes.
  EXPECT_EQ(kernels::quantize_blocks_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), 1, 64, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::quantize_blocks_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), 64, 96, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::quantize_blocks_fp8(in.as<__nv_bfloat16>(), out.as<uint8_t>(), scales.as<float>(), 64, 64, 0, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
