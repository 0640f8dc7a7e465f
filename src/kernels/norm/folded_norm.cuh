// An RMSNorm folded into the projection after it: rms_norm(x)·w·W^T = (1/rms(x))·(x·(W∘w)^T), with
// (W∘w)[n, k] = W[n, k]·w[k]. The norm weight is multiplied into the projection's columns once at
// load (launch_fold_norm_weight), the projection reads the raw residual stream, and the kernel that
// consumes the projection's output scales each token's values by 1/rms(x) (row_inverse_rms). The
// norm's own launch, and its bf16 round trip of the normalised rows, disappear. Rounding: one
// bf16 rounding of W∘w at load where Hugging Face rounds the normalised row; the same trade the
// fused kernels make (docs/kernels/swiglu_fused.md, "v6: the norm weight in the packed columns").
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/pointer_checks.hpp"

namespace deepfuse::kernels {

// What a consumer kernel needs to apply a folded norm; input == nullptr: no norm.
struct FoldedRmsNorm {
  const __nv_bfloat16* input = nullptr;  // [tokens, hidden] the raw rows the projection read
  int hidden = 0;                        // multiple of 8
  float eps = 1e-6f;
};

// matrix[r, c] = bf16(matrix[r, c] * weight[c]) for a row-major [rows, cols] matrix (cols a
// multiple of 8, both 16-byte aligned).
cudaError_t launch_fold_norm_weight(__nv_bfloat16* matrix, int rows, int cols, const __nv_bfloat16* weight,
                                    cudaStream_t stream);

// Host-side check of a FoldedRmsNorm a launcher was given (null input: valid, nothing to apply).
inline bool valid_folded_norm(const FoldedRmsNorm& norm) {
  if (!norm.input) return true;
  return norm.hidden >= 8 && norm.hidden % 8 == 0 && aligned16(norm.input) && norm.eps >= 0.0f;
}

#ifdef __CUDACC__
// Sum over the block; every thread gets the total. `scratch` holds one float per warp; every
// thread of the block must call it.
__device__ inline float block_sum(float value, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? scratch[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (lane == 0) scratch[0] = value;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return total;
}

// 1/sqrt(mean(row^2) + eps) in fp32 over `hidden` bf16 values, computed by the whole block (every
// thread calls it; 16-byte loads strided over the block, typically an L2 hit).
__device__ inline float row_inverse_rms(const __nv_bfloat16* row, int hidden, float eps, float* scratch) {
  const uint4* vectors = reinterpret_cast<const uint4*>(row);
  float sum_of_squares = 0.0f;
  for (int v = threadIdx.x; v < hidden / 8; v += blockDim.x) {
    const uint4 bits = vectors[v];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 value = __bfloat1622float2(pairs[j]);
      sum_of_squares += value.x * value.x + value.y * value.y;
    }
  }
  return rsqrtf(block_sum(sum_of_squares, scratch) / static_cast<float>(hidden) + eps);
}
#endif

}  // namespace deepfuse::kernels
