// FP8 weights for kernel tests: a float matrix quantized to e4m3 with per-row or 128x128-block
// fp32 scales (absmax / 448, as the loader's --quantize fp8 and the checkpoints do), and the
// dequantized values the CPU reference multiplies by.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "deepfuse/weight_format.hpp"
#include "core/float8.hpp"

namespace deepfuse::testing {

struct Fp8TestWeights {
  std::vector<uint8_t> bytes;      // row-major e4m3
  std::vector<float> scales;       // scale_shape(format, rows, columns), row-major
  std::vector<float> dequantized;  // bytes times their scale, row-major
};

inline Fp8TestWeights quantize_fp8_for_test(const std::vector<float>& w, int rows, int columns, WeightFormat format) {
  const int block = format_info(format).scale_block;
  const ScaleShape shape = scale_shape(format, rows, columns);
  Fp8TestWeights q{std::vector<uint8_t>(w.size()), std::vector<float>(shape.rows * shape.columns, 0.0f), w};
  auto scale_index = [&](int r, int c) { return block ? (r / block) * (columns / block) + c / block : r; };
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < columns; ++c) {
      float& s = q.scales[scale_index(r, c)];
      s = std::max(s, std::fabs(w[static_cast<size_t>(r) * columns + c]));
    }
  for (float& s : q.scales) s = s > 0.0f ? s / kFloat8E4m3Max : 1.0f;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < columns; ++c) {
      const size_t i = static_cast<size_t>(r) * columns + c;
      const float s = q.scales[scale_index(r, c)];
      q.bytes[i] = float_to_float8_e4m3(w[i] / s);
      q.dequantized[i] = float8_e4m3_to_float(q.bytes[i]) * s;
    }
  return q;
}

}  // namespace deepfuse::testing
