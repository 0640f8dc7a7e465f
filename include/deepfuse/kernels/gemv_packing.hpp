// The weight layout of the cluster GEMV stream (cluster_gemv.cuh): row-major [rows, inner] bf16
// -> for each 16-row tile, for each 16-column k-step, the 32 lanes x 16 bytes an mma.m16n8k16 A
// operand wants (kernels/common/fragment.cuh). Host-callable; no device code here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

// Same byte count as the input; rows and inner multiples of 16.
cudaError_t pack_rows_fragments(const __nv_bfloat16* weights, uint4* packed, int rows, int inner, cudaStream_t stream);

// Row-major [rows, inner] e4m3 bytes -> the FP8 stream's layout: for each 16-row tile, for each
// 32-column pair of k-steps, 32 lanes x 16 bytes (each lane's 8 A values of the first k-step, then
// of the second; fragment.cuh). Same byte count as the input; rows a multiple of 16, inner of 32.
cudaError_t pack_rows_fragments_fp8(const uint8_t* weights, uint4* packed, int rows, int inner, cudaStream_t stream);

}  // namespace deepfuse::kernels
