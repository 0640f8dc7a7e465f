// The weight layout of the cluster GEMV stream (cluster_gemv.cuh): row-major [rows, inner] bf16
// -> for each 16-row tile, for each 16-column k-step, the 32 lanes x 16 bytes an mma.m16n8k16 A
// operand wants (kernels/common/fragment.cuh). Host-callable; no device code here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace deepfuse::kernels {

// Same byte count as the input; rows and inner multiples of 16.
cudaError_t pack_rows_fragments(const __nv_bfloat16* weights, uint4* packed, int rows, int inner, cudaStream_t stream);

}  // namespace deepfuse::kernels
