// Causal attention for prefill (and chunked prefill): q_len query tokens of one sequence at
// positions q_start .. q_start + q_len - 1 attend to keys 0 .. their own position, read from the
// paged KV cache (the chunk's own keys were appended by rope_kv_append first). Tensor cores
// (mma.sync m16n8k16 bf16, fp32 accumulation), online softmax; GQA; Mistral sliding window;
// head_dim 64 and 128. CPU reference: reference::attention_prefill (attention_decode per query
// position). Design and speed: docs/kernels/prefill_attention.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "deepfuse/kernels/paged_kv.hpp"

namespace deepfuse::kernels {

struct PrefillAttentionParams {
  const __nv_bfloat16* q = nullptr;  // [q_len, q_heads, head_dim], rotated
  __nv_bfloat16* out = nullptr;      // [q_len, q_heads, head_dim]
  PagedKv kv;                        // the sequence's block table row is `sequence`
  int sequence = 0;
  int q_start = 0;                   // position of the first query token
  int q_len = 0;
  int q_heads = 0;
  float scale = 0.0f;
  int sliding_window = 0;            // > 0: query at position p sees keys p - window + 1 .. p
};

// cudaErrorInvalidValue for: a null or not 16-byte aligned q, out, k_pages or v_pages; a null block
// table; head_dim other than 64/128; q_heads not a positive multiple of kv_heads; q_len < 1;
// negative q_start, sequence or window; a block table row shorter than q_start + q_len keys;
// q_len above 4,194,240 (grid) or positions within 128 of INT_MAX; scale not finite and > 0.
cudaError_t launch_prefill_attention(const PrefillAttentionParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
