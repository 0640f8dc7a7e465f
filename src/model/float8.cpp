#include "model/float8.hpp"

#include <cmath>
#include <limits>

#include "model/float16.hpp"

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
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | 0x7f;
  const float magnitude = std::fabs(value);
  if (magnitude >= kFloat8E4m3Max) return sign | 0x7e;
  // Exponent of the step between neighbours: 2^-9 below the smallest normal 2^-6, else 2^(e-3).
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  const int step = magnitude < std::ldexp(1.0f, -6) ? -9 : exponent - 1 - 3;
  // nearbyint rounds half to even; a mantissa that rounds up to 16 carries into the exponent,
  // which the same formula encodes. Values that round past 448 saturate.
  const int steps = static_cast<int>(std::nearbyint(std::ldexp(magnitude, -step)));
  const int code = step == -9 ? steps : ((step + 3 + 7) << 3) + (steps - 8);
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

}  // namespace deepfuse
