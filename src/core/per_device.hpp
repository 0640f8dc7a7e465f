// A value asked of each device once (its attributes, a kernel's occupancy, a shared-memory
// opt-in done): launchers ask on every call, from any thread, of whichever device is current.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>
#include <vector>

namespace deepfuse {

template <typename T>
class PerDevice {
 public:
  // Copies the current device's value into `out`, first computing it with `compute(T&)` (which
  // returns cudaError_t) when this device has none yet. A failed computation is returned and not
  // kept, so a later call tries again.
  template <typename Compute>
  cudaError_t get(T& out, Compute&& compute) {
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [ordinal, value] : known_)
      if (ordinal == device) {
        out = value;
        return cudaSuccess;
      }
    T value{};
    if (cudaError_t e = compute(value); e != cudaSuccess) return e;
    known_.emplace_back(device, value);
    out = value;
    return cudaSuccess;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<int, T>> known_;  // (device ordinal, its value)
};

}  // namespace deepfuse
