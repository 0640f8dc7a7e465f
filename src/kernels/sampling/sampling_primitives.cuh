// Device helpers of the sampling kernel: cluster barriers and distributed shared memory (with a
// single-block fallback for C = 1, which also runs before Hopper), warp scans, and the
// order-preserving key of a float logit.
#pragma once

#include <cstdint>

#include "kernels/common/async_ring.cuh"

namespace deepfuse::kernels::sampling_detail {

constexpr unsigned kFullMask = 0xffffffffu;

// Cluster plumbing (in_block, cluster_barrier; C = 1: the block itself) is in
// kernels/common/async_ring.cuh.

// ---- Values.
// -0 and +0 are one value (the reference compares doubles): give them one key.
__device__ __forceinline__ float canonical(float v) { return v == 0.0f ? 0.0f : v; }

// Order-preserving map of non-NaN floats onto uint32: a < b  <=>  key(a) < key(b).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// reference::sampling_uniform: splitmix64 of seed + (step + 1) * golden gamma, top 53 bits.
__device__ __forceinline__ double sampling_uniform(uint64_t seed, uint64_t step) {
  uint64_t z = seed + (step + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

__device__ __forceinline__ double warp_sum(double value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

__device__ __forceinline__ double warp_inclusive_scan(double value, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const double other = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

}  // namespace deepfuse::kernels::sampling_detail
