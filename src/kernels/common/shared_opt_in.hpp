// A kernel's dynamic shared memory beyond the 48 KB default, opted in, and how many of its blocks
// then fit on one SM: what a launcher that keeps its whole grid resident asks first.
#pragma once

#include <cuda_runtime_api.h>

namespace deepfuse::kernels {

template <typename Kernel>
cudaError_t opt_in_blocks_per_sm(Kernel kernel, int threads, int shared_bytes, int& blocks_per_sm) {
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
      e != cudaSuccess)
    return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, shared_bytes);
}

}  // namespace deepfuse::kernels
