// Programmatic dependent launch helpers (device side), shared by every kernel that is launched
// as a programmatic dependent or lets its successor start early.
#pragma once

namespace deepfuse::kernels {

// Programmatic dependent launch (sm_90+; no-ops below): a kernel launched with
// ClusterLaunch's programmatic flag may start while the previous kernel in the stream finishes.
// Before wait_for_upstream_grids() it may only touch what no earlier kernel writes (its own
// shared memory, constant weights); after it, everything upstream is complete and visible.
__device__ __forceinline__ void wait_for_upstream_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the next programmatic kernel in the stream be scheduled once every block of this one has
// called it (its blocks then wait for this grid's completion in wait_for_upstream_grids).
__device__ __forceinline__ void allow_downstream_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace deepfuse::kernels
