// Packing for the stream-K GEMV weight stream (streamk_gemv.cuh).
#include "kernels/gemv/packing.cuh"

#include <cuda_bf16.h>

#include <cstdlib>

#include "kernels/gemv/streamk_gemv.cuh"
#include "kernels/mlp/fragment.cuh"

namespace deepfuse::kernels {
namespace {

// The source row of packed row `row`: the identity, or with rotation pairs (rotary_dim > 0) tile
// j of each head of rotary_dim rows holds rows 8j..8j+7 on top and rotary_dim/2 + 8j.. below.
__device__ int source_row(int row, int rotary_dim) {
  if (rotary_dim == 0) return row;
  const int head = row / rotary_dim, within = row % rotary_dim;
  const int tile = within / 16, r = within % 16;
  return head * rotary_dim + (r < 8 ? 8 * tile + r : rotary_dim / 2 + 8 * tile + r - 8);
}

__device__ uint32_t scaled_pair(const __nv_bfloat16* row, int column, const __nv_bfloat16* column_scale) {
  __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(row + column);
  if (column_scale) {  // fp32 product, rounded once
    const float2 w = __bfloat1622float2(pair);
    const float2 s = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(column_scale + column));
    pair = __floats2bfloat162_rn(w.x * s.x, w.y * s.y);
  }
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__global__ void pack_rows_kernel(const __nv_bfloat16* weights, const __nv_bfloat16* column_scale, uint4* packed,
                                 int rows, int inner, int rotary_dim) {
  const size_t ksteps = inner / 16;
  const size_t total = static_cast<size_t>(rows / 16) * ksteps * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32, g = lane / 4, t = lane % 4;
    const int k = static_cast<int>((index / 32) % ksteps);
    const int tile = static_cast<int>(index / 32 / ksteps);
    const __nv_bfloat16* top = weights + static_cast<size_t>(source_row(tile * 16 + g, rotary_dim)) * inner;
    const __nv_bfloat16* bottom = weights + static_cast<size_t>(source_row(tile * 16 + g + 8, rotary_dim)) * inner;
    const int column = k * 16 + 2 * t;  // the A-fragment order of fragment.cuh's gather_a_fragment
    packed[index] = make_uint4(scaled_pair(top, column, column_scale), scaled_pair(bottom, column, column_scale),
                               scaled_pair(top, column + 8, column_scale), scaled_pair(bottom, column + 8, column_scale));
  }
}

cudaError_t pack(const __nv_bfloat16* weights, const __nv_bfloat16* column_scale, uint4* packed, int rows, int inner,
                 int rotary_dim, cudaStream_t stream) {
  if (!weights || !packed || rows < 16 || rows % 16 != 0 || inner < 16 || inner % 16 != 0) return cudaErrorInvalidValue;
  pack_rows_kernel<<<1024, 256, 0, stream>>>(weights, column_scale, packed, rows, inner, rotary_dim);
  return cudaGetLastError();
}

}  // namespace

cudaError_t pack_rows_fragments(const __nv_bfloat16* weights, uint4* packed, int rows, int inner, cudaStream_t stream) {
  return pack(weights, nullptr, packed, rows, inner, 0, stream);
}

cudaError_t pack_rotary_rows_fragments(const __nv_bfloat16* weights, const __nv_bfloat16* column_scale, uint4* packed,
                                       int rows, int inner, int head_dim, cudaStream_t stream) {
  if (!column_scale || head_dim < 16 || head_dim % 16 != 0 || rows % head_dim != 0) return cudaErrorInvalidValue;
  return pack(weights, column_scale, packed, rows, inner, head_dim, stream);
}

namespace streamk_gemv {
int ring_choice() {
  static const int choice = [] {
    const char* text = std::getenv("DEEPFUSE_GEMV_RING");
    return text ? std::atoi(text) : 1;
  }();
  return choice;
}
}  // namespace streamk_gemv

}  // namespace deepfuse::kernels
