// What the GPU is, and how fast it can copy: every benchmark reports against the measured
// device-to-device copy bandwidth of the same run, not a datasheet number.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace deepfuse {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t global_memory_bytes = 0;
  size_t shared_memory_per_block_optin = 0;
  double memory_clock_khz = 0;
  int memory_bus_bits = 0;
};

// True when at least one CUDA device is usable (false, not an exception, on machines without one).
bool cuda_device_available();
// Usable CUDA devices (0 on machines without one).
int cuda_device_count();

// Fails with deepfuse::Error when no device is present.
DeviceInfo query_device(int ordinal = 0);

// Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written, as the
// median of `repetitions` copies of `bytes` each (default 1 GiB: far beyond any L2), after at least
// 100 ms of warm-up copies.
double measure_copy_bandwidth(size_t bytes = size_t{1} << 30, int repetitions = 20,
                              cudaStream_t stream = nullptr);

}  // namespace deepfuse
