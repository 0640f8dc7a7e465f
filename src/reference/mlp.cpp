#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/reference.hpp"

namespace deepfuse::reference {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

namespace {

// Runs body(begin, end) over [0, count) split across the machine's cores.
template <typename Body>
void parallel_for(size_t count, Body body) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), count));
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    const size_t begin = count * w / workers, end = count * (w + 1) / workers;
    threads.emplace_back([=] { body(begin, end); });
  }
  for (auto& t : threads) t.join();
}

double dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int k = 0; k < n; ++k) sum += static_cast<double>(a[k]) * b[k];
  return sum;
}

}  // namespace

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
