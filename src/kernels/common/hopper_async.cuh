// Hopper's asynchronous data path, written from the PTX ISA: mbarriers, TMA tile loads
// (cp.async.bulk.tensor) and warpgroup MMA (wgmma) on shared-memory matrix descriptors.
// Everything here exists only in sm_90a code (DEEPFUSE_HOPPER_ASYNC); kernels that use it compile
// their bodies out elsewhere, and their launchers refuse other GPUs first.
//
// Shared-memory tiles these helpers describe: K-major, 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B):
// each row is 64 bf16 of K (128 bytes), 8-row groups (1024 bytes) are contiguous, and a tile starts
// on a 1024-byte boundary so the swizzle pattern (16-byte chunk c of row r stored at c ^ (r % 8))
// is the one the wgmma descriptor's swizzle mode assumes with base offset 0.
#pragma once

#include <cstdint>

#include "kernels/common/wgmma_layout.hpp"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DEEPFUSE_HOPPER_ASYNC 1
#endif

namespace deepfuse::kernels::hopper {

#ifdef DEEPFUSE_HOPPER_ASYNC

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// ---- mbarriers (shared::cta, 8 bytes each)
__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(barrier), "r"(arrivals) : "memory");
}
// Publishes initialised barriers to the async proxy (the TMA unit completes transactions on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival that also announces `bytes` of TMA transactions the phase waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(barrier) : "memory");
}
// True once the phase of parity `parity` has completed (try_wait may also give up after a
// hardware-chosen time: the caller loops).
__device__ __forceinline__ bool mbarrier_try_wait(unsigned barrier, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred complete;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
      "selp.u32 %0, 1, 0, complete;\n}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
  return done != 0;
}
// A wait longer than this is a lost arrival or byte count (a bug, not a slow GPU: a stage lands
// in microseconds, and in well under a second under compute-sanitizer): the kernel traps, so a
// test fails with a launch error instead of hanging the GPU.
constexpr uint64_t kMbarrierTimeoutNs = 10'000'000'000ull;

__device__ __forceinline__ uint64_t global_nanoseconds() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  if (mbarrier_try_wait(barrier, parity)) return;
  const uint64_t start = global_nanoseconds();
  while (!mbarrier_try_wait(barrier, parity))
    if (global_nanoseconds() - start > kMbarrierTimeoutNs) __trap();
}

// ---- TMA: one box of a 2-D tensor map (a CUtensorMap kernel parameter, __grid_constant__) into
// shared memory, completing its bytes on `barrier`. Coordinates are (column, row) in elements; a box
// reaching past the tensor's extent is zero-filled and still counts its full bytes.
__device__ __forceinline__ void tma_load_2d(unsigned destination, const void* tensor_map, int column, int row,
                                            unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          destination),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(column), "r"(row), "r"(barrier)
      : "memory");
}
// The same under an L2 cache policy (createpolicy), e.g. evict-first for weights read once.
__device__ __forceinline__ void tma_load_2d(unsigned destination, const void* tensor_map, int column, int row,
                                            unsigned barrier, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(destination),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(column), "r"(row), "r"(barrier), "l"(policy)
      : "memory");
}

// ---- Named barriers among a subset of the block's warps (id 0 is __syncthreads').
__device__ __forceinline__ void named_barrier(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma
// Matrix descriptor of a K-major, 128-byte-swizzled tile at shared address `address` (PTX ISA,
// "Matrix Descriptor Format"): bits 0-13 address >> 4; 16-29 leading byte offset >> 4 (unused by
// swizzled K-major layouts, 1 by convention); 32-45 stride byte offset >> 4 (1024: from one 8-row
// group to the next); 49-51 base offset (0: tiles are 1024-byte aligned); 62-63 swizzle mode
// (1 = 128-byte). Stepping 16 elements of K inside the 128-byte row adds 32 bytes to the address:
// the hardware applies the swizzle to the address bits it computes.
__device__ __forceinline__ uint64_t descriptor_k_major_sw128(unsigned address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Orders this warpgroup's register and shared-memory accesses before the wgmma that follows.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most `Pending` committed groups of this thread are still running.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
// Accumulator registers are written asynchronously: this ties each one to the surrounding asm so the
// compiler neither reads it before wgmma_wait nor moves a write past the next wgmma.
template <int R>
__device__ __forceinline__ void fence_accumulators(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x N] += A[64 x 16] * B[16 x N]: A and B bf16 K-major in shared memory (descriptors), D fp32 in
// registers, N/2 per thread. Thread t of the warpgroup (warp w = t / 32, lane l) holds, for
// i < N/2: row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2
// (accumulator_row / accumulator_column, wgmma_layout.hpp). Scale-d is 1: D accumulates (zero it first).
template <int N>
struct WgmmaBf16;

// The accumulator operands: "+f"(d[i]) .. "+f"(d[i + 2^k - 1]), and their placeholders.
#define DEEPFUSE_WGMMA_D2(i) "+f"(d[i]), "+f"(d[i + 1])
#define DEEPFUSE_WGMMA_D4(i) DEEPFUSE_WGMMA_D2(i), DEEPFUSE_WGMMA_D2(i + 2)
#define DEEPFUSE_WGMMA_D8(i) DEEPFUSE_WGMMA_D4(i), DEEPFUSE_WGMMA_D4(i + 4)
#define DEEPFUSE_WGMMA_D16(i) DEEPFUSE_WGMMA_D8(i), DEEPFUSE_WGMMA_D8(i + 8)
#define DEEPFUSE_WGMMA_D32(i) DEEPFUSE_WGMMA_D16(i), DEEPFUSE_WGMMA_D16(i + 16)
#define DEEPFUSE_WGMMA_D64(i) DEEPFUSE_WGMMA_D32(i), DEEPFUSE_WGMMA_D32(i + 32)
#define DEEPFUSE_WGMMA_P4 "%0, %1, %2, %3"
#define DEEPFUSE_WGMMA_P8 DEEPFUSE_WGMMA_P4 ", %4, %5, %6, %7"
#define DEEPFUSE_WGMMA_P16 DEEPFUSE_WGMMA_P8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define DEEPFUSE_WGMMA_P32 \
  DEEPFUSE_WGMMA_P16 ", %16, %17, %18, %19, %20, %21, %22, %23" \
                     ", %24, %25, %26, %27, %28, %29, %30, %31"
#define DEEPFUSE_WGMMA_P64 \
  DEEPFUSE_WGMMA_P32 ", %32, %33, %34, %35, %36, %37, %38, %39" \
                     ", %40, %41, %42, %43, %44, %45, %46, %47" \
                     ", %48, %49, %50, %51, %52, %53, %54, %55" \
                     ", %56, %57, %58, %59, %60, %61, %62, %63"
// WgmmaBf16<N>: its N / 2 accumulators are operands %0.., then the descriptors A_AT and B_AT and
// scale-d's register (always 1: D accumulates).
#define DEEPFUSE_WGMMA_BF16(N, PLACEHOLDERS, A_AT, B_AT, SCALE_AT, ACCUMULATORS)                         \
  template <>                                                                                         \
  struct WgmmaBf16<N> {                                                                               \
    __device__ __forceinline__ static void mma(float (&d)[N / 2], uint64_t a, uint64_t b) {          \
      asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %" #SCALE_AT ", 0;\n"           \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" PLACEHOLDERS "}, %" #A_AT \
                   ", %" #B_AT ", accumulate, 1, 1, 0, 0;\n}\n"                                        \
                   : ACCUMULATORS                                                                     \
                   : "l"(a), "l"(b), "r"(1));                                                         \
    }                                                                                                 \
  };
DEEPFUSE_WGMMA_BF16(8, DEEPFUSE_WGMMA_P4, 4, 5, 6, DEEPFUSE_WGMMA_D4(0))
DEEPFUSE_WGMMA_BF16(16, DEEPFUSE_WGMMA_P8, 8, 9, 10, DEEPFUSE_WGMMA_D8(0))
DEEPFUSE_WGMMA_BF16(32, DEEPFUSE_WGMMA_P16, 16, 17, 18, DEEPFUSE_WGMMA_D16(0))
DEEPFUSE_WGMMA_BF16(64, DEEPFUSE_WGMMA_P32, 32, 33, 34, DEEPFUSE_WGMMA_D32(0))
DEEPFUSE_WGMMA_BF16(128, DEEPFUSE_WGMMA_P64, 64, 65, 66, DEEPFUSE_WGMMA_D64(0))
#undef DEEPFUSE_WGMMA_BF16
#undef DEEPFUSE_WGMMA_P64
#undef DEEPFUSE_WGMMA_P32
#undef DEEPFUSE_WGMMA_P16
#undef DEEPFUSE_WGMMA_P8
#undef DEEPFUSE_WGMMA_P4
#undef DEEPFUSE_WGMMA_D64
#undef DEEPFUSE_WGMMA_D32
#undef DEEPFUSE_WGMMA_D16
#undef DEEPFUSE_WGMMA_D8
#undef DEEPFUSE_WGMMA_D4
#undef DEEPFUSE_WGMMA_D2

#endif  // DEEPFUSE_HOPPER_ASYNC

}  // namespace deepfuse::kernels::hopper
