#include "core/device_attributes.hpp"

#include <mutex>
#include <utility>
#include <vector>

namespace deepfuse {

cudaError_t current_device_attributes(DeviceAttributes& out) {
  static std::mutex mutex;
  static std::vector<std::pair<int, DeviceAttributes>> known;  // (device ordinal, its attributes)
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [ordinal, attributes] : known)
    if (ordinal == device) {
      out = attributes;
      return cudaSuccess;
    }
  DeviceAttributes a;
  const std::pair<int*, cudaDeviceAttr> queries[] = {
      {&a.sm_count, cudaDevAttrMultiProcessorCount},
      {&a.compute_major, cudaDevAttrComputeCapabilityMajor},
      {&a.shared_bytes_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {&a.shared_bytes_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {&a.reserved_shared_bytes_per_block, cudaDevAttrReservedSharedMemoryPerBlock},
  };
  for (const auto& [value, attribute] : queries)
    if (cudaError_t e = cudaDeviceGetAttribute(value, attribute, device); e != cudaSuccess) return e;
  known.emplace_back(device, a);
  out = a;
  return cudaSuccess;
}

}  // namespace deepfuse
