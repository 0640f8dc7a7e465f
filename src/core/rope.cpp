#include "deepfuse/rope.hpp"

#include <cmath>
#include <numbers>
#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse {

std::vector<double> rope_inverse_frequencies(const RopeParams& params) {
  DF_CHECK(params.head_dim > 0 && params.head_dim % 2 == 0,
           "rope head_dim must be positive and even, got " + std::to_string(params.head_dim));
  const int half = params.head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(params.theta, 2.0 * i / params.head_dim);
  if (!params.llama3_scaling) return inv_freq;

  // transformers' _compute_llama3_parameters: long wavelengths are slowed down by `factor`, short
  // ones kept, and the band in between interpolated smoothly (boundaries belong to the band).
  DF_CHECK(params.high_freq_factor != params.low_freq_factor,
           "llama3 rope scaling needs high_freq_factor != low_freq_factor");
  const double low_freq_wavelen = params.original_max_position / params.low_freq_factor;
  const double high_freq_wavelen = params.original_max_position / params.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= params.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (params.original_max_position / wavelen - params.low_freq_factor) /
                            (params.high_freq_factor - params.low_freq_factor);
      f = (1.0 - smooth) * f / params.factor + smooth * f;
    }
  }
  return inv_freq;
}

}  // namespace deepfuse
