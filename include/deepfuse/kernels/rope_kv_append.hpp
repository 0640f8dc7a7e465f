// The epilogue of the QKV projection: optional bias, rotary position embedding on q and k
// (Hugging Face rotate-half layout: pairs (i, i + head_dim/2)), q written out rotated, k and v
// appended to the paged KV cache at each token's position. One launch for all tokens of a step,
// decode (one token per sequence) and prefill chunks alike.
// CPU references: reference::apply_rope, rope_inverse_frequencies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "deepfuse/kernels/paged_kv.hpp"
#include "deepfuse/kernels/folded_norm.hpp"

namespace deepfuse::kernels {

struct RopeKvAppendParams {
  const __nv_bfloat16* qkv = nullptr;       // [tokens, (q_heads + 2*kv_heads) * head_dim]: q | k | v
  const __nv_bfloat16* qkv_bias = nullptr;  // [(q_heads + 2*kv_heads) * head_dim] or null (Qwen2 has one)
  const float* inv_freq = nullptr;          // [head_dim / 2] (device), from rope_inverse_frequencies
  const int32_t* positions = nullptr;       // [tokens] position of each token; < 0: padded slot, skipped
  const int32_t* sequences = nullptr;       // [tokens] row of the block table each token belongs to
  __nv_bfloat16* q_out = nullptr;           // [tokens, q_heads, head_dim] rotated queries (padded: zeros)
  PagedKv kv;                               // one layer's cache; kv.kv_heads, kv.head_dim set
  int tokens = 0;
  int q_heads = 0;
  // The input RMSNorm folded into qkv's weights (input = the residual rows the GEMM read): each
  // token's values are scaled by 1/rms(input row) before the bias. At most 65535 tokens then.
  FoldedRmsNorm input_norm;
};

// Values are computed in fp32 (scaled by a folded norm's 1/rms, bias added, then rotated with
// sincosf(position * inv_freq)) and rounded to bf16 once. cudaErrorInvalidValue on bad sizes
// (head_dim must be even and a multiple of 8) or a bad folded norm.
cudaError_t launch_rope_kv_append(const RopeKvAppendParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
