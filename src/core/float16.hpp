// IEEE 754 half precision <-> float on the host (F16 checkpoints).
#pragma once

#include <cstdint>

namespace deepfuse {

float half_bits_to_float(uint16_t half);

// Round to nearest even; overflow gives infinity, tiny values subnormals or zero.
uint16_t float_to_half_bits(float value);

}  // namespace deepfuse
