// Packing for the cluster GEMV weight stream (cluster_gemv.cuh).
#include "kernels/common/cluster_gemv.cuh"

#include "core/device_attributes.hpp"

namespace deepfuse::kernels {
namespace {

__global__ void pack_rows_kernel(const __nv_bfloat16* weights, uint4* packed, int rows, int inner) {
  const size_t ksteps = inner / 16;
  const size_t total = static_cast<size_t>(rows / 16) * ksteps * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int k = static_cast<int>((index / 32) % ksteps);
    const int tile = static_cast<int>(index / 32 / ksteps);
    packed[index] = gather_a_fragment(weights, inner, tile * 16, k * 16, lane);
  }
}

__global__ void pack_rows_fp8_kernel(const uint8_t* weights, uint4* packed, int rows, int inner) {
  const size_t loads = inner / 32;  // two k-steps per 16-byte lane load
  const size_t total = static_cast<size_t>(rows / 16) * loads * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int load = static_cast<int>((index / 32) % loads);
    const int tile = static_cast<int>(index / 32 / loads);
    const uint2 first = gather_e4m3_fragment(weights, inner, tile * 16, load * 32, lane);
    const uint2 second = gather_e4m3_fragment(weights, inner, tile * 16, load * 32 + 16, lane);
    packed[index] = make_uint4(first.x, first.y, second.x, second.y);
  }
}

}  // namespace

namespace cluster_gemv {

cudaError_t shared_bytes_for_blocks_per_sm(int per_sm, size_t& bytes) {
  DeviceAttributes device;
  if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
  // per_sm blocks of this size (each plus its reservation) fill the SM; one more does not fit.
  bytes = static_cast<size_t>(device.shared_bytes_per_sm / per_sm - device.reserved_shared_bytes_per_block);
  return cudaSuccess;
}

}  // namespace cluster_gemv

cudaError_t pack_rows_fragments(const __nv_bfloat16* weights, uint4* packed, int rows, int inner, cudaStream_t stream) {
  if (!weights || !packed || rows < 16 || rows % 16 != 0 || inner < 16 || inner % 16 != 0) return cudaErrorInvalidValue;
  pack_rows_kernel<<<1024, 256, 0, stream>>>(weights, packed, rows, inner);
  return cudaGetLastError();
}

cudaError_t pack_rows_fragments_fp8(const uint8_t* weights, uint4* packed, int rows, int inner, cudaStream_t stream) {
  if (!weights || !packed || rows < 16 || rows % 16 != 0 || inner < 32 || inner % 32 != 0) return cudaErrorInvalidValue;
  pack_rows_fp8_kernel<<<1024, 256, 0, stream>>>(weights, packed, rows, inner);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
