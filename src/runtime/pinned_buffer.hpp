// Page-locked host memory: the only host memory an asynchronous copy may read from or write to
// without the driver staging it (and synchronising) behind our back; mapped, also memory a kernel
// reads and writes itself over PCIe (device_as()). Move-only owner.
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
  enum class Access { host, mapped };
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes, Access access = Access::host) : bytes_(bytes) {
    if (bytes == 0) return;
    DF_CHECK_CUDA(cudaHostAlloc(&data_, bytes, access == Access::mapped ? cudaHostAllocMapped : cudaHostAllocDefault));
    if (access == Access::mapped) DF_CHECK_CUDA(cudaHostGetDevicePointer(&device_, data_, 0));
  }
  ~PinnedBuffer() {
    if (data_) cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        device_(std::exchange(other.device_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      if (data_) cudaFreeHost(data_);
      data_ = std::exchange(other.data_, nullptr);
      device_ = std::exchange(other.device_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  // The address kernels use for it (null unless Access::mapped).
  template <typename T>
  T* device_as() const { return static_cast<T*>(device_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA event without timing, made on the first record() (on the device current then). Marks
// "the last work that reads or writes this staging memory" (a copy, or a step whose kernels do).
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
