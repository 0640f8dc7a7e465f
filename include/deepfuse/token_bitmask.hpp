// A set of allowed token ids over a vocabulary, as constrained decoding (structured output)
// passes it to the samplers: bit id % 32 of 32-bit word id / 32 is set when `id` may be sampled
// (xgrammar's layout, so its matcher fills the words directly). A sampler treats a left-out id's
// logit as -inf before every other processor (reference::apply_token_bitmask, and the GPU
// sampling kernel's `token_bitmask`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse {

// 32-bit words of one vocabulary's mask.
__host__ __device__ constexpr int token_bitmask_words(int vocab) { return (vocab + 31) / 32; }

__host__ __device__ inline bool token_allowed(const uint32_t* mask, int id) {
  return (mask[id >> 5] >> (id & 31)) & 1u;
}

}  // namespace deepfuse
