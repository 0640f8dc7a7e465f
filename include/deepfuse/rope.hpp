// Rotary position embedding: the parameters a model config gives and the inverse frequencies
// every RoPE implementation (the CPU reference and the GPU kernels alike) rotates by.
#pragma once

#include <vector>

namespace deepfuse {

// Rotary position embedding parameters (the Hugging Face "default" and "llama3" rope types).
struct RopeParams {
  int head_dim = 128;
  double theta = 10000.0;
  bool llama3_scaling = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

// inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, then llama3's wavelength-dependent scaling.
std::vector<double> rope_inverse_frequencies(const RopeParams& params);

}  // namespace deepfuse
