// The distribution test of speculative sampling (issue 54), shared by the reference backend's
// verify test and the CUDA engine's: a two-sample chi-square per generated position.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace deepfuse::testing {

// Two-sample chi-square over the tokens at generated positions 1.. (position 0 comes from the
// prompt's pass, never a verify), both samples of `runs` sequences of equal length; the
// statistic's largest excess over its critical value at p = 1e-4 (< 0 passes).
inline double worst_chi_square_excess(const std::vector<std::vector<int32_t>>& a,
                                      const std::vector<std::vector<int32_t>>& b, int vocab) {
  double worst = -1e300;
  for (size_t position = 1; position < a[0].size(); ++position) {
    std::vector<double> count_a(vocab), count_b(vocab);
    for (const auto& run : a) count_a[run[position]] += 1;
    for (const auto& run : b) count_b[run[position]] += 1;
    double statistic = 0;
    int bins = 0;
    for (int v = 0; v < vocab; ++v) {
      if (count_a[v] + count_b[v] == 0) continue;
      statistic += (count_a[v] - count_b[v]) * (count_a[v] - count_b[v]) / (count_a[v] + count_b[v]);
      ++bins;
    }
    const double dof = std::max(1, bins - 1);
    const double z = 3.719;  // the standard normal's 1 - 1e-4 quantile; Wilson-Hilferty below
    const double h = 2.0 / (9.0 * dof);
    const double critical = dof * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
    std::printf("position %zu: chi-square %.1f, critical %.1f (%d bins)\n", position, statistic, critical, bins);
    worst = std::max(worst, statistic - critical);
  }
  return worst;
}

}  // namespace deepfuse::testing
