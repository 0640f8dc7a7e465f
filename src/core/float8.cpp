#include "core/float8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/float16.hpp"

namespace deepfuse {

float float8_e4m3_to_float(uint8_t bits) {
  const float sign = bits & 0x80 ? -1.0f : 1.0f;
  const int exponent = bits >> 3 & 0xf, mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

float float8_e5m2_to_float(uint8_t bits) { return half_bits_to_float(static_cast<uint16_t>(bits << 8)); }

uint8_t float_to_float8_e4m3(float value) {
  // On the bits (quantizing a checkpoint at load encodes billions of values): a normal e4m3 value
  // keeps the fp32 exponent, rebiased from 127 to 7, and the top 3 of the 23 mantissa bits.
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const uint8_t sign = static_cast<uint8_t>(bits >> 24 & 0x80);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7f;         // NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7e;        // >= 448 (infinities too): saturate
  if (magnitude < 0x3c800000u) {                           // below 2^-6: subnormal steps of 2^-9
    float scaled = 0.0f;
    std::memcpy(&scaled, &magnitude, sizeof scaled);
    // Exact (a power-of-two scale), then rounded half to even; 8 steps is the smallest normal, 0x08.
    return sign | static_cast<uint8_t>(std::nearbyint(scaled * 512.0f));
  }
  // Round the 20 dropped mantissa bits half to even; a carry moves into the exponent, and what
  // rounds past 448 (0x7f, the NaN code) saturates.
  const uint32_t rounded = (magnitude + 0x7ffffu + (magnitude >> 20 & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

float quantize_row_fp8(std::span<const float> row, std::span<uint8_t> out) {
  float absmax = 0.0f;
  for (float v : row) absmax = std::max(absmax, std::fabs(v));
  const float scale = absmax > 0.0f ? absmax / kFloat8E4m3Max : 1.0f;
  for (size_t i = 0; i < row.size(); ++i) out[i] = float_to_float8_e4m3(row[i] / scale);
  return scale;
}

void quantize_rows_fp8(std::span<float> values, int64_t rows, int64_t columns) {
  std::vector<uint8_t> bytes(static_cast<size_t>(columns));
  for (int64_t o = 0; o < rows; ++o) {
    const std::span<float> row = values.subspan(static_cast<size_t>(o * columns), static_cast<size_t>(columns));
    const float scale = quantize_row_fp8(row, bytes);
    for (size_t i = 0; i < row.size(); ++i) row[i] = float8_e4m3_to_float(bytes[i]) * scale;
  }
}

}  // namespace deepfuse
