#include <cuda_fp8.h>

#include "deepfuse/kernels/quantize_fp8.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

// The largest |x| over what the block's threads saw, in every thread.
__device__ float block_absmax(float absmax) {
  for (int offset = 16; offset > 0; offset /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  __shared__ float warp_max[kThreads / 32];
  __shared__ float result;
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = absmax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    result = m;
  }
  __syncthreads();
  return result;
}

// absmax / 448, 1 for all zeros. Divisions are IEEE round-to-nearest (__fdiv_rn), as the host's,
// whatever the compiler flags.
__device__ float scale_of(float absmax) { return absmax > 0.0f ? __fdiv_rn(absmax, kE4m3Max) : 1.0f; }

__device__ uint8_t e4m3(float x, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}
__device__ uint8_t e4m3(__nv_bfloat16 x, float scale) { return e4m3(__bfloat162float(x), scale); }

// 8 bf16 values of a 16-byte load, as floats.
__device__ void load8(const __nv_bfloat16* row, int chunk, float (&v)[8]) {
  const uint4 bits = reinterpret_cast<const uint4*>(row)[chunk];
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}

// One block per row: the row's absmax, then every element divided by the scale and rounded.
// kVector: 8 elements per 16-byte load and 8-byte store (columns a multiple of 8, aligned rows),
// which the per-token quantization of activations before FP8 GEMMs needs to stay a small fraction
// of the GEMM (docs/kernels/fp8.md); the same bits.
template <bool kVector>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const __nv_bfloat16* in, uint8_t* out, float* scales,
                                                                 int columns) {
  const size_t row_start = static_cast<size_t>(blockIdx.x) * columns;
  const __nv_bfloat16* row = in + row_start;
  float absmax = 0.0f;
  if constexpr (kVector) {
    for (int c = threadIdx.x; c < columns / 8; c += kThreads) {
      float v[8];
      load8(row, c, v);
      for (int j = 0; j < 8; ++j) absmax = fmaxf(absmax, fabsf(v[j]));
    }
  } else {
    for (int i = threadIdx.x; i < columns; i += kThreads) absmax = fmaxf(absmax, fabsf(__bfloat162float(row[i])));
  }
  const float scale = scale_of(block_absmax(absmax));
  if (threadIdx.x == 0) scales[blockIdx.x] = scale;
  if constexpr (kVector) {
    for (int c = threadIdx.x; c < columns / 8; c += kThreads) {
      float v[8];
      load8(row, c, v);
      uint8_t bytes[8];
      for (int j = 0; j < 8; ++j) bytes[j] = e4m3(v[j], scale);
      reinterpret_cast<uint2*>(out + row_start)[c] = *reinterpret_cast<const uint2*>(bytes);
    }
  } else {
    for (int i = threadIdx.x; i < columns; i += kThreads) out[row_start + i] = e4m3(row[i], scale);
  }
}

// One block per side x side weight block (blockIdx.x its column of blocks, blockIdx.y its row).
__global__ void __launch_bounds__(kThreads) quantize_blocks_kernel(const __nv_bfloat16* in, uint8_t* out,
                                                                   float* scales, int columns, int side) {
  const size_t first = static_cast<size_t>(blockIdx.y) * side * columns + static_cast<size_t>(blockIdx.x) * side;
  auto at = [&](int e) { return first + static_cast<size_t>(e / side) * columns + e % side; };
  float absmax = 0.0f;
  for (int e = threadIdx.x; e < side * side; e += kThreads) absmax = fmaxf(absmax, fabsf(__bfloat162float(in[at(e)])));
  const float scale = scale_of(block_absmax(absmax));
  if (threadIdx.x == 0) scales[static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x] = scale;
  for (int e = threadIdx.x; e < side * side; e += kThreads) out[at(e)] = e4m3(in[at(e)], scale);
}

}  // namespace

cudaError_t quantize_rows_fp8(const __nv_bfloat16* in, uint8_t* out, float* scales, int rows, int columns,
                              cudaStream_t stream) {
  if (!in || !out || !scales || rows < 1 || columns < 1) return cudaErrorInvalidValue;
  const bool vector = columns % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(out) % 8 == 0;
  if (vector)
    quantize_rows_kernel<true><<<rows, kThreads, 0, stream>>>(in, out, scales, columns);
  else
    quantize_rows_kernel<false><<<rows, kThreads, 0, stream>>>(in, out, scales, columns);
  return cudaGetLastError();
}

cudaError_t quantize_blocks_fp8(const __nv_bfloat16* in, uint8_t* out, float* scales, int rows, int columns, int side,
                                cudaStream_t stream) {
  if (!in || !out || !scales || side < 1 || rows < side || columns < side || rows % side || columns % side ||
      rows / side > 65535)
    return cudaErrorInvalidValue;
  quantize_blocks_kernel<<<dim3(columns / side, rows / side), kThreads, 0, stream>>>(in, out, scales, columns, side);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
