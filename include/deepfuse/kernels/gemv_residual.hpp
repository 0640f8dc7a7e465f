// y = x · W^T (+ bias) + residual for decode (up to 32 tokens), in one launch: the attention
// block's output projection with the residual add, on the cluster GEMV weight stream
// (cluster_gemv.cuh). Prefill and larger batches use cuBLASLt with the residual in its epilogue.
// With a norm weight, y = rms_norm(x) · W^T: the FP8 MLP's gate_up projection.
// Weights in bf16 or FP8 (e4m3 with per-row or 128x128-block fp32 scales; docs/kernels/fp8.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "deepfuse/weight_format.hpp"

namespace deepfuse::kernels {

inline constexpr int kGemvResidualMaxTokens = 32;

// Why launch_gemv_residual refuses `tokens` rows of x against a [rows, inner] weight (empty: it runs
// them; it also needs a GPU that allows cluster_gemv.hpp's shared memory): the launcher's own
// check, which the scheduler plans by.
inline std::string gemv_residual_unsupported(int tokens, int rows, int inner,
                                             WeightFormat format = WeightFormat::bf16) {
  if (tokens < 1 || tokens > kGemvResidualMaxTokens)
    return "takes at most " + std::to_string(kGemvResidualMaxTokens) + " tokens";
  if (rows < 64 || rows % 64 != 0 || inner < 64 || inner % 64 != 0)
    return "needs rows and inner sizes that are multiples of 64";
  const int block = format_info(format).scale_block;
  if (block > 0 && (rows % block != 0 || inner % block != 0))
    return "needs rows and inner sizes that are multiples of the " + std::to_string(block) + "-wide scale blocks";
  return "";
}

struct GemvResidualParams {
  const __nv_bfloat16* x = nullptr;         // [tokens, inner]; must not alias y
  const uint4* weights = nullptr;           // [rows, inner] packed by pack_rows_fragments (bf16) or
                                            // pack_rows_fragments_fp8 (FP8 formats)
  WeightFormat format = WeightFormat::bf16;
  const float* scales = nullptr;            // the format's fp32 scales (LinearWeight::scales); null for bf16
  const __nv_bfloat16* norm_weight = nullptr;  // [inner] or null: y = rms_norm(x) · W^T (x ∘ w staged)
  float norm_eps = 1e-6f;
  const __nv_bfloat16* bias = nullptr;      // [rows] or null
  const __nv_bfloat16* residual = nullptr;  // [tokens, rows] or null; may alias y
  __nv_bfloat16* y = nullptr;               // [tokens, rows]
  int tokens = 0;                           // 1 .. kGemvResidualMaxTokens
  int rows = 0;                             // multiple of 64
  int inner = 0;                            // multiple of 64
  // [tokens, rows] fp32 or null (needs residual): a sum a kernel before left for the residual
  // (the fused MLP's defer_sum). The residual used is bf16(residual + pending), as that kernel
  // would have written it; each pending value is zeroed once read, ready for its producer.
  float* pending = nullptr;
};

// cudaErrorInvalidValue on bad params; cudaErrorNotSupported when the device cannot run the
// shape (no clusters and an inner dimension too large for one block's shared memory).
cudaError_t launch_gemv_residual(const GemvResidualParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
