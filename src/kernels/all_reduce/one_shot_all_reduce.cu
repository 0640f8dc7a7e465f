#include "deepfuse/kernels/one_shot_all_reduce.hpp"

#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/pointer_checks.hpp"
#include "kernels/all_reduce/line_exchange.cuh"

namespace deepfuse::kernels {
namespace {

using lines::kSpinLimitCycles;

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 64;
constexpr int kVectorsPerThread = 2;  // below the block cap, each thread sums this many 16-byte vectors, loaded together
constexpr int kElementsPerVector = 8;  // bf16 in a uint4
// automatic: flags_in_data up to this message size. Its lines double the bytes every rank pushes
// to each peer, so it loses sooner with more peers: on H100s it wins up to 256 KiB with one peer,
// up to 32 KiB with three (bench allreduce, docs/dist.md). Eight ranks: not measured, kept small.
constexpr size_t flags_in_data_max_bytes(int ranks) {
  return ranks <= 2 ? 256 * 1024 : ranks <= 4 ? 32 * 1024 : 16 * 1024;
}

// Signal area layout, in uint32 words: flags[block][rank] (written by peers), then epochs[block]
// (this rank's own count of calls that launched the block).
__host__ __device__ constexpr size_t flag_index(int block, int rank) {
  return static_cast<size_t>(block) * kMaxTensorParallelRanks + rank;
}
constexpr size_t kEpochBase = flag_index(kMaxBlocks, 0);
constexpr size_t kSignalWords = kEpochBase + kMaxBlocks;
static_assert(kSignalWords == lines::kFlagProtocolWords, "the line protocol's words follow the flag protocol's");

__device__ __forceinline__ void store_release_sys(uint32_t* address, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Launched as a programmatic dependent, a grid may be scheduled while the kernel before it (the
// o_proj or MLP that wrote own_input) finishes: nothing is read before its completion. The next
// kernel (the fused MLP or QKV front) may then be scheduled at once and load its weights while
// this one waits on its peers; it reads `out` only after this grid completes, and it triggers its
// own successor only after that, so no kernel runs ahead of an unfinished all-reduce.
__device__ __forceinline__ void begin_after_upstream() {
  wait_for_upstream_grids();
  allow_downstream_launch();
}

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

// The sum of the kRanks vectors of one index in rank order, rounded to bf16 once.
template <int kRanks>
__device__ __forceinline__ uint4 sum_vector(const uint4 (&loaded)[kRanks]) {
  float sum[kElementsPerVector] = {};
#pragma unroll
  for (int r = 0; r < kRanks; ++r) add_vector(sum, loaded[r], r == 0);
  uint4 packed;
  auto* out_pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < kElementsPerVector / 2; ++i) out_pairs[i] = __floats2bfloat162_rn(sum[2 * i], sum[2 * i + 1]);
  return packed;
}

// Vector v of this rank's input: 8 bf16, the tail's missing ones zero (never stored).
__device__ __forceinline__ uint4 load_own_vector(const __nv_bfloat16* input, size_t v, size_t elements) {
  const size_t begin = v * kElementsPerVector;
  if (begin + kElementsPerVector <= elements) return reinterpret_cast<const uint4*>(input)[v];
  uint4 bits = {};
  auto* halves = reinterpret_cast<unsigned short*>(&bits);
  for (size_t i = begin; i < elements; ++i)
    halves[i - begin] = __bfloat16_as_ushort(input[i]);
  return bits;
}

__device__ __forceinline__ void store_out_vector(__nv_bfloat16* out, size_t v, size_t elements, const uint4& bits) {
  const size_t begin = v * kElementsPerVector;
  if (begin + kElementsPerVector <= elements) {
    reinterpret_cast<uint4*>(out)[v] = bits;
    return;
  }
  const auto* halves = reinterpret_cast<const unsigned short*>(&bits);
  for (size_t i = begin; i < elements; ++i) out[i] = __ushort_as_bfloat16(halves[i - begin]);
}

// ---- flag_after_data: data pushed, one fence, then a flag per (block, peer) ----------------------
//
// Block b handles the same vectors on every rank (a function of blockIdx, gridDim and elements
// only): it pushes them, and after the barrier on flags [b][*] it sums exactly the vectors the
// peers' blocks b pushed. Two indices per iteration (v and v + stride), both in flight together.
// A last, partial vector goes as a whole one, zero-padded (the regions hold whole vectors).
template <int kRanks>
__global__ void __launch_bounds__(kThreads) flag_after_data_kernel(const OneShotAllReduceParams p) {
  __shared__ uint32_t shared_epoch;
  begin_after_upstream();
  const int b = blockIdx.x;
  uint32_t* const own_epoch = p.signals[p.rank] + kEpochBase + b;
  uint32_t epoch = 0;
  if (threadIdx.x == 0) epoch = *own_epoch + 1;  // only this block of this rank's stream ever writes it

  const size_t vectors = (p.elements + kElementsPerVector - 1) / kElementsPerVector;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(b) * kThreads + threadIdx.x;
  static_assert(kVectorsPerThread == 2);

  // (1) Push: this rank's chunk into region [rank] of every peer's receive area, plain 16-byte
  // stores (posted NVLink writes, nothing waits for them until the fence).
  for (size_t v = first; v < vectors; v += 2 * stride) {
    const bool second = v + stride < vectors;
    const uint4 x = load_own_vector(p.own_input, v, p.elements);
    uint4 y = {};
    if (second) y = load_own_vector(p.own_input, v + stride, p.elements);
#pragma unroll
    for (int q = 0; q < kRanks; ++q) {
      if (q == p.rank) continue;
      uint4* const region = reinterpret_cast<uint4*>(p.receive[q] + p.rank * p.receive_stride);
      region[v] = x;
      if (second) region[v + stride] = y;
    }
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
      if (q == p.rank) {
        x[q] = load_own_vector(p.own_input, v, p.elements);
        if (second) y[q] = load_own_vector(p.own_input, v + stride, p.elements);
        continue;
      }
      const uint4* const source = reinterpret_cast<const uint4*>(local + static_cast<size_t>(q) * p.receive_stride);
      x[q] = __ldcg(source + v);
      if (second) y[q] = __ldcg(source + v + stride);
    }
    store_out_vector(p.out, v, p.elements, sum_vector<kRanks>(x));
    if (second) store_out_vector(p.out, v + stride, p.elements, sum_vector<kRanks>(y));
  }
}

// ---- flags_in_data: every 8-byte word of a pushed line carries its own flag (line_exchange.cuh) --

constexpr int kLinesPerVector = 2;  // one 16-byte input vector (8 bf16) makes two lines

// The vector's two lines from `peer`'s region of this GPU's receive area, once both carry `epoch`.
__device__ __forceinline__ uint4 wait_for_vector(const uint4* vector_lines, uint32_t epoch) {
  const long long give_up = clock64() + kSpinLimitCycles;
  uint4 first, second;
  while (true) {
    first = lines::load_line(vector_lines);
    second = lines::load_line(vector_lines + 1);
    if (first.y == epoch && first.w == epoch && second.y == epoch && second.w == epoch) break;
    if (clock64() > give_up) __trap();  // a peer that never arrives: see signal_and_wait
  }
  return {first.x, first.z, second.x, second.z};
}

// Thread t of block b handles the same vectors on every rank: pushes them as lines to every peer,
// then sums each once its lines from every peer are there.
template <int kRanks>
__global__ void __launch_bounds__(kThreads) flags_in_data_kernel(const OneShotAllReduceParams p) {
  begin_after_upstream();
  uint32_t* const signals = p.signals[p.rank];
  // Published by the previous call's last block (complete and visible once the upstream wait
  // returned); the same in every block and, the calls being the same on every rank, on every rank.
  const uint32_t epoch = lines::next_epoch(signals);
  const size_t vectors = (p.elements + kElementsPerVector - 1) / kElementsPerVector;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;

  // (1) Push: plain posted stores, nothing waits for them.
  for (size_t v = first; v < vectors; v += stride) {
    const uint4 x = load_own_vector(p.own_input, v, p.elements);
    const uint4 line0 = {x.x, epoch, x.y, epoch}, line1 = {x.z, epoch, x.w, epoch};
#pragma unroll
    for (int q = 0; q < kRanks; ++q) {
      if (q == p.rank) continue;
      uint4* const destination = p.lines[q] + p.rank * p.line_stride + kLinesPerVector * v;
      lines::store_line(destination, line0);
      lines::store_line(destination + 1, line1);
    }
  }
  // (2) Sum in rank order as each vector's lines arrive in this GPU's receive area.
  const uint4* const local = p.lines[p.rank];
  for (size_t v = first; v < vectors; v += stride) {
    uint4 loaded[kRanks];
#pragma unroll
    for (int q = 0; q < kRanks; ++q)
      loaded[q] = q == p.rank ? load_own_vector(p.own_input, v, p.elements)
                              : wait_for_vector(local + q * p.line_stride + kLinesPerVector * v, epoch);
    store_out_vector(p.out, v, p.elements, sum_vector<kRanks>(loaded));
  }
  // (3) The last block to finish publishes the epoch for the next call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    lines::finish_block(signals, epoch, gridDim.x);
  }
}

// ---- launch ----------------------------------------------------------------------------------

size_t lines_for(size_t elements) {
  return (elements + kElementsPerVector - 1) / kElementsPerVector * kLinesPerVector;
}

// What automatic runs: flags_in_data for small messages whose lines the line areas hold.
OneShotProtocol automatic_protocol(size_t elements, int ranks, bool lines_fit) {
  const bool small = elements * sizeof(__nv_bfloat16) <= flags_in_data_max_bytes(ranks);
  return small && lines_fit ? OneShotProtocol::flags_in_data : OneShotProtocol::flag_after_data;
}

OneShotProtocol resolve(const OneShotAllReduceParams& p) {
  if (p.protocol != OneShotProtocol::automatic) return p.protocol;
  return automatic_protocol(p.elements, p.ranks, p.lines[0] && p.line_stride >= lines_for(p.elements));
}

bool valid(const OneShotAllReduceParams& p, OneShotProtocol protocol) {
  if (p.ranks < 1 || p.ranks > kMaxTensorParallelRanks || p.rank < 0 || p.rank >= p.ranks) return false;
  if (!p.out || !aligned16(p.out) || !p.own_input || !aligned16(p.own_input)) return false;
  const size_t bytes = p.elements * sizeof(__nv_bfloat16);
  if (overlaps(p.out, bytes, p.own_input, bytes)) return false;
  const bool lines = protocol == OneShotProtocol::flags_in_data;
  if (lines ? p.line_stride < lines_for(p.elements)
            : p.receive_stride < p.elements || p.receive_stride % kElementsPerVector != 0)
    return false;
  // Only the regions a call touches: `ranks` regions, the last one as long as the message's.
  const size_t whole_vectors = (p.elements + kElementsPerVector - 1) / kElementsPerVector * kElementsPerVector;
  const size_t area_bytes = lines ? ((p.ranks - 1) * p.line_stride + lines_for(p.elements)) * sizeof(uint4)
                                  : ((p.ranks - 1) * p.receive_stride + whole_vectors) * sizeof(__nv_bfloat16);
  for (int r = 0; r < p.ranks; ++r) {
    const void* area = lines ? static_cast<const void*>(p.lines[r]) : static_cast<const void*>(p.receive[r]);
    if (!area || !aligned16(area) || !p.signals[r] || !aligned(p.signals[r], sizeof(uint32_t))) return false;
    if (overlaps(p.out, bytes, area, area_bytes) || overlaps(p.own_input, bytes, area, area_bytes)) return false;
  }
  return true;
}

template <int kRanks>
cudaError_t launch(const OneShotAllReduceParams& p, OneShotProtocol protocol, cudaStream_t stream) {
  const ClusterLaunch launch(one_shot_blocks(p.elements, protocol), kThreads, 0, /*cluster=*/1, stream,
                             /*programmatic=*/true);
  return protocol == OneShotProtocol::flags_in_data ? cudaLaunchKernelEx(&launch.config, flags_in_data_kernel<kRanks>, p)
                                                    : cudaLaunchKernelEx(&launch.config, flag_after_data_kernel<kRanks>, p);
}

}  // namespace

size_t one_shot_signal_bytes() { return lines::kSignalWords * sizeof(uint32_t); }

int one_shot_max_blocks() { return kMaxBlocks; }

size_t one_shot_lines(size_t elements) { return lines_for(elements); }

OneShotProtocol one_shot_automatic_protocol(size_t elements, int ranks) {
  return automatic_protocol(elements, ranks, /*lines_fit=*/true);
}

int one_shot_blocks(size_t elements, OneShotProtocol protocol) {
  const size_t vectors = (elements + kElementsPerVector - 1) / kElementsPerVector;
  // The flag protocol gives each thread two vectors (loaded together); with flags in the data one
  // each, as more threads polling in parallel see their lines sooner.
  const size_t per_block =
      static_cast<size_t>(kThreads) * (protocol == OneShotProtocol::flags_in_data ? 1 : kVectorsPerThread);
  const size_t blocks = (vectors + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

cudaError_t launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream) {
  const OneShotProtocol protocol = resolve(p);
  if (!valid(p, protocol)) return cudaErrorInvalidValue;
  if (p.elements == 0) return cudaSuccess;
  cudaError_t launched = cudaSuccess;
  switch (p.ranks) {
    case 1: launched = launch<1>(p, protocol, stream); break;
    case 2: launched = launch<2>(p, protocol, stream); break;
    case 3: launched = launch<3>(p, protocol, stream); break;
    case 4: launched = launch<4>(p, protocol, stream); break;
    case 5: launched = launch<5>(p, protocol, stream); break;
    case 6: launched = launch<6>(p, protocol, stream); break;
    case 7: launched = launch<7>(p, protocol, stream); break;
    default: launched = launch<8>(p, protocol, stream); break;
  }
  if (launched != cudaSuccess) return launched;
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
