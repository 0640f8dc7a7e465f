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

// Lane `lane`'s 8 bytes of the k-step at (row0, col0) of a row-major e4m3 matrix: the A fragment
// order of fragment.cuh, one byte per value, the low word first.
__device__ uint2 gather_e4m3_fragment(const uint8_t* matrix, size_t ld, int row0, int col0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const uint8_t* top = matrix + static_cast<size_t>(row0 + g) * ld + col0 + 2 * t;
  const uint8_t* bottom = top + 8 * ld;
  auto pair = [](const uint8_t* p) { return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8); };
  return make_uint2(pair(top) | (pair(bottom) << 16), pair(top + 8) | (pair(bottom + 8) << 16));
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
