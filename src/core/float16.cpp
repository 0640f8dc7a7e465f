#include "core/float16.hpp"

#include <cstring>

namespace deepfuse {

float half_bits_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: shift the mantissa up until its leading 1 becomes the implicit bit
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

namespace {

// Drops the low `shift` bits of `value`, rounding to nearest with ties to even.
uint32_t shift_right_rounding_even(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t remainder = value & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  return kept + (remainder > halfway || (remainder == halfway && (kept & 1u)) ? 1u : 0u);
}

}  // namespace

uint16_t float_to_half_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xffu);
  const uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  const int half_exponent = exponent - 127 + 15;
  if (half_exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (half_exponent <= 0) {  // subnormal half (or zero): the implicit 1 becomes explicit
    if (half_exponent < -10) return static_cast<uint16_t>(sign);
    return static_cast<uint16_t>(sign | shift_right_rounding_even(mantissa | 0x800000u, 14 - half_exponent));
  }
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  return static_cast<uint16_t>(sign | shift_right_rounding_even((static_cast<uint32_t>(half_exponent) << 23) | mantissa, 13));
}

}  // namespace deepfuse
