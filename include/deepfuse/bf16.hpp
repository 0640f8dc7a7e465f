// bfloat16 on the host: storage as uint16_t bits, conversion with round-to-nearest-even
// (what __float2bfloat16 does on the device), so host-made data matches device rounding.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace deepfuse {

inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Rounds a float through bf16 and back: the value a bf16 tensor would hold.
inline float round_to_bf16(float value) { return bf16_bits_to_float(float_to_bf16_bits(value)); }

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& values);
std::vector<float> bf16_bits_to_floats(const std::vector<uint16_t>& bits);

}  // namespace deepfuse
