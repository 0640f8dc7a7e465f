// The launch configuration of a grid in thread-block clusters along x (cluster 1: no cluster
// attribute, a plain launch), for cudaLaunchKernelEx and cudaOccupancyMaxActiveClusters;
// optionally a programmatic dependent launch (the kernel overlaps its prologue with the previous
// kernel's tail: see wait_for_upstream_grids in dependent_launch.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace deepfuse::kernels {

struct ClusterLaunch {
  cudaLaunchAttribute attributes[2]{};
  cudaLaunchConfig_t config{};

  // grid: a block count (1-D) or a dim3; clusters run along x.
  ClusterLaunch(dim3 grid, unsigned threads, size_t shared_bytes, int cluster, cudaStream_t stream,
                bool programmatic = false) {
    unsigned count = 0;
    if (cluster > 1) {
      cudaLaunchAttribute& shape = attributes[count++];
      shape.id = cudaLaunchAttributeClusterDimension;
      shape.val.clusterDim.x = static_cast<unsigned>(cluster);
      shape.val.clusterDim.y = 1;
      shape.val.clusterDim.z = 1;
    }
    if (programmatic) {
      cudaLaunchAttribute& overlap = attributes[count++];
      overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      overlap.val.programmaticStreamSerializationAllowed = 1;
    }
    config.gridDim = grid;
    config.blockDim = dim3(threads, 1, 1);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = count > 0 ? attributes : nullptr;
    config.numAttrs = count;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into this object
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace deepfuse::kernels
