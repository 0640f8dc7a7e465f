// Page-locked host memory: the only host memory an asynchronous copy may read from or write to
// without the driver staging it (and synchronising) behind our back. Move-only owner.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <utility>

#include "core/cuda_event.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::runtime {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) DF_CHECK_CUDA(cudaMallocHost(&data_, bytes));
  }
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      if (data_) cudaFreeHost(data_);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA event without timing, made on the first record() (on the device current then). Marks
// "the copy that last read this staging memory".
class CopyEvent {
 public:
  void record(cudaStream_t stream) {
    if (!event_) event_.emplace(cudaEventDisableTiming);
    event_->record(stream);
  }
  // Blocks the host until the work recorded last has run (at once if nothing was recorded).
  void wait() const {
    if (event_) event_->synchronize();
  }

 private:
  std::optional<CudaEvent> event_;
};

}  // namespace deepfuse::runtime
