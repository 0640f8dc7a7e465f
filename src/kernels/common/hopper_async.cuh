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
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
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
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  while (!mbarrier_try_wait(barrier, parity)) {
  }
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

template <>
struct WgmmaBf16<8> {
  __device__ __forceinline__ static void mma(float (&d)[4], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3"
        "}, %4, %5, accumulate, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct WgmmaBf16<16> {
  __device__ __forceinline__ static void mma(float (&d)[8], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7"
        "}, %8, %9, accumulate, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct WgmmaBf16<32> {
  __device__ __forceinline__ static void mma(float (&d)[16], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
        "}, %16, %17, accumulate, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct WgmmaBf16<64> {
  __device__ __forceinline__ static void mma(float (&d)[32], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1));
  }
};

template <>
struct WgmmaBf16<128> {
  __device__ __forceinline__ static void mma(float (&d)[64], uint64_t a, uint64_t b) {
    asm volatile(
        "{\n.reg .pred accumulate;\n"
        "setp.ne.b32 accumulate, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, accumulate, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
  }
};

#endif  // DEEPFUSE_HOPPER_ASYNC

}  // namespace deepfuse::kernels::hopper
