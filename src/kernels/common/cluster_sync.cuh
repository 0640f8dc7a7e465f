// Thread-block cluster plumbing (sm_90): another block's shared memory, and barriers over the
// cluster. C = 1 (no cluster) falls back to the block itself.
#pragma once

#include <cooperative_groups.h>

namespace deepfuse::kernels {

// The same shared-memory object in block `rank` of this cluster (C = 1: our own).
template <int C, typename T>
__device__ __forceinline__ T* in_block(T* local, int rank) {
  if constexpr (C == 1) {
    return local;
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(local, rank);
#else
    __trap();  // clusters need sm_90; the launcher never asks for them below it
    return local;
#endif
  }
}

// Barrier over the cluster (C = 1: the block), ordering shared memory across its blocks.
template <int C>
__device__ __forceinline__ void cluster_barrier() {
  if constexpr (C == 1) {
    __syncthreads();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();
#endif
  }
}

// The two halves of a cluster barrier, for blocks that hand results to one block and leave.
// Every thread of the cluster arrives once per phase (a thread that has exited counts as
// arrived); arrive.release makes the thread's earlier writes, into any block's shared memory,
// visible to the threads whose wait.acquire completes the phase. A thread waits for a phase
// before it arrives at the next.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_wait_acquire() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#else
  __trap();
#endif
}

}  // namespace deepfuse::kernels
