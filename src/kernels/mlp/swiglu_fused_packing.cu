// Packing for the fused SwiGLU MLP: Hugging Face row-major gate, up and down into the fragment
// orders its phases stream (include/deepfuse/mlp.hpp describes them).
#include "deepfuse/kernels/swiglu_fused.hpp"

#include "kernels/common/fragment.cuh"
#include "kernels/mlp/swiglu_fused_config.cuh"

namespace deepfuse::kernels {
namespace {

// A packed word (two bf16 of one row, columns c and c + 1) times the weights of those columns,
// in fp32, rounded once.
__device__ __forceinline__ uint32_t scale_columns(uint32_t pair, const __nv_bfloat16* weight) {
  const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
  const float2 w = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(weight));
  const __nv_bfloat162 scaled = __floats2bfloat162_rn(v.x * w.x, v.y * w.y);
  return *reinterpret_cast<const uint32_t*>(&scaled);
}

__global__ void pack_gate_up_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                    const __nv_bfloat16* norm_weight, uint4* out, int hidden, int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 16) * h_tiles * 64;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const bool is_up = (index / 32) % 2;
    const size_t step = index / 64;
    const int k = static_cast<int>(step % h_tiles);
    const int tile = static_cast<int>(step / h_tiles);
    uint4 fragment = gather_a_fragment(is_up ? up : gate, hidden, tile * 16, k * 16, lane);
    if (norm_weight) {  // fragment.x/.y: columns 2t, 2t+1 of the step; .z/.w: 2t+8, 2t+9
      const __nv_bfloat16* columns = norm_weight + k * 16 + 2 * (lane % 4);
      fragment = make_uint4(scale_columns(fragment.x, columns), scale_columns(fragment.y, columns),
                            scale_columns(fragment.z, columns + 8), scale_columns(fragment.w, columns + 8));
    }
    out[index] = fragment;
  }
}

__global__ void pack_down_kernel(const __nv_bfloat16* down, uint4* out, int hidden, int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 16) * h_tiles * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int row_tile = static_cast<int>((index / 32) % h_tiles);
    const int tile = static_cast<int>(index / 32 / h_tiles);
    out[index] = gather_a_fragment(down, intermediate, row_tile * 16, tile * 16, lane);
  }
}

__global__ void pack_gate_up_fp8_kernel(const uint8_t* gate, const uint8_t* up, uint4* out, int hidden,
                                        int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 16) * h_tiles * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int k = static_cast<int>((index / 32) % h_tiles);
    const int tile = static_cast<int>(index / 32 / h_tiles);
    const uint2 g = gather_e4m3_fragment(gate, hidden, tile * 16, k * 16, lane);
    const uint2 u = gather_e4m3_fragment(up, hidden, tile * 16, k * 16, lane);
    out[index] = make_uint4(g.x, g.y, u.x, u.y);
  }
}

__global__ void pack_down_fp8_kernel(const uint8_t* down, uint4* out, int hidden, int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 32) * h_tiles * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int row_tile = static_cast<int>((index / 32) % h_tiles);
    const int pair = static_cast<int>(index / 32 / h_tiles);
    const uint2 first = gather_e4m3_fragment(down, intermediate, row_tile * 16, pair * 32, lane);
    const uint2 second = gather_e4m3_fragment(down, intermediate, row_tile * 16, pair * 32 + 16, lane);
    out[index] = make_uint4(first.x, first.y, second.x, second.y);
  }
}

}  // namespace

cudaError_t pack_swiglu_gate_up_fp8(const uint8_t* gate, const uint8_t* up, uint4* gate_up_packed, int hidden,
                                    int intermediate, cudaStream_t stream) {
  if (!gate || !up || !gate_up_packed || !swiglu_fused_valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_gate_up_fp8_kernel<<<1024, 256, 0, stream>>>(gate, up, gate_up_packed, hidden, intermediate);
  return cudaGetLastError();
}

cudaError_t pack_swiglu_down_fp8(const uint8_t* down, uint4* down_packed, int hidden, int intermediate,
                                 cudaStream_t stream) {
  if (!down || !down_packed || !swiglu_fused_valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_down_fp8_kernel<<<1024, 256, 0, stream>>>(down, down_packed, hidden, intermediate);
  return cudaGetLastError();
}

cudaError_t pack_swiglu_gate_up(const __nv_bfloat16* gate, const __nv_bfloat16* up, const __nv_bfloat16* norm_weight,
                                uint4* gate_up_packed, int hidden, int intermediate, cudaStream_t stream) {
  if (!swiglu_fused_valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_gate_up_kernel<<<1024, 256, 0, stream>>>(gate, up, norm_weight, gate_up_packed, hidden, intermediate);
  return cudaGetLastError();
}

cudaError_t pack_swiglu_down(const __nv_bfloat16* down, uint4* down_packed, int hidden, int intermediate,
                             cudaStream_t stream) {
  if (!swiglu_fused_valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_down_kernel<<<1024, 256, 0, stream>>>(down, down_packed, hidden, intermediate);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
