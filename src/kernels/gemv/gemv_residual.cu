// Output projection + residual for decode: the cluster GEMV weight stream (cluster_gemv.cuh)
// over units of 64 or 128 output rows, each cluster of C blocks (cluster_gemv::dispatch: 8, 6 or
// 4) splitting the inner dimension; every block of a cluster then finishes its 1/C of the unit's
// rows: sum of the partials, bias, residual, bf16. Bytes: rows x inner x 2 of weights (32 MB for Llama-3-8B's o_proj, 7.6 µs at
// 4.2 TB/s); the cuBLASLt path it replaces runs a split-K GEMM plus a reduction kernel.
#include "deepfuse/kernels/gemv_residual.hpp"

#include "kernels/all_reduce/line_exchange.cuh"
#include "kernels/common/cluster_gemv.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/common/trace.cuh"

namespace deepfuse::kernels {
namespace {

using cluster_gemv::kThreads;

// Tensor parallel: the last `finishers` blocks to have written their y values sum y over the ranks,
// one line per thread, at most 16 blocks (about what the one-shot kernel spreads a message over).
__device__ unsigned exchange_finishers(const GemvResidualParams& p) {
  const size_t wanted = (static_cast<size_t>(p.tokens) * p.rows / 4 + kThreads - 1) / kThreads;
  return min(gridDim.x, static_cast<unsigned>(wanted < 16 ? wanted : 16));
}

// Counts this block's y values in; returns its place among the summing blocks (0 .. finishers - 1),
// or -1 for the blocks that arrived before them. Every block arrives without waiting on anything,
// so the summing blocks never wait on a block that may not be running.
__device__ int arrive(const GemvResidualParams& p) {
  __shared__ unsigned ticket;
  __threadfence();  // this block's y values are visible before its arrival counts
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(p.exchange.signals + lines::kArrivedWord, 1u);
  __syncthreads();
  const unsigned first = gridDim.x - exchange_finishers(p);
  return ticket < first ? -1 : static_cast<int>(ticket - first);
}

// Summing block `finisher`: once every block arrived, its share of y's lines pushed to the peers,
// then summed over the ranks (this rank's values from y, the peers' as they arrive). The upstream
// wait in stream_unit is behind us, so the last exchange's epoch is published.
__device__ void sum_over_ranks(const GemvResidualParams& p, int finisher) {
  uint32_t* const signals = p.exchange.signals;
  const uint32_t epoch = lines::next_epoch(signals);
  const unsigned finishers = exchange_finishers(p);
  if (threadIdx.x == 0)
    while (*reinterpret_cast<volatile unsigned*>(signals + lines::kArrivedWord) < gridDim.x) __nanosleep(32);
  __syncthreads();
  __threadfence();
  const size_t line_count = static_cast<size_t>(p.tokens) * p.rows / 4;
  const size_t begin = line_count * finisher / finishers, end = line_count * (finisher + 1) / finishers;
  auto* const y = reinterpret_cast<uint2*>(p.y);
  for (size_t line = begin + threadIdx.x; line < end; line += kThreads) lines::push_line(p.exchange, line, __ldcg(y + line), epoch);
  for (size_t line = begin + threadIdx.x; line < end; line += kThreads) y[line] = lines::sum_line(p.exchange, line, y[line], epoch);
  __syncthreads();
  if (threadIdx.x == 0) lines::finish_block(signals, epoch, finishers);
}

template <int NT, int kUnitRows, int C, int kStages>
__global__ void __launch_bounds__(kThreads) gemv_residual_kernel(const GemvResidualParams p, int max_ksteps) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  trace::stamp(trace::Kernel::gemv_residual, trace::Mark::start);
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  // This block's epilogue: its 1/C of the unit's rows in groups of four (a tensor-parallel
  // exchange line each), for every token.
  constexpr int kQuads = kUnitRows / 4;
  const int row_begin = 4 * split_point(kQuads, C, rank), rows = 4 * split_point(kQuads, C, rank + 1) - row_begin;
  const int items = p.tokens * rows;
  auto output_index = [&](int item) {
    return static_cast<size_t>(item / rows) * p.rows + unit * kUnitRows + row_begin + item % rows;
  };
  // bias + residual of an item. The residual is the kernel before's output, so each thread's
  // first ones are read after the upstream wait, but before the cluster barrier: in flight while
  // the last weights stream instead of a global round trip after it.
  auto addend = [&](int item) {
    const size_t index = output_index(item);
    const float bias = p.bias ? __bfloat162float(p.bias[index % p.rows]) : 0.0f;
    float residual = p.residual ? __bfloat162float(p.residual[index]) : 0.0f;
    const float pending = p.pending ? p.pending[index] : 0.0f;
    if (p.pending) {  // rounded as the producer's own finish would have stored it, then cleared
      residual = residual_sum(pending, residual);
      p.pending[index] = 0.0f;
    }
    return bias + residual;
  };
  // Row r of the unit is finished by the block whose slice holds it.
  auto home_of = [](int row) {
    const int owner = split_owner(kQuads, C, row / 4);
    return cluster_gemv::RowHome{owner, row - 4 * split_point(kQuads, C, owner)};
  };
  // Items are finished one per thread, or four consecutive rows of a token per thread where the
  // ranks exchange them (one line).
  const bool exchange = p.exchange.active();
  const int per_thread = exchange ? 4 : 1;
  auto item_of = [&](int work, int j) { return exchange ? work / (rows / 4) * rows + work % (rows / 4) * 4 + j : work; };
  const int works = items / per_thread;
  const cluster_gemv::Inputs inputs{p.x, nullptr, 0.0f, p.weights, p.tokens, p.inner, nullptr};
  float first_addends[4] = {};
  const auto partials = cluster_gemv::stream_unit<NT, kUnitRows, C, kStages>(
      inputs, unit, rank, shared_raw, max_ksteps, home_of, [&] {
        if (threadIdx.x < works)
          for (int j = 0; j < per_thread; ++j) first_addends[j] = addend(item_of(threadIdx.x, j));
      });
  auto value = [&](int work, int j) {
    const int item = item_of(work, j);
    return partials.sum(item % rows, item / rows) +
           (work == static_cast<int>(threadIdx.x) ? first_addends[j] : addend(item));
  };

  if (!exchange) {
    for (int work = threadIdx.x; work < works; work += kThreads) p.y[output_index(work)] = __float2bfloat16(value(work, 0));
    trace::stamp(trace::Kernel::unknown, trace::Mark::end);
    return;
  }
  // Tensor parallel: this rank's four values of each line go into y (this GPU); then the last
  // blocks to get here push y to the peers and sum it over the ranks, as the fused MLP's finishers
  // do; the others leave at once (every block pushing its own lines, or also waiting for the
  // peers', measured slower: docs/dist.md, "The all-reduce in the epilogues").
  for (int work = threadIdx.x; work < works; work += kThreads) {
    const __nv_bfloat162 low = __floats2bfloat162_rn(value(work, 0), value(work, 1));
    const __nv_bfloat162 high = __floats2bfloat162_rn(value(work, 2), value(work, 3));
    *reinterpret_cast<uint2*>(p.y + output_index(item_of(work, 0))) = {*reinterpret_cast<const uint32_t*>(&low),
                                                                      *reinterpret_cast<const uint32_t*>(&high)};
  }
  const int finisher = arrive(p);
  if (finisher >= 0) sum_over_ranks(p, finisher);
  trace::stamp(trace::Kernel::unknown, trace::Mark::end);
}

template <int kUnitRows>
cudaError_t launch_for_unit(const GemvResidualParams& p, cudaStream_t stream) {
  const int units = p.rows / kUnitRows;
  return cluster_gemv::dispatch(p.tokens, p.inner, units, [&](auto nt, auto c, bool spread, int sms) {
    constexpr int NT = decltype(nt)::value, C = decltype(c)::value;
    constexpr int kStages = cluster_gemv::ring_stages<NT, C>();
    // Two more ring stages where the packed cluster grid holds at most two blocks per SM and a
    // warp streams more k-steps than the default ring primes (Llama-3-8B's o_proj): the blocks
    // start while the attention before them finishes and have more of their weights in flight by
    // their upstream wait. No more than two: more measured slower, for a reason not established
    // (docs/kernels/qkv_rope_fused.md, "Two more ring stages for o_proj when its grid holds at most
    // two blocks per SM", re-measured at the end of "A deeper ring for the fused QKV kernel's spread
    // grids").
    constexpr int kDeepStages = kStages + 2;
    constexpr int kWarpsPerTile = cluster_gemv::kWarps / (kUnitRows / 16);
    const int warp_ksteps = cluster_gemv::max_ksteps_per_share<C * kWarpsPerTile>(p.inner);
    if constexpr (NT == 1 && C > 1)  // measured on the H200 only
      if (!spread && units * C <= 2 * sms && warp_ksteps >= kStages)
        return cluster_gemv::launch<NT, kUnitRows, C, kDeepStages>(
            gemv_residual_kernel<NT, kUnitRows, C, kDeepStages>, p, units, p.inner, stream, spread);
    return cluster_gemv::launch<NT, kUnitRows, C, kStages>(gemv_residual_kernel<NT, kUnitRows, C, kStages>, p, units,
                                                           p.inner, stream, spread);
  });
}

}  // namespace

cudaError_t launch_gemv_residual(const GemvResidualParams& p, cudaStream_t stream) {
  if (!p.x || !p.weights || !p.y || p.tokens < 1 || p.tokens > kGemvResidualMaxTokens || p.rows < 64 ||
      p.rows % 64 != 0 || p.inner < 64 || p.inner % 64 != 0 || static_cast<const void*>(p.x) == p.y ||
      (p.pending && !p.residual))
    return cudaErrorInvalidValue;
  if (p.exchange.active() && (p.pending || !p.exchange.holds(static_cast<size_t>(p.tokens) * p.rows) ||
                              reinterpret_cast<uintptr_t>(p.y) % sizeof(uint2) != 0))
    return cudaErrorInvalidValue;
  trace::attach_unit();
  // 128-row units (one tile per warp) when that still gives ~2 clusters of 8 per SM-pair on a
  // large GPU; 64-row units otherwise, so small projections still spread over every SM.
  if (p.rows % 128 == 0 && p.rows >= 4096) return launch_for_unit<128>(p, stream);
  return launch_for_unit<64>(p, stream);
}

}  // namespace deepfuse::kernels
