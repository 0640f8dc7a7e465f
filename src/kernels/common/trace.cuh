// Device side of kernels/common/trace.hpp: trace::stamp() in a kernel, trace::attach_unit() in
// its launcher. Without DEEPFUSE_TRACE both compile to nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/trace.hpp"

namespace deepfuse::kernels::trace {

#if defined(DEEPFUSE_TRACE)
namespace {

// One copy per translation unit (no relocatable device code): attach_unit() fills it.
__device__ Buffer unit_buffer;

// Copies the buffer's address into this unit's symbol when begin() has made a new one. A
// synchronous copy: the first, eager launch after begin() does it, before any capture.
inline void attach_unit() {
  static unsigned seen = 0;
  const Buffer buffer = current_buffer();
  if (buffer.generation == seen) return;
  if (cudaMemcpyToSymbol(unit_buffer, &buffer, sizeof buffer) == cudaSuccess) seen = buffer.generation;
}

__device__ __forceinline__ void stamp(Kernel kernel, Mark mark) {
  if (threadIdx.x != 0) return;
  const Buffer buffer = unit_buffer;
  if (!buffer.events) return;
  const unsigned index = atomicAdd(buffer.count, 1u);
  if (index >= buffer.capacity) return;
  Event event;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(event.time_ns));
  asm("mov.u64 %0, %%gridid;" : "=l"(event.grid));
  unsigned sm;
  asm("mov.u32 %0, %%smid;" : "=r"(sm));
  event.sm = static_cast<std::uint16_t>(sm);
  event.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  event.kernel = static_cast<std::uint8_t>(kernel);
  event.mark = static_cast<std::uint8_t>(mark);
  buffer.events[index] = event;
}

}  // namespace
#else
inline void attach_unit() {}
__device__ __forceinline__ void stamp(Kernel, Mark) {}
#endif

}  // namespace deepfuse::kernels::trace
