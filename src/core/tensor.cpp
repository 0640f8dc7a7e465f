#include "deepfuse/tensor.hpp"

#include <utility>

#include "deepfuse/error.hpp"

namespace deepfuse {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) DF_CHECK_CUDA(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);  // no throw from a destructor; a failure here is unrecoverable anyway
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::zero(cudaStream_t stream) {
  if (bytes_) DF_CHECK_CUDA(cudaMemsetAsync(data_, 0, bytes_, stream));
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  DF_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload past the end of the buffer");
  DF_CHECK_CUDA(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  DF_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download past the end of the buffer");
  DF_CHECK_CUDA(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

TensorView::TensorView(void* data_in, DType dtype_in, std::initializer_list<int64_t> dims)
    : data(data_in), dtype(dtype_in), rank(static_cast<int>(dims.size())) {
  DF_CHECK(rank <= kMaxRank, "TensorView: rank above 4");
  int axis = 0;
  for (int64_t d : dims) shape[axis++] = d;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int axis = 0; axis < rank; ++axis) n *= shape[axis];
  return n;
}

std::string TensorView::describe() const {
  std::string text = std::string(dtype_name(dtype)) + "[";
  for (int axis = 0; axis < rank; ++axis) {
    if (axis) text += ", ";
    text += std::to_string(shape[axis]);
  }
  return text + "]";
}

}  // namespace deepfuse
