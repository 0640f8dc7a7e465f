#include "core/device_attributes.hpp"

#include <utility>

#include "core/per_device.hpp"

namespace deepfuse {

cudaError_t current_device_attributes(DeviceAttributes& out) {
  static PerDevice<DeviceAttributes> known;
  return known.get(out, [](DeviceAttributes& a) {
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    const std::pair<int*, cudaDeviceAttr> queries[] = {
        {&a.sm_count, cudaDevAttrMultiProcessorCount},
        {&a.compute_major, cudaDevAttrComputeCapabilityMajor},
        {&a.shared_bytes_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
        {&a.shared_bytes_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
        {&a.reserved_shared_bytes_per_block, cudaDevAttrReservedSharedMemoryPerBlock},
    };
    for (const auto& [value, attribute] : queries)
      if (cudaError_t e = cudaDeviceGetAttribute(value, attribute, device); e != cudaSuccess) return e;
    return cudaSuccess;
  });
}

}  // namespace deepfuse
