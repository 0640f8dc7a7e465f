// Device side of deepfuse::L2PrefetchRange (include/deepfuse/l2_prefetch.hpp): the bulk copy
// engine fetches a share of the range into L2 (cp.async.bulk.prefetch, sm_90), fire and forget.
#pragma once

#include <cstdint>

#include "deepfuse/l2_prefetch.hpp"

namespace deepfuse::kernels {

// The calling thread asks for share `part` of `parts` (shares split at 16-byte units), one bulk
// prefetch per 64 KB. Before sm_90 it does nothing.
__device__ __forceinline__ void prefetch_l2_share(const L2PrefetchRange& range, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr size_t kChunk = 64 * 1024;
  if (range.data == nullptr || parts <= 0) return;
  const size_t units = range.bytes / 16;
  const size_t begin = units * part / parts * 16, end = units * (part + 1) / parts * 16;
  const char* base = static_cast<const char*>(range.data);
  for (size_t offset = begin; offset < end; offset += kChunk) {
    const uint32_t size = static_cast<uint32_t>(end - offset < kChunk ? end - offset : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + offset), "r"(size) : "memory");
  }
#endif
}

}  // namespace deepfuse::kernels
