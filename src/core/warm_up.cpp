#include "core/warm_up.hpp"

#include "deepfuse/error.hpp"

namespace deepfuse {

void warm_up(const std::function<void(int rep)>& call, int min_calls, cudaStream_t stream) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < min_calls || std::chrono::steady_clock::now() - start < kWarmUpTime; ++i) {
    call(i);
    // The time counted is the GPU's: a queue of calls far ahead of it would end the loop early.
    if (stream && i % 8 == 7) DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  if (stream) DF_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace deepfuse
