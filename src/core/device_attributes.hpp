// What the kernels' launchers decide by (SM count, compute capability, shared memory), asked of
// the current device once and kept: launchers ask on every call, from any thread.
#pragma once

#include <cuda_runtime_api.h>

namespace deepfuse {

struct DeviceAttributes {
  int sm_count = 0;
  int compute_major = 0;
  int shared_bytes_per_sm = 0;              // what an SM's resident blocks share
  int shared_bytes_per_block_optin = 0;     // the most one block may opt in to
  int reserved_shared_bytes_per_block = 0;  // what the runtime keeps back per block
  // Thread-block clusters and distributed shared memory: sm_90 and later.
  bool has_clusters() const { return compute_major >= 9; }
};

// The current device's attributes, or the error of the first CUDA call that failed (nothing is
// kept then, so a later call asks again).
cudaError_t current_device_attributes(DeviceAttributes& out);

}  // namespace deepfuse
