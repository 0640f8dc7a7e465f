// The flags_in_data protocol's device side (one_shot_all_reduce.hpp), shared by the one-shot
// all-reduce kernel and the epilogues that exchange their outputs themselves (line_exchange.hpp).
//
// A line is 16 bytes, {data0, epoch, data1, epoch}: four bf16 values and the call's epoch twice.
// Each (data, epoch) pair is one aligned 8-byte half of a 16-byte store, which NVLink delivers
// whole, so a reader that sees both epochs of a line sees its data: no fence and no separate flag
// (each costs an NVLink round trip in the flag protocol). The price is twice the bytes pushed.
// The epoch is one per call, the same for every block (a line can belong to different blocks in
// calls of different sizes, so per-block counts could repeat a value a line still holds).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "deepfuse/kernels/line_exchange.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"

namespace deepfuse::kernels::lines {

// ~10 s at the H100's 1.98 GHz boost clock: far past any exchange, short of a hung job.
constexpr long long kSpinLimitCycles = 20'000'000'000LL;

// Signal area words after the flag protocol's (flags[block][rank], then epochs[block], for 64
// blocks): the epoch of the last call, and how many of the running call's blocks have finished
// (the last one publishes the epoch and resets the count).
constexpr size_t kFlagProtocolWords = 64 * (kMaxTensorParallelRanks + 1);
constexpr size_t kEpochWord = kFlagProtocolWords;
constexpr size_t kBlocksDoneWord = kFlagProtocolWords + 1;
constexpr size_t kSignalWords = kFlagProtocolWords + 2;

__device__ __forceinline__ void store_line(uint4* address, const uint4& line) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(line.x), "r"(line.y),
               "r"(line.z), "r"(line.w)
               : "memory");
}

__device__ __forceinline__ uint4 load_line(const uint4* address) {
  uint4 line;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(line.x), "=r"(line.y), "=r"(line.z), "=r"(line.w)
               : "l"(address)
               : "memory");
  return line;
}

// The epoch of the call that starts now: read once the upstream grids are complete (the last
// call's last block published the one before). Never 0, which never-written lines hold.
__device__ __forceinline__ uint32_t next_epoch(const uint32_t* signals) {
  const uint32_t epoch = signals[kEpochWord] + 1;
  return epoch == 0 ? 1 : epoch;
}

// Called by one thread of each of the call's `blocks` blocks once the block is done with the
// call: the last one resets the count and publishes the epoch for the next call (read only after
// this grid completes).
__device__ __forceinline__ void finish_block(uint32_t* signals, uint32_t epoch, unsigned blocks) {
  if (atomicAdd(signals + kBlocksDoneWord, 1u) == blocks - 1) {
    signals[kBlocksDoneWord] = 0;
    signals[kEpochWord] = epoch;
  }
}

// The data of the line at `address` once both its epochs are `epoch`: two words, four bf16.
__device__ __forceinline__ uint2 wait_for_line(const uint4* address, uint32_t epoch) {
  const long long give_up = clock64() + kSpinLimitCycles;
  while (true) {
    const uint4 line = load_line(address);
    if (line.y == epoch && line.w == epoch) return {line.x, line.z};
    // A peer that never arrives (its rank failed) ends the kernel with an error after about ten
    // seconds instead of hanging the GPU (the engine then reports the failure).
    if (clock64() > give_up) __trap();
  }
}

// Adds four bf16 (two words) to sum; the first rank's values start the sum (not 0 + x, which
// would turn -0 into +0), as the reference does.
__device__ __forceinline__ void add_words(float (&sum)[4], uint2 words, bool first) {
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words.y));
  const float v[4] = {low.x, low.y, high.x, high.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) sum[i] = first ? v[i] : sum[i] + v[i];
}

// Pushes this rank's four values of line `line` to every peer (posted stores, nothing waits).
__device__ __forceinline__ void push_line(const LineExchange& x, size_t line, uint2 own, uint32_t epoch) {
  const uint4 pushed = {own.x, epoch, own.y, epoch};
  for (int q = 0; q < x.ranks; ++q)
    if (q != x.rank) store_line(x.lines[q] + x.rank * x.line_stride + line, pushed);
}

// The sum of line `line` over the ranks in rank order, rounded once to bf16, this rank's own
// values given, the peers' waited for in this GPU's line area.
__device__ __forceinline__ uint2 sum_line(const LineExchange& x, size_t line, uint2 own, uint32_t epoch) {
  float sum[4];
  const uint4* const local = x.lines[x.rank];
  for (int q = 0; q < x.ranks; ++q)
    add_words(sum, q == x.rank ? own : wait_for_line(local + q * x.line_stride + line, epoch), q == 0);
  const __nv_bfloat162 low = __floats2bfloat162_rn(sum[0], sum[1]), high = __floats2bfloat162_rn(sum[2], sum[3]);
  return {*reinterpret_cast<const uint32_t*>(&low), *reinterpret_cast<const uint32_t*>(&high)};
}

}  // namespace deepfuse::kernels::lines
