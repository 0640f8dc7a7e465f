// Warp-level building blocks of the attention kernels: cp.async copies into shared memory,
// ldmatrix / movmatrix fragment moves for mma.m16n8k16 (fragment layouts: kernels/common/fragment.cuh),
// bf16 packing, warp reductions. Thin PTX wrappers, nothing attention-specific.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

// A namespace of their own: kernels/mlp keeps private versions of some of these names.
namespace deepfuse::kernels::warp_tiles {

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; valid = false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void copy16_async(unsigned shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared), "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 load_matrix_x4(unsigned address) {
  uint4 a;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w)
               : "r"(address)
               : "memory");
  return a;
}
__device__ __forceinline__ uint4 load_matrix_x4_transposed(unsigned address) {
  uint4 a;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w)
               : "r"(address)
               : "memory");
  return a;
}
// The 8x8 bf16 matrix whose row g the lanes 4g..4g+3 hold, transposed, in the same layout.
__device__ __forceinline__ uint32_t transpose_8x8(uint32_t fragment) {
  uint32_t result;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(result) : "r"(fragment));
  return result;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  uint32_t bits;
  memcpy(&bits, &pair, sizeof bits);
  return bits;
}
__device__ __forceinline__ float low_bf16(uint32_t bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ float high_bf16(uint32_t bits) { return __uint_as_float(bits & 0xffff0000u); }

__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* destination, float4 v) {
  uint2 packed;
  packed.x = pack_bf16x2(v.x, v.y);
  packed.y = pack_bf16x2(v.z, v.w);
  *reinterpret_cast<uint2*>(destination) = packed;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace deepfuse::kernels::warp_tiles
