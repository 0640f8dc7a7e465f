// Host-side argument checks the kernel launchers share: alignment for vector loads and stores,
// and whether two buffers alias (an in-place write would race with another block's reads).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

inline bool aligned(const void* pointer, size_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// 16-byte vectors (uint4, eight bf16): what every streaming kernel loads.
inline bool aligned16(const void* pointer) { return aligned(pointer, 16); }

// [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto begin_a = reinterpret_cast<uintptr_t>(a), begin_b = reinterpret_cast<uintptr_t>(b);
  return begin_a < begin_b + b_bytes && begin_b < begin_a + a_bytes;
}

}  // namespace deepfuse::kernels
