#include "deepfuse/kernels/one_shot_all_reduce.hpp"

#include "kernels/common/pointer_checks.hpp"

namespace deepfuse::kernels {
namespace {

// ~10 s at the H100's 1.98 GHz boost clock: far past any all-reduce, short of a hung job.
constexpr long long kSpinLimitCycles = 20'000'000'000LL;

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 64;
constexpr int kVectorsPerThread = 2;  // below the block cap, each thread sums this many 16-byte vectors, loaded together
constexpr int kElementsPerVector = 8;  // bf16 in a uint4

// Signal area layout, in uint32 words: flags[block][rank] (written by peers), then epochs[block]
// (this rank's own count of calls that launched the block).
__host__ __device__ constexpr size_t flag_index(int block, int rank) {
  return static_cast<size_t>(block) * kMaxTensorParallelRanks + rank;
}
constexpr size_t kEpochBase = flag_index(kMaxBlocks, 0);
constexpr size_t kSignalWords = kEpochBase + kMaxBlocks;

__device__ __forceinline__ void store_release_sys(uint32_t* address, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Posts this block's epoch in slot [b][rank] of every peer's signal area and waits until every
// peer posted the same epoch (or the next: a fast peer may already be one call ahead) in this
// rank's slots [b][*]. Thread `peer` (< ranks, != rank) handles one peer; every thread of the block
// has finished its pushes (the __syncthreads before the call) and every thread's sums come after
// (the __syncthreads after it).
__device__ __forceinline__ void signal_and_wait(const OneShotAllReduceParams& p, uint32_t epoch) {
  const int b = blockIdx.x;
  const int peer = threadIdx.x;
  if (peer < p.ranks && peer != p.rank) {
    // Cumulative release: the block's pushes into peer's receive area (ordered before this thread
    // by the __syncthreads) are visible at system scope before peer can see the flag.
    fence_acq_rel_sys();
    store_release_sys(p.signals[peer] + flag_index(b, p.rank), epoch);
    const uint32_t* flag = p.signals[p.rank] + flag_index(b, peer);
    // Bounded: a peer that never arrives (its rank failed) ends this kernel with an error after
    // about ten seconds instead of hanging the GPU (the engine then reports the failure).
    const long long give_up = clock64() + kSpinLimitCycles;
    while (static_cast<int32_t>(load_acquire_sys(flag) - epoch) < 0) {
      if (clock64() > give_up) __trap();
    }
  }
}

__device__ __forceinline__ void add_vector(float (&sum)[kElementsPerVector], const uint4& bits, bool first) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
  for (int i = 0; i < kElementsPerVector / 2; ++i) {
    const float2 v = __bfloat1622float2(pairs[i]);
    // The first rank's value starts the sum (not 0 + x, which would turn -0 into +0), as the reference does.
    sum[2 * i] = first ? v.x : sum[2 * i] + v.x;
    sum[2 * i + 1] = first ? v.y : sum[2 * i + 1] + v.y;
  }
}

// Sums the kRanks vectors of one index in rank order and stores the bf16 result.
template <int kRanks>
__device__ __forceinline__ void sum_and_store(const uint4 (&loaded)[kRanks], __nv_bfloat16* out, size_t v) {
  float sum[kElementsPerVector] = {};
#pragma unroll
  for (int r = 0; r < kRanks; ++r) add_vector(sum, loaded[r], r == 0);
  uint4 packed;
  auto* out_pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kElementsPerVector / 2; ++i) out_pairs[i] = __floats2bfloat162_rn(sum[2 * i], sum[2 * i + 1]);
  reinterpret_cast<uint4*>(out)[v] = packed;
}

// Block b handles the same vectors on every rank (a function of blockIdx, gridDim and elements
// only): it pushes them, and after the barrier on flags [b][*] it sums exactly the vectors the
// peers' blocks b pushed. Two indices per iteration (v and v + stride), both in flight together.
template <int kRanks>
__global__ void __launch_bounds__(kThreads) one_shot_all_reduce_kernel(const OneShotAllReduceParams p) {
  __shared__ uint32_t shared_epoch;
  const int b = blockIdx.x;
  uint32_t* const own_epoch = p.signals[p.rank] + kEpochBase + b;
  uint32_t epoch = 0;
  if (threadIdx.x == 0) epoch = *own_epoch + 1;  // only this block of this rank's stream ever writes it

  const size_t vectors = p.elements / kElementsPerVector;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(b) * kThreads + threadIdx.x;
  const uint4* const own = reinterpret_cast<const uint4*>(p.own_input);
  static_assert(kVectorsPerThread == 2);

  // (1) Push: this rank's chunk into region [rank] of every peer's receive area, plain 16-byte
  // stores (posted NVLink writes, nothing waits for them until the fence).
  for (size_t v = first; v < vectors; v += 2 * stride) {
    const bool second = v + stride < vectors;
    const uint4 x = own[v];
    uint4 y = {};
    if (second) y = own[v + stride];
#pragma unroll
    for (int q = 0; q < kRanks; ++q) {
      if (q == p.rank) continue;
      uint4* const region = reinterpret_cast<uint4*>(p.receive[q] + p.rank * p.receive_stride);
      region[v] = x;
      if (second) region[v + stride] = y;
    }
  }
  // The last elements % 8 values, one per thread of block 0 (which also sums them).
  const size_t tail = p.elements - vectors * kElementsPerVector;
  const size_t tail_index = vectors * kElementsPerVector + threadIdx.x;
  if (b == 0 && threadIdx.x < tail) {
    const __nv_bfloat16 x = p.own_input[tail_index];
#pragma unroll
    for (int q = 0; q < kRanks; ++q)
      if (q != p.rank) p.receive[q][p.rank * p.receive_stride + tail_index] = x;
  }
  if (threadIdx.x == 0) {
    *own_epoch = epoch;
    shared_epoch = epoch;
  }
  __syncthreads();  // every push of the block before any flag; the epoch for every thread

  // (2) + (3): flags out, flags in.
  signal_and_wait(p, shared_epoch);
  __syncthreads();  // the acquires above order every thread's receive-area reads below

  // (4) Sum in rank order: rank's own term from own_input, every other from this GPU's receive
  // area (local memory; L2 loads, as peers' NVLink writes land in this GPU's L2).
  const __nv_bfloat16* const local = p.receive[p.rank];
  for (size_t v = first; v < vectors; v += 2 * stride) {
    const bool second = v + stride < vectors;
    uint4 x[kRanks], y[kRanks];
#pragma unroll
    for (int q = 0; q < kRanks; ++q) {
      const uint4* const source =
          q == p.rank ? own : reinterpret_cast<const uint4*>(local + static_cast<size_t>(q) * p.receive_stride);
      x[q] = __ldcg(source + v);
      if (second) y[q] = __ldcg(source + v + stride);
    }
    sum_and_store<kRanks>(x, p.out, v);
    if (second) sum_and_store<kRanks>(y, p.out, v + stride);
  }
  if (b == 0 && threadIdx.x < tail) {
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < kRanks; ++q) {
      const __nv_bfloat16* const source = q == p.rank ? p.own_input : local + static_cast<size_t>(q) * p.receive_stride;
      const float value =
          __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(source + tail_index))));
      sum = q == 0 ? value : sum + value;
    }
    p.out[tail_index] = __float2bfloat16_rn(sum);
  }
}

bool valid(const OneShotAllReduceParams& p) {
  if (p.ranks < 1 || p.ranks > kMaxTensorParallelRanks || p.rank < 0 || p.rank >= p.ranks) return false;
  if (!p.out || !aligned16(p.out) || !p.own_input || !aligned16(p.own_input)) return false;
  if (p.receive_stride < p.elements || p.receive_stride % kElementsPerVector != 0) return false;
  const size_t bytes = p.elements * sizeof(__nv_bfloat16);
  if (overlaps(p.out, bytes, p.own_input, bytes)) return false;
  // Only the regions a call touches: `ranks` regions, the last one `elements` long.
  const size_t area_bytes = ((p.ranks - 1) * p.receive_stride + p.elements) * sizeof(__nv_bfloat16);
  for (int r = 0; r < p.ranks; ++r) {
    if (!p.receive[r] || !aligned16(p.receive[r]) || !p.signals[r] || !aligned(p.signals[r], sizeof(uint32_t)))
      return false;
    if (overlaps(p.out, bytes, p.receive[r], area_bytes) || overlaps(p.own_input, bytes, p.receive[r], area_bytes))
      return false;
  }
  return true;
}

template <int kRanks>
void launch(const OneShotAllReduceParams& p, cudaStream_t stream) {
  one_shot_all_reduce_kernel<kRanks><<<one_shot_blocks(p.elements), kThreads, 0, stream>>>(p);
}

}  // namespace

size_t one_shot_signal_bytes() { return kSignalWords * sizeof(uint32_t); }

int one_shot_max_blocks() { return kMaxBlocks; }

int one_shot_blocks(size_t elements) {
  const size_t vectors = (elements + kElementsPerVector - 1) / kElementsPerVector;
  const size_t per_block = static_cast<size_t>(kThreads) * kVectorsPerThread;
  const size_t blocks = (vectors + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

cudaError_t launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream) {
  if (!valid(p)) return cudaErrorInvalidValue;
  if (p.elements == 0) return cudaSuccess;
  switch (p.ranks) {
    case 1: launch<1>(p, stream); break;
    case 2: launch<2>(p, stream); break;
    case 3: launch<3>(p, stream); break;
    case 4: launch<4>(p, stream); break;
    case 5: launch<5>(p, stream); break;
    case 6: launch<6>(p, stream); break;
    case 7: launch<7>(p, stream); break;
    default: launch<8>(p, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
