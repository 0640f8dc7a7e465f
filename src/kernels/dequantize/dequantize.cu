// FP8 -> bf16 widening of a row-major linear weight (include/deepfuse/kernels/dequantize.hpp).
// A copy kernel: 4 bytes in, 8 bytes out per thread and step, at the copy bandwidth.
#include "deepfuse/kernels/dequantize.hpp"

#include <cuda_fp8.h>

#include <cstdint>

namespace deepfuse::kernels {
namespace {

__global__ void dequantize_kernel(const uint32_t* weights, const float* scales, __nv_bfloat16* out, int rows,
                                  int columns, int scale_block) {
  const size_t quads = static_cast<size_t>(rows) * columns / 4;
  const int scale_columns = scale_block ? columns / scale_block : 0;
  for (size_t quad = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; quad < quads;
       quad += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t element = quad * 4;
    const int row = static_cast<int>(element / columns), column = static_cast<int>(element % columns);
    const float scale = scale_block ? scales[(row / scale_block) * scale_columns + column / scale_block] : scales[row];
    const uint32_t bytes = weights[quad];
    __nv_bfloat162 pairs[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes >> (16 * half)), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      pairs[half] = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    }
    *reinterpret_cast<uint2*>(out + element) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&pairs[0]), *reinterpret_cast<const uint32_t*>(&pairs[1]));
  }
}

}  // namespace

cudaError_t launch_dequantize_to_bf16(const LinearWeight& weight, __nv_bfloat16* out, cudaStream_t stream) {
  const WeightFormatInfo& info = format_info(weight.format);
  if (!out || weight.empty() || !weight.scales || weight.tensor_scale || weight.layout != WeightLayout::row_major ||
      info.element_bytes != 1 || weight.rows < 1 || weight.columns < 4 || weight.columns % 4 != 0 ||
      (info.scale_block && (weight.rows % info.scale_block || weight.columns % info.scale_block)))
    return cudaErrorInvalidValue;
  dequantize_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint32_t*>(weight.data), weight.scales, out, weight.rows,
                                              weight.columns, info.scale_block);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
