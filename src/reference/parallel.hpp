// Splitting a loop across the machine's cores, for the few reference ops big enough to need it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace deepfuse::reference {

// Runs body(begin, end) over [0, count) split across the machine's cores.
template <typename Body>
void parallel_for(size_t count, Body body) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), count));
  if (workers == 1) {
    body(size_t{0}, count);
    return;
  }
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    const size_t begin = count * w / workers, end = count * (w + 1) / workers;
    threads.emplace_back([=] { body(begin, end); });
  }
  for (auto& t : threads) t.join();
}

// Dot product of two float rows, accumulated in double.
inline double dot(const float* a, const float* b, int n) {
  double sum = 0;
  for (int k = 0; k < n; ++k) sum += static_cast<double>(a[k]) * b[k];
  return sum;
}

}  // namespace deepfuse::reference
