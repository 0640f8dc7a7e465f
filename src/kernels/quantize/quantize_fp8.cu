#include <cuda_fp8.h>

#include "deepfuse/kernels/quantize_fp8.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

// One block per row: the row's absmax, then every element divided by the scale and rounded.
// Divisions are IEEE round-to-nearest (__fdiv_rn), as the host's, whatever the compiler flags.
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const __nv_bfloat16* in, uint8_t* out, float* scales,
                                                                 int columns) {
  const size_t row_start = static_cast<size_t>(blockIdx.x) * columns;
  const __nv_bfloat16* row = in + row_start;
  float absmax = 0.0f;
  for (int i = threadIdx.x; i < columns; i += kThreads) absmax = fmaxf(absmax, fabsf(__bfloat162float(row[i])));
  for (int offset = 16; offset > 0; offset /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, offset));
  __shared__ float warp_max[kThreads / 32];
  __shared__ float row_scale;
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = absmax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    row_scale = m > 0.0f ? __fdiv_rn(m, kE4m3Max) : 1.0f;
    scales[blockIdx.x] = row_scale;
  }
  __syncthreads();
  const float scale = row_scale;
  for (int i = threadIdx.x; i < columns; i += kThreads)
    out[row_start + i] = __nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(row[i]), scale), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace

cudaError_t quantize_rows_fp8(const __nv_bfloat16* in, uint8_t* out, float* scales, int rows, int columns,
                              cudaStream_t stream) {
  if (!in || !out || !scales || rows < 1 || columns < 1) return cudaErrorInvalidValue;
  quantize_rows_kernel<<<rows, kThreads, 0, stream>>>(in, out, scales, columns);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
