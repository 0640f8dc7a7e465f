// OCP 8-bit floats on the host (F8_E4M3 / F8_E5M2 checkpoints, FP8 quantization at load).
//   E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN (0x7f / 0xff), largest finite 448,
//                smallest subnormal 2^-9.
//   E5M2:        bias 15, IEEE-like (infinities, NaNs), largest finite 57344: the top byte of
//                an IEEE half.
#pragma once

#include <cstdint>
#include <span>

namespace deepfuse {

inline constexpr float kFloat8E4m3Max = 448.0f;

float float8_e4m3_to_float(uint8_t bits);
float float8_e5m2_to_float(uint8_t bits);

// Round to nearest even. Beyond ±448 (infinities too) saturates to ±448, as FP8 quantizers clip
// (there is no infinity to overflow to); NaN gives 0x7f, or 0xff when its sign bit is set.
uint8_t float_to_float8_e4m3(float value);


// One row through FP8 e4m3: returns its absmax scale (absmax / 448; 1 for an all-zero row) and
// writes the e4m3 bytes of row / scale (round to nearest even, saturating) to `out`. The weights'
// per-channel quantization (--quantize fp8) and the activations' per-token one (the FP8 GEMMs,
// emulated by the reference decoder) are both this; kernels::quantize_rows_fp8 on the device.
float quantize_row_fp8(std::span<const float> row, std::span<uint8_t> out);

// Rounds a row-major [rows, columns] fp32 matrix through FP8 e4m3 with one absmax scale per row
// (quantize_row_fp8), in place: what a weight would be stored as, or what an activation is after
// the per-token quantization.
void quantize_rows_fp8(std::span<float> values, int64_t rows, int64_t columns);

}  // namespace deepfuse
