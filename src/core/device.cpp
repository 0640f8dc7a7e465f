#include "deepfuse/device.hpp"

#include <algorithm>
#include <vector>

#include "core/cuda_event.hpp"
#include "core/warm_up.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"

namespace deepfuse {

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later callers
    return 0;
  }
  return count;
}

bool cuda_device_available() { return cuda_device_count() > 0; }

DeviceInfo query_device(int ordinal) {
  DF_CHECK(cuda_device_available(), "no CUDA device is available");
  cudaDeviceProp prop{};
  DF_CHECK_CUDA(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  info.global_memory_bytes = prop.totalGlobalMem;
  info.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  int clock_khz = 0;
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, ordinal));
  info.memory_clock_khz = clock_khz;
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal));
  return info;
}

double measure_copy_bandwidth(size_t bytes, int repetitions, cudaStream_t stream) {
  DeviceBuffer source(bytes), destination(bytes);
  DF_CHECK_CUDA(cudaMemsetAsync(source.data(), 0x5a, bytes, stream));
  CudaEvent start, stop;
  std::vector<float> milliseconds;
  auto copy = [&](int) {
    DF_CHECK_CUDA(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  };
  warm_up(copy, 2, stream);
  for (int rep = 0; rep < repetitions; ++rep) {
    start.record(stream);
    DF_CHECK_CUDA(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    stop.record(stream);
    stop.synchronize();
    milliseconds.push_back(stop.ms_since(start));
  }
  std::nth_element(milliseconds.begin(), milliseconds.begin() + milliseconds.size() / 2, milliseconds.end());
  const double median_s = milliseconds[milliseconds.size() / 2] * 1e-3;
  return 2.0 * static_cast<double>(bytes) / median_s;
}

}  // namespace deepfuse
