// The attention block's front half in one launch for decode: input RMSNorm, the merged QKV
// projection (+ Qwen2 bias), RoPE on q and k, q written out, k and v appended to the paged cache.
// Design notes open qkv_rope_fused.cu. Prefill (more than kQkvFusedMaxTokens tokens) takes the
// unfused path: rms_norm, a cuBLASLt GEMM, rope_kv_append.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "deepfuse/kernels/paged_kv.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::kernels {

inline constexpr int kQkvFusedMaxTokens = 32;

// The sizes launch_qkv_rope_fused takes.
struct QkvRopeFusedShape {
  int tokens = 0, hidden = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
};

// Why launch_qkv_rope_fused refuses `shape` (empty: it runs it; it also needs a GPU that allows
// cluster_gemv.hpp's shared memory): the launcher's own check, which the scheduler plans by.
inline std::string qkv_rope_fused_unsupported(const QkvRopeFusedShape& s, WeightFormat format = WeightFormat::bf16) {
  if (s.tokens < 1 || s.tokens > kQkvFusedMaxTokens)
    return "takes at most " + std::to_string(kQkvFusedMaxTokens) + " tokens";
  if (s.head_dim != 64 && s.head_dim != 128) return "needs head_dim 64 or 128";
  if (s.hidden < 64 || s.hidden % 64 != 0) return "needs a hidden size that is a multiple of 64";
  if (s.q_heads < 1 || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0) return "needs q_heads a multiple of kv_heads";
  // Scale blocks: q, k and v rows (merged) each a whole number of blocks.
  const int block = format_info(format).scale_block;
  if (block > 0 && ((s.q_heads * s.head_dim) % block != 0 || (s.kv_heads * s.head_dim) % block != 0))
    return "needs q and kv sizes that are multiples of the " + std::to_string(block) + "-row scale blocks";
  if (block > 0 && s.hidden % block != 0)
    return "needs a hidden size that is a multiple of the " + std::to_string(block) + "-wide scale blocks";
  return "";
}

struct QkvRopeFusedParams {
  const __nv_bfloat16* x = nullptr;            // [tokens, hidden] residual stream (not normalised)
  const __nv_bfloat16* norm_weight = nullptr;  // [hidden] the block's input RMSNorm weight
  float norm_eps = 1e-6f;
  const uint4* weights = nullptr;              // merged [q | k | v] rows, packed by pack_qkv_weights
                                               // (bf16) or pack_rows_fragments_fp8 (FP8 formats)
  WeightFormat format = WeightFormat::bf16;
  const float* scales = nullptr;               // the format's fp32 scales (LinearWeight::scales); null for bf16
  const __nv_bfloat16* bias = nullptr;         // [(q_heads + 2 * kv_heads) * head_dim] or null
  const float* inv_freq = nullptr;             // [head_dim / 2]
  const int32_t* positions = nullptr;          // [tokens]; < 0: padded slot (q row zeroed, cache untouched)
  const int32_t* sequences = nullptr;          // [tokens] block-table row of each token
  __nv_bfloat16* q_out = nullptr;              // [tokens, q_heads, head_dim] rotated queries
  PagedKv kv;                                  // kv.kv_heads, kv.head_dim (64 or 128)
  int tokens = 0;                              // 1 .. kQkvFusedMaxTokens
  int hidden = 0;                              // multiple of 64
  int q_heads = 0;
  // [tokens, hidden] fp32 or null: the previous layer's fused MLP sum (defer_sum), not yet in x;
  // the kernel reads x + pending (rounded to bf16) and leaves both as they are.
  const float* pending = nullptr;
};

// cudaErrorInvalidValue on bad params; cudaErrorNotSupported when this device cannot run the
// shape (no clusters and a hidden size too large for one block's shared memory): the caller
// then uses the unfused path.
cudaError_t launch_qkv_rope_fused(const QkvRopeFusedParams& params, cudaStream_t stream);

// Row-major [rows, hidden] bf16 (q_proj, k_proj, v_proj rows stacked) -> the fragment-packed
// layout: for each 16-row tile, for each 16-column k-step, 32 lanes x 16 bytes (see
// kernels/common/fragment.cuh). Same byte count as the input; rows and hidden multiples of 16.
cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, uint4* packed, int rows, int hidden, cudaStream_t stream);

}  // namespace deepfuse::kernels
