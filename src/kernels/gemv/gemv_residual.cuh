// y = x · W^T (+ bias) + residual for decode (up to 16 tokens), in one launch: the attention
// block's output projection with the residual add, on the stream-K GEMV weight stream
// (streamk_gemv.cuh). Prefill and larger batches use cuBLASLt with the residual in its epilogue.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

inline constexpr int kGemvResidualMaxTokens = 16;

struct GemvResidualParams {
  const __nv_bfloat16* x = nullptr;         // [tokens, inner]; must not alias y
  const uint4* weights = nullptr;           // [rows, inner] packed by pack_rows_fragments
  const __nv_bfloat16* bias = nullptr;      // [rows] or null
  const __nv_bfloat16* residual = nullptr;  // [tokens, rows] or null; may alias y
  __nv_bfloat16* y = nullptr;               // [tokens, rows]
  void* workspace = nullptr;                // gemv_residual_workspace_bytes(rows), zeroed once; left zero
  int tokens = 0;                           // 1 .. kGemvResidualMaxTokens
  int rows = 0;                             // multiple of 16
  int inner = 0;                            // multiple of 16
};

// Bytes of the workspace (fp32 tile sums and counters). Launches sharing one must not overlap.
size_t gemv_residual_workspace_bytes(int rows);

// cudaErrorInvalidValue on bad params. Results are not bitwise deterministic: the fp32 partial
// sums of a tile shared by several warps are added with atomics, in any order.
cudaError_t launch_gemv_residual(const GemvResidualParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
