// The weight layout of the stream-K GEMV (streamk_gemv.cuh): row-major [rows, inner] bf16 ->
// for each 16-row tile, for each 16-column k-step, the 32 lanes x 16 bytes an mma.m16n8k16 A
// operand wants (kernels/mlp/fragment.cuh). Same byte count as the input. Host-callable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace deepfuse::kernels {

// rows and inner multiples of 16.
cudaError_t pack_rows_fragments(const __nv_bfloat16* weights, uint4* packed, int rows, int inner, cudaStream_t stream);

// The same for rows that are heads of head_dim rows to be rotated by RoPE (rotate-half pairs
// (i, i + head_dim/2)): tile j of a head holds rows 8j..8j+7 on top and head_dim/2 + 8j..+7
// below, so every pair lands in one tile and one thread's accumulators. Every column k is also
// scaled by column_scale[k] (an RMSNorm weight folded in; fp32 product rounded once to bf16).
cudaError_t pack_rotary_rows_fragments(const __nv_bfloat16* weights, const __nv_bfloat16* column_scale, uint4* packed,
                                       int rows, int inner, int head_dim, cudaStream_t stream);

}  // namespace deepfuse::kernels
