#include "deepfuse/kernels/fill.hpp"

namespace deepfuse::kernels {
namespace {

// splitmix64 finaliser: a good 64-bit mix, so consecutive indices give independent values.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(__nv_bfloat16* values, size_t count, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    values[i] = __float2bfloat16((2.0f * unit - 1.0f) * scale);
  }
}

}  // namespace

cudaError_t fill_uniform_bf16(__nv_bfloat16* values, size_t count, uint64_t seed, float scale, cudaStream_t stream) {
  fill_uniform_kernel<<<2048, 256, 0, stream>>>(values, count, seed, scale);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
