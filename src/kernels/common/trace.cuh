// Device side of kernels/common/trace.hpp: trace::stamp() in a kernel, trace::attach_unit() in
// its launcher. Without DEEPFUSE_TRACE both compile to nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

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

// An event of this block at `time_ns`.
__device__ __forceinline__ Event event_at(std::uint64_t time_ns, std::uint8_t kernel, std::uint8_t mark) {
  Event event;
  event.time_ns = time_ns;
  asm("mov.u64 %0, %%gridid;" : "=l"(event.grid));
  unsigned sm;
  asm("mov.u32 %0, %%smid;" : "=r"(sm));
  event.sm = static_cast<std::uint16_t>(sm);
  event.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  event.kernel = kernel;
  event.mark = mark;
  return event;
}

__device__ __forceinline__ std::uint64_t globaltimer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void stamp(Kernel kernel, Mark mark) {
  if (threadIdx.x != 0) return;
  const Buffer buffer = unit_buffer;
  if (!buffer.events) return;
  const unsigned index = atomicAdd(buffer.count, 1u);
  if (index >= buffer.capacity) return;
  buffer.events[index] = event_at(globaltimer(), static_cast<std::uint8_t>(kernel), static_cast<std::uint8_t>(mark));
}

}  // namespace
#else
inline void attach_unit() {}
__device__ __forceinline__ void stamp(Kernel, Mark) {}
#endif

}  // namespace deepfuse::kernels::trace
