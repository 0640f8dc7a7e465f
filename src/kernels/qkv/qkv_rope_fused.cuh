// The attention block's front half in one launch for decode: input RMSNorm, the merged QKV
// projection (+ Qwen2 bias), RoPE on q and k, q written out, k and v appended to the paged cache.
// Design notes open qkv_rope_fused.cu. Prefill (more than kQkvFusedMaxTokens tokens) takes the
// unfused path: rms_norm, a cuBLASLt GEMM, rope_kv_append.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention/paged_kv.cuh"

namespace deepfuse::kernels {

inline constexpr int kQkvFusedMaxTokens = 16;

struct QkvRopeFusedParams {
  const __nv_bfloat16* x = nullptr;            // [tokens, hidden] residual stream (not normalised)
  float norm_eps = 1e-6f;                      // the input RMSNorm's (its weight is in the packed rows)
  const uint4* weights = nullptr;              // merged [q | k | v] rows, packed by pack_qkv_weights
  void* workspace = nullptr;                   // qkv_rope_fused_workspace_bytes(...), zeroed once; left zero
  const __nv_bfloat16* bias = nullptr;         // [(q_heads + 2 * kv_heads) * head_dim] or null
  const float* inv_freq = nullptr;             // [head_dim / 2]
  const int32_t* positions = nullptr;          // [tokens]; < 0: padded slot (q row zeroed, cache untouched)
  const int32_t* sequences = nullptr;          // [tokens] block-table row of each token
  __nv_bfloat16* q_out = nullptr;              // [tokens, q_heads, head_dim] rotated queries
  PagedKv kv;                                  // kv.kv_heads, kv.head_dim (64 or 128)
  int tokens = 0;                              // 1 .. kQkvFusedMaxTokens
  int hidden = 0;                              // multiple of 64
  int q_heads = 0;
};

// Bytes of the workspace (fp32 tile sums and counters). Launches sharing one must not overlap.
size_t qkv_rope_fused_workspace_bytes(int q_heads, int kv_heads, int head_dim);

// cudaErrorInvalidValue on bad params. Not bitwise deterministic: partial sums of a tile shared
// by several warps are added with fp32 atomics, in any order.
cudaError_t launch_qkv_rope_fused(const QkvRopeFusedParams& params, cudaStream_t stream);

// Row-major [rows, hidden] bf16 (q_proj, k_proj, v_proj rows stacked) times the input RMSNorm
// weight (per column) -> the kernel's layout: pack_rotary_rows_fragments (kernels/gemv/packing.cuh),
// rotate-half pairs of each head in one 16-row tile. Same byte count as the input.
cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, const __nv_bfloat16* norm_weight, uint4* packed, int rows,
                             int hidden, int head_dim, cudaStream_t stream);

}  // namespace deepfuse::kernels
