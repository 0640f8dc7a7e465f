// The one rounding rule for an fp32 sum landing on the bf16 residual stream: bf16(sum + residual),
// a single rounding. The fused MLP's finish writes y this way, and the kernels that finish its
// deferred sum instead (the fused QKV's x staging, the o_proj GEMV's residual) must produce the
// same bits, so all three call these.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace deepfuse::kernels {

__device__ __forceinline__ float residual_sum(float sum, float residual) {
  return __bfloat162float(__float2bfloat16_rn(sum + residual));
}

// Two consecutive columns: `residual` holds their bf16 pair; returns the bf16 pair of the sums.
__device__ __forceinline__ uint32_t residual_sum_pair(float sum0, float sum1, uint32_t residual) {
  const float2 r = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&residual));
  const __nv_bfloat162 rounded = __floats2bfloat162_rn(sum0 + r.x, sum1 + r.y);
  return *reinterpret_cast<const uint32_t*>(&rounded);
}

}  // namespace deepfuse::kernels
