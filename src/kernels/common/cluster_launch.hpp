// The launch configuration of a 1-D grid in thread-block clusters (cluster 1: no cluster
// attribute, a plain launch), for cudaLaunchKernelEx and cudaOccupancyMaxActiveClusters.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace deepfuse::kernels {

struct ClusterLaunch {
  cudaLaunchAttribute cluster_shape{};
  cudaLaunchConfig_t config{};

  ClusterLaunch(unsigned blocks, unsigned threads, size_t shared_bytes, int cluster, cudaStream_t stream) {
    cluster_shape.id = cudaLaunchAttributeClusterDimension;
    cluster_shape.val.clusterDim.x = static_cast<unsigned>(cluster);
    cluster_shape.val.clusterDim.y = 1;
    cluster_shape.val.clusterDim.z = 1;
    config.gridDim = dim3(blocks, 1, 1);
    config.blockDim = dim3(threads, 1, 1);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = cluster > 1 ? &cluster_shape : nullptr;
    config.numAttrs = cluster > 1 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into this object
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace deepfuse::kernels
