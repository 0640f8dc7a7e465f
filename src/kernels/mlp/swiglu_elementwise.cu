#include "deepfuse/kernels/swiglu_elementwise.hpp"

#include <algorithm>
#include <cstdint>

#include "kernels/mlp/silu.cuh"
#include "kernels/common/row_rms.cuh"

namespace deepfuse::kernels {
namespace {

int blocks_for(size_t work_items, int threads) {
  return static_cast<int>(std::min<size_t>((work_items + threads - 1) / threads, 65535 * 8));
}

// silu(scale g) * (scale u) for 8 values in 16-byte vectors; scale 1 (exact) without a norm.
__device__ __forceinline__ uint4 silu_and_mul8(const uint4& gate_bits, const uint4& up_bits, float scale) {
  const auto* gate = reinterpret_cast<const __nv_bfloat162*>(&gate_bits);
  const auto* up = reinterpret_cast<const __nv_bfloat162*>(&up_bits);
  uint4 out_bits;
  auto* out = reinterpret_cast<__nv_bfloat162*>(&out_bits);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 g = __bfloat1622float2(gate[i]), u = __bfloat1622float2(up[i]);
    out[i] = __floats2bfloat162_rn(silu(scale * g.x) * (scale * u.x), silu(scale * g.y) * (scale * u.y));
  }
  return out_bits;
}

// One thread per 8 intermediate values: two 16-byte loads, one 16-byte store.
__global__ void silu_and_mul_kernel(const __nv_bfloat16* gate_up, __nv_bfloat16* act, int tokens,
                                    int intermediate) {
  const int vectors_per_row = intermediate / 8;
  const size_t total = static_cast<size_t>(tokens) * vectors_per_row;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t token = index / vectors_per_row, vector = index % vectors_per_row;
    const __nv_bfloat16* row = gate_up + token * 2 * intermediate;
    const uint4 gate_bits = reinterpret_cast<const uint4*>(row)[vector];
    const uint4 up_bits = reinterpret_cast<const uint4*>(row + intermediate)[vector];
    reinterpret_cast<uint4*>(act + token * intermediate)[vector] = silu_and_mul8(gate_bits, up_bits, 1.0f);
  }
}

// The folded-norm form: block row blockIdx.y is token t, its gridDim.x blocks stride over the
// token's vectors. Each thread's first gate and up loads are issued before the block reduces
// 1/rms(x[t]), so the two L2 round trips overlap.
__global__ void silu_and_mul_normalized_kernel(const __nv_bfloat16* gate_up, __nv_bfloat16* act, int intermediate,
                                               FoldedRmsNorm norm) {
  __shared__ float scratch[32];
  const size_t token = blockIdx.y;
  const int vectors = intermediate / 8, stride = gridDim.x * blockDim.x;
  const uint4* gate = reinterpret_cast<const uint4*>(gate_up + token * 2 * intermediate);
  const uint4* up = gate + vectors;
  uint4* out = reinterpret_cast<uint4*>(act + token * intermediate);
  int vector = blockIdx.x * blockDim.x + threadIdx.x;
  uint4 gate_bits{}, up_bits{};
  if (vector < vectors) gate_bits = gate[vector], up_bits = up[vector];
  const float inverse_rms = row_inverse_rms(norm.input + token * norm.hidden, norm.hidden, norm.eps, scratch);
  while (vector < vectors) {
    out[vector] = silu_and_mul8(gate_bits, up_bits, inverse_rms);
    vector += stride;
    if (vector < vectors) gate_bits = gate[vector], up_bits = up[vector];
  }
}

__global__ void silu_kernel(__nv_bfloat16* values, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    values[i] = __float2bfloat16(silu(__bfloat162float(values[i])));
}

__global__ void multiply_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) * __bfloat162float(b[i]));
}

__global__ void add_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

}  // namespace

cudaError_t silu_and_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* act, int tokens, int intermediate,
                         cudaStream_t stream, const FoldedRmsNorm& norm) {
  if (intermediate % 8 != 0 || tokens < 1 || !valid_folded_norm(norm)) return cudaErrorInvalidValue;
  if (norm.input) {
    // Enough blocks to fill a large GPU at decode sizes, one per token at prefill sizes (each
    // block re-reads its token's x row for 1/rms; docs/runtime.md, "Norms folded into the unfused
    // paths' weights").
    constexpr int kThreads = 256, kMaxTokens = 65535, kTargetBlocks = 264;
    if (tokens > kMaxTokens) return cudaErrorInvalidValue;
    const int blocks_for_row = (intermediate / 8 + kThreads - 1) / kThreads;
    const int blocks_per_token = std::clamp((kTargetBlocks + tokens - 1) / tokens, 1, blocks_for_row);
    const dim3 grid(blocks_per_token, tokens);
    silu_and_mul_normalized_kernel<<<grid, kThreads, 0, stream>>>(gate_up, act, intermediate, norm);
    return cudaGetLastError();
  }
  const size_t vectors = static_cast<size_t>(tokens) * (intermediate / 8);
  silu_and_mul_kernel<<<blocks_for(vectors, 256), 256, 0, stream>>>(gate_up, act, tokens, intermediate);
  return cudaGetLastError();
}

cudaError_t silu_inplace(__nv_bfloat16* values, size_t count, cudaStream_t stream) {
  silu_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(values, count);
  return cudaGetLastError();
}

cudaError_t multiply(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                     cudaStream_t stream) {
  multiply_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(a, b, out, count);
  return cudaGetLastError();
}

cudaError_t add(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                cudaStream_t stream) {
  add_kernel<<<blocks_for(count, 256), 256, 0, stream>>>(a, b, out, count);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
