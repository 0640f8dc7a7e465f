// The load-time half of a folded RMSNorm (folded_norm.cuh): the norm weight multiplied into the
// columns of the projection that consumes the normalised rows.
#include "deepfuse/kernels/folded_norm.hpp"

#include <algorithm>
#include <cstddef>

#include "kernels/common/pointer_checks.hpp"

namespace deepfuse::kernels {
namespace {

// One thread per 8 consecutive values of a row: one 16-byte load of the matrix and the weight,
// products rounded to bf16 once.
__global__ void fold_norm_weight_kernel(__nv_bfloat16* matrix, size_t vectors, int vectors_per_row,
                                        const __nv_bfloat16* weight) {
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < vectors;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint4* cell = reinterpret_cast<uint4*>(matrix) + index;
    uint4 bits = *cell;
    const uint4 scale_bits = reinterpret_cast<const uint4*>(weight)[index % vectors_per_row];
    auto* values = reinterpret_cast<__nv_bfloat162*>(&bits);
    const auto* scales = reinterpret_cast<const __nv_bfloat162*>(&scale_bits);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(values[j]), s = __bfloat1622float2(scales[j]);
      values[j] = __floats2bfloat162_rn(v.x * s.x, v.y * s.y);
    }
    *cell = bits;
  }
}

}  // namespace

cudaError_t launch_fold_norm_weight(__nv_bfloat16* matrix, int rows, int cols, const __nv_bfloat16* weight,
                                    cudaStream_t stream) {
  if (!matrix || !weight || rows < 1 || cols < 8 || cols % 8 != 0 || !aligned16(matrix) || !aligned16(weight))
    return cudaErrorInvalidValue;
  constexpr int kThreads = 256, kMaxBlocks = 4096;
  const size_t vectors = static_cast<size_t>(rows) * (cols / 8);
  const int blocks = static_cast<int>(std::min<size_t>((vectors + kThreads - 1) / kThreads, kMaxBlocks));
  fold_norm_weight_kernel<<<blocks, kThreads, 0, stream>>>(matrix, vectors, cols / 8, weight);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
