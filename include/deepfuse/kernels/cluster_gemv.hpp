// What the cluster GEMV weight stream (kernels/common/cluster_gemv.cuh), behind qkv_rope_fused and
// gemv_residual, needs of a GPU. Host code can include it without nvcc.
#pragma once

#include <string>

namespace deepfuse::kernels {

// Every instance's dynamic shared memory limit, set before its first launch (one block of up to 8
// tokens at hidden 4096 needs about 108 KB; the limit covers 32 tokens and the spread grid).
inline constexpr int kClusterGemvSharedBytes = 200 * 1024;

// Why a GPU whose blocks may opt into `shared_bytes_per_block` of shared memory cannot launch the
// stream (empty: it can): cudaFuncSetAttribute refuses the limit above.
inline std::string cluster_gemv_unsupported(int shared_bytes_per_block) {
  if (shared_bytes_per_block >= kClusterGemvSharedBytes) return "";
  return "asks for " + std::to_string(kClusterGemvSharedBytes / 1024) +
         " KB of shared memory per block, more than the GPU allows (" + std::to_string(shared_bytes_per_block / 1024) +
         " KB)";
}

}  // namespace deepfuse::kernels
