#include <cmath>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/reference.hpp"
#include "reference/parallel.hpp"

namespace deepfuse::reference {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

void swiglu_mlp(const float* x, const float* gate, const float* up, const float* down,
                const float* residual, double* y, int tokens, int hidden, int intermediate,
                bool round_activation_to_bf16) {
  // act[t][i] = silu(gate_i · x_t) * (up_i · x_t), kept as float rows so the down projection
  // is a plain dot product too.
  std::vector<float> act(static_cast<size_t>(tokens) * intermediate);
  parallel_for(intermediate, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      for (int t = 0; t < tokens; ++t) {
        const float* xt = x + static_cast<size_t>(t) * hidden;
        const double g = dot(gate + i * hidden, xt, hidden);
        const double u = dot(up + i * hidden, xt, hidden);
        const double a = silu(g) * u;
        act[static_cast<size_t>(t) * intermediate + i] =
            round_activation_to_bf16 ? round_to_bf16(static_cast<float>(a)) : static_cast<float>(a);
      }
  });
  parallel_for(hidden, [&](size_t begin, size_t end) {
    for (size_t h = begin; h < end; ++h)
      for (int t = 0; t < tokens; ++t) {
        double v = dot(down + h * intermediate, act.data() + static_cast<size_t>(t) * intermediate, intermediate);
        if (residual) v += residual[static_cast<size_t>(t) * hidden + h];
        y[static_cast<size_t>(t) * hidden + h] = v;
      }
  });
}

}  // namespace deepfuse::reference
