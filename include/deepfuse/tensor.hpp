// Device memory: an owning buffer, and a non-owning tensor view (dtype, shape, pointer).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace deepfuse {

enum class DType : uint8_t { bf16, f16, f32, i32, i64, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// Owns one cudaMalloc allocation; move-only. An empty buffer holds nullptr.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

  void zero(cudaStream_t stream = nullptr);
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;

  // Convenience for tests and tools: typed host vectors.
  template <typename T>
  static DeviceBuffer from_host(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    buffer.upload(host.data(), host.size() * sizeof(T));
    return buffer;
  }
  template <typename T>
  std::vector<T> to_host(size_t count) const {
    std::vector<T> host(count);
    download(host.data(), count * sizeof(T));
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A non-owning view of a dense row-major tensor of rank <= 4.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};

  TensorView() = default;
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> dims);

  int64_t dim(int axis) const { return shape[axis]; }
  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string describe() const;  // e.g. "bf16[4, 4096]"
};

}  // namespace deepfuse
