// L2 eviction priorities for bytes a decode step reads once: the weights of every streaming kernel
// and the KV cache pages. Marked evict-first, they leave in L2 what the step reuses (partial sums,
// activations, the residual stream). Measured in docs/kernels/swiglu_fused.md ("Streamed weights
// marked evict-first") and docs/kernels/decode_attention.md ("K/V pages marked evict-first").
#pragma once

#include <cstdint>

namespace deepfuse::kernels {

// An L2 cache policy (createpolicy): every access made with it is evicted before normal lines.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared (shared-space address), bypassing L1, under an L2 cache policy;
// valid = false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void copy16_async_with_policy(unsigned shared, const void* global, uint64_t policy,
                                                         bool valid = true) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(shared), "l"(global),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}

}  // namespace deepfuse::kernels
