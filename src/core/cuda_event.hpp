// An owned CUDA event, destroyed with the object: the timing events of the benchmarks and the
// copy-bandwidth probe. Move-only; every call is checked (deepfuse::Error on failure).
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "deepfuse/error.hpp"

namespace deepfuse {

class CudaEvent {
 public:
  explicit CudaEvent(unsigned flags = cudaEventDefault) { DF_CHECK_CUDA(cudaEventCreateWithFlags(&event_, flags)); }
  ~CudaEvent() {
    if (event_) cudaEventDestroy(event_);
  }
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
      if (event_) cudaEventDestroy(event_);
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void record(cudaStream_t stream) { DF_CHECK_CUDA(cudaEventRecord(event_, stream)); }
  void synchronize() const { DF_CHECK_CUDA(cudaEventSynchronize(event_)); }
  // Milliseconds from `start` to this event; both recorded, this one complete.
  float ms_since(const CudaEvent& start) const {
    float ms = 0.0f;
    DF_CHECK_CUDA(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace deepfuse
