// Restores the calling thread's current CUDA device on scope exit (normal return or throw): for
// code that visits several GPUs of a group from one thread.
#pragma once

#include <cuda_runtime_api.h>

#include "deepfuse/error.hpp"

namespace deepfuse {

struct CurrentDeviceGuard {
  int device = 0;
  CurrentDeviceGuard() { DF_CHECK_CUDA(cudaGetDevice(&device)); }
  ~CurrentDeviceGuard() { cudaSetDevice(device); }  // nothing to report from a destructor
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;
};

}  // namespace deepfuse
