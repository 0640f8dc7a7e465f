// RMSNorm, and the residual add + RMSNorm that joins two transformer blocks:
//   add_rms_norm:  residual = bf16(residual + x);  out = bf16(residual / rms(residual) * weight)
//   rms_norm:      out = bf16(residual / rms(residual) * weight)
// with rms(r) = sqrt(mean(r^2) + eps) in fp32. The residual is rounded to bf16 before its norm
// is taken, as Hugging Face does in bf16 (the sum lands in a bf16 tensor, then LlamaRMSNorm
// reads that tensor), so the normalised row and the stored residual agree.
//
// The two numbers: per row, 2 * hidden bytes read per input (residual, x) and written per output
// (out, residual), 4 FLOPs per element; at hidden 4096 a decode row is 16-24 KB. Pure bandwidth
// and latency: one pass over HBM, no re-read.
//
// Tiling: one block per row. The row is split into 16-byte vectors (8 bf16); thread t owns
// vectors t, t + blockDim, t + 2 blockDim, t + 3 blockDim (coalesced) and keeps them in registers
// between the two passes (sum of squares, then scale), so HBM sees the row once. Four vectors
// per thread and up to 1024 threads hold a row of up to 32768 values; the launcher picks the
// block size so small rows do not leave most threads idle (at least 128 threads when the row has
// that many vectors). The sum of squares is reduced in fp32 with warp shuffles, then across the
// block's warps through shared memory.
#include "deepfuse/kernels/rms_norm.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/common/pointer_checks.hpp"
#include "kernels/common/row_rms.cuh"

namespace deepfuse::kernels {
namespace {

constexpr int kVectorsPerThread = 4;
constexpr int kMaxThreads = 1024;
constexpr int kMaxHidden = kVectorsPerThread * kMaxThreads * 8;

__device__ __forceinline__ float2 unpack(uint32_t bits) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}
__device__ __forceinline__ uint32_t pack(float a, float b) {
  const __nv_bfloat162 packed = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&packed);
}

template <bool kAdd>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float scratch[32];
  const int vectors = p.hidden / 8;
  const size_t row_offset = static_cast<size_t>(blockIdx.x) * p.hidden;
  uint4* residual = reinterpret_cast<uint4*>(p.residual + row_offset);
  const uint4* x = kAdd && p.x ? reinterpret_cast<const uint4*>(p.x + row_offset) : nullptr;

  uint4 row[kVectorsPerThread];  // this thread's vectors of the (updated) residual row
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= vectors) continue;
    row[i] = residual[v];
    if (x) {
      const uint4 add = x[v];
      uint32_t* r = &row[i].x;
      const uint32_t* a = &add.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 lhs = unpack(r[j]), rhs = unpack(a[j]);
        r[j] = pack(lhs.x + rhs.x, lhs.y + rhs.y);  // the bf16 residual HF stores
      }
      residual[v] = row[i];
    }
    const uint32_t* r = &row[i].x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 value = unpack(r[j]);
      sum_of_squares += value.x * value.x + value.y * value.y;
    }
  }

  const float total = block_sum(sum_of_squares, scratch);
  const float inverse_rms = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);

  const uint4* weight = reinterpret_cast<const uint4*>(p.weight);
  uint4* out = reinterpret_cast<uint4*>(p.out + row_offset);
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = threadIdx.x + i * blockDim.x;
    if (v >= vectors) continue;
    const uint4 w = __ldg(weight + v);
    const uint32_t* r = &row[i].x;
    const uint32_t* ws = &w.x;
    uint4 result;
    uint32_t* o = &result.x;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 value = unpack(r[j]), scale = unpack(ws[j]);
      o[j] = pack(value.x * inverse_rms * scale.x, value.y * inverse_rms * scale.y);
    }
    out[v] = result;
  }
}

template <bool kAdd>
cudaError_t launch(const RmsNormParams& p, cudaStream_t stream) {
  const bool with_x = kAdd && p.x != nullptr;
  const size_t bytes = static_cast<size_t>(p.rows) * p.hidden * sizeof(__nv_bfloat16);
  if (!p.residual || !p.weight || !p.out || p.rows < 1 || p.hidden < 8 || p.hidden % 8 != 0 ||
      p.hidden > kMaxHidden || !(p.eps >= 0.0f))
    return cudaErrorInvalidValue;
  if (!aligned16(p.residual) || !aligned16(p.weight) || !aligned16(p.out) || (with_x && !aligned16(p.x)))
    return cudaErrorInvalidValue;
  if (overlaps(p.out, bytes, p.residual, bytes) || (with_x && overlaps(p.out, bytes, p.x, bytes)))
    return cudaErrorInvalidValue;

  const int vectors = p.hidden / 8;
  auto round_up_to_warp = [](int n) { return (n + 31) / 32 * 32; };
  const int needed = round_up_to_warp((vectors + kVectorsPerThread - 1) / kVectorsPerThread);
  const int threads = std::min(kMaxThreads, std::max(needed, std::min(128, round_up_to_warp(vectors))));
  rms_norm_kernel<kAdd><<<p.rows, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNormParams& params, cudaStream_t stream) { return launch<false>(params, stream); }

cudaError_t launch_add_rms_norm(const RmsNormParams& params, cudaStream_t stream) {
  return launch<true>(params, stream);
}

}  // namespace deepfuse::kernels
