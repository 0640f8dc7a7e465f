// The weight ring of the persistent decode kernel: one producer thread streams row-major weight
// slabs into shared-memory stages with bulk copies (cp.async.bulk, the TMA's 1-D form), an
// mbarrier per stage counting the bytes in ("full") and another counting the consumer warps
// that are done with it ("empty"). Weights do not depend on the activations, so the producer
// runs as far ahead as the ring allows, across operations and layers.
//
// A slab (rows x K bf16, K a multiple of kIterationElements) is cut into stages of up to
// kStageBytes; the consumer warps split each stage into contiguous runs of 512-byte
// iterations (one 16-byte load per lane, all within one row since K is a multiple of 256) and
// add each row's dot product with the staged vector into a shared-memory sum per row.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention/warp_tiles.cuh"
#include "kernels/common/async_ring.cuh"

namespace deepfuse::kernels::persistent {

// Seven consumer warps and the producer: 8 warps, two per SM sub-partition, may hold up to 255
// registers each (with 9 warps one sub-partition holds three: 168 at most, and the attention spilled).
constexpr int kConsumerWarps = 7;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp
constexpr int kStageBytes = 32768;
constexpr int kUnroll = 4;  // iterations per consumer warp with loads in flight together
constexpr int kIterationElements = 256;  // bf16 per warp-wide 16-byte load
constexpr int kIterationBytes = kIterationElements * 2;

// Named barrier 1 over the consumer warps (the producer warp never joins it).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ void barrier_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier counts its phase
// "parity 1" as completed, so a producer's first pass over the ring does not wait).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* shared, const void* global, unsigned bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(shared)),
      "l"(global), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}

// Where the ring is and which pass over it.
struct RingState {
  int stage = 0;
  unsigned phase = 0;
  __device__ void advance(int stages) {
    if (++stage == stages) stage = 0, phase ^= 1;
  }
};

struct Ring {
  char* stages;     // [count][kStageBytes]
  uint64_t* full;   // [count]
  uint64_t* empty;  // [count]
  int count;

  // One thread, once, before any use (then a block-wide barrier).
  __device__ void init() {
    for (int i = 0; i < count; ++i) barrier_init(&full[i], 1), barrier_init(&empty[i], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
};

// The producer's side: rows [first, first + rows) of a row-major [*, K] matrix, stage by stage.
__device__ __forceinline__ void produce_slab(const Ring& ring, RingState& at, const __nv_bfloat16* matrix,
                                             int first, int rows, int k, uint64_t policy) {
  const char* src = reinterpret_cast<const char*>(matrix + static_cast<size_t>(first) * k);
  const size_t bytes = static_cast<size_t>(rows) * k * 2;
  for (size_t offset = 0; offset < bytes; offset += kStageBytes) {
    const unsigned n = static_cast<unsigned>(bytes - offset < kStageBytes ? bytes - offset : kStageBytes);
    barrier_wait(&ring.empty[at.stage], at.phase ^ 1);
    barrier_expect_bytes(&ring.full[at.stage], n);
    bulk_copy(ring.stages + static_cast<size_t>(at.stage) * kStageBytes, src + offset, n, &ring.full[at.stage],
              policy);
    at.advance(ring.count);
  }
}

using warp_tiles::warp_sum;

// a · b over 8 bf16 pairs, in fp32.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float sum) {
  const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
  float even = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sum = fmaf(warp_tiles::low_bf16(av[i]), warp_tiles::low_bf16(bv[i]), sum);
    even = fmaf(warp_tiles::high_bf16(av[i]), warp_tiles::high_bf16(bv[i]), even);
  }
  return sum + even;
}

// The consumers' side of the same slab: acc[r] += row r · x for r in [0, rows), x (bf16 [K]) in
// shared memory. Every consumer warp calls it; acc must be zero and x staged beforehand, and a
// consumer_sync() must follow before acc is read.
__device__ __forceinline__ void consume_slab(const Ring& ring, RingState& at, int rows, int k,
                                             const __nv_bfloat16* x, float* acc) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t bytes = static_cast<size_t>(rows) * k * 2;
  for (size_t offset = 0; offset < bytes; offset += kStageBytes) {
    const int n = static_cast<int>(bytes - offset < kStageBytes ? bytes - offset : kStageBytes);
    const int iterations = n / kIterationBytes;
    const int first = warp * iterations / kConsumerWarps, last = (warp + 1) * iterations / kConsumerWarps;
    barrier_wait(&ring.full[at.stage], at.phase);
    if (first < last) {
      const char* stage = ring.stages + static_cast<size_t>(at.stage) * kStageBytes + lane * 16;
      const size_t element = offset / 2 + static_cast<size_t>(first) * kIterationElements;
      int row = static_cast<int>(element / k);
      int col = static_cast<int>(element - static_cast<size_t>(row) * k);
      const __nv_bfloat16* x_lane = x + lane * 8;
      float sum = 0.0f;
      // kUnroll iterations' loads first: one block per SM leaves ~2 warps per scheduler, so a
      // warp must keep its own loads in flight.
      int i = first;
      for (; i + kUnroll <= last; i += kUnroll) {
        uint4 w[kUnroll], v[kUnroll];
        int cols[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          cols[u] = col;
          col = col + kIterationElements == k ? 0 : col + kIterationElements;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          w[u] = *reinterpret_cast<const uint4*>(stage + (i + u) * kIterationBytes);
          v[u] = *reinterpret_cast<const uint4*>(x_lane + cols[u]);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          sum = dot8(w[u], v[u], sum);
          if (cols[u] + kIterationElements == k) {  // row ends
            sum = warp_sum(sum);
            if (lane == 0) atomicAdd(&acc[row], sum);
            sum = 0.0f, ++row;
          }
        }
      }
      for (; i < last; ++i) {
        sum = dot8(*reinterpret_cast<const uint4*>(stage + i * kIterationBytes),
                   *reinterpret_cast<const uint4*>(x_lane + col), sum);
        col += kIterationElements;
        if (col == k) {
          sum = warp_sum(sum);
          if (lane == 0) atomicAdd(&acc[row], sum);
          sum = 0.0f, col = 0, ++row;
        }
      }
      if (col != 0) {  // the run ends inside a row
        sum = warp_sum(sum);
        if (lane == 0) atomicAdd(&acc[row], sum);
      }
    }
    __syncwarp();
    if (lane == 0) {
      // The stage's next bytes arrive through the async proxy (the bulk copy): order this warp's
      // generic-proxy reads before them.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      barrier_arrive(&ring.empty[at.stage]);
    }
    at.advance(ring.count);
  }
}

}  // namespace deepfuse::kernels::persistent
