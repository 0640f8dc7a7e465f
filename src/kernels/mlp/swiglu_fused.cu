// DeepFusion SwiGLU MLP: y = down(silu(x·Wg^T) * (x·Wu^T)) (+ residual) in ONE launch.
// Design, versions tried and their timings: docs/kernels/swiglu_fused.md.
//
// The two numbers (decode, M <= 16 tokens): bytes = 3·H·I·2 of weights, FLOPs = 6·M·H·I, i.e.
// ~2·M FLOP per weight byte, far under the H200's ~180 FLOP/byte: the floor is weight bytes over
// the copy bandwidth (82 µs for Llama-3-8B's 4096x14336 at 4.3 TB/s).
//
// Work split. The grid is made of clusters of C blocks (C = 1, 2, 4 or 8; Hopper thread-block
// clusters), each owning a contiguous slice of the intermediate dimension I (16-row tiles;
// FusedWork). Per pass of up to 32 tokens, the kernel's phases:
//   gate_up_pass      the cluster's warps (8 or 16 per block) split the slice's (tile, k-step)
//                     space into equal ranges: g = x·Wg^T and u = x·Wu^T. Sums a range boundary
//                     cuts meet in the shared memory of the tile's owner block through
//                     distributed-shared-memory atomics. Every block does the same work whatever
//                     the tile count, so no block waits at the barrier for another.
//   push_activations  each owner computes act = bf16(silu(g)*u) for its tiles and pushes it into
//                     every block of the cluster: each block then holds the activations of the slice.
//   down_pass         block r multiplies them by Wd (DownStream) for its 1/C of the output rows: a
//                     partial y, summed over clusters in an fp32 accumulator in L2 (reduce_partial_y;
//                     sm_90: each warp stages its rows in shared memory, one cp.reduce.async.bulk
//                     per token and run of rows).
//   finish_output     the last `finishers` blocks to arrive convert the accumulator to bf16
//                     (+residual), and zero it and the counters for the next launch; with
//                     defer_sum there is no finish: the kernels after this one add the
//                     accumulator where y would go and zero it.
// Tensor parallel, the finishers also sum y over the ranks (exchange), and before phase 1 every
// cluster may sum x over the ranks (x_exchange): line_exchange.hpp.
// The intermediate never leaves the chip; HBM sees the weights once, plus x and y. Clusters cut
// the partial sums per output element from the block count to the cluster count. Two cluster
// barriers per pass of tokens; phase 2's first loads are issued before them.
//
// Tensor cores: mma.m16n8k16 with weights on the 16-row side and tokens on the 8-wide side, so
// M = 1..8 costs one n-tile. Weights are pre-packed in fragment order (fragment.cuh): each lane
// fetches its A operand with one coalesced 16-byte copy. Each thread streams its fragments (and
// x's B-fragment words) through its own column of a cp.async ring in shared memory, 3-5 stages
// deep: bytes in flight without holding registers.
// Tokens beyond 32 go in passes of 32 (weights re-read per pass): large M is unfused territory.
#include "deepfuse/kernels/swiglu_fused.hpp"

#include <cooperative_groups.h>

#include <algorithm>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "kernels/all_reduce/line_exchange.cuh"
#include "kernels/common/async_ring.cuh"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/common/shared_opt_in.hpp"
#include "kernels/common/trace.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/mlp/silu.cuh"

#include "kernels/mlp/swiglu_fused_config.cuh"

namespace deepfuse::kernels {
namespace {


// ---- Phase 2's weight stream. The ring issues and consumes k-steps in order, once each, so both
// sides keep running positions instead of dividing f: a runtime division is ~20 dependent
// instructions, and the instruction latency per k-step, not DRAM, bounded each warp's rate
// (docs/kernels/swiglu_fused.md, "The bound was instruction latency, not DRAM: no divisions per
// k-step"). down: [I tile][row tile][32 lanes] uint4; rows past the block's share are zero-filled.
template <int NT, int C>
struct DownStream {
  static constexpr int RT = FusedConfig<NT, C>::kRowTiles;
  const FusedWork<NT, C>& work;
  size_t k_stride;
  const uint4* slice;
  int group, k;          // f = group * k2_steps + k
  const uint4* source;   // this k-step's I tile, row tile 0
  int row_offset[RT];    // uint4 offsets of the group's row tiles
  bool row_valid[RT];

  // fp8: one load per row tile carries two I tiles (pack_swiglu_down_fp8): the slice starts at
  // the cluster's first pair.
  __device__ __forceinline__ DownStream(const SwigluFusedParams& p, const FusedWork<NT, C>& w, int lane, bool fp8)
      : work(w) {
    k_stride = static_cast<size_t>(work.h_tiles) * 32;
    slice = p.down + static_cast<size_t>(work.cluster_begin / (fp8 ? 2 : 1)) * k_stride + lane;
  }
  __device__ __forceinline__ void seek_group(int g) {
    group = g;
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      const int local = g * RT + r;
      row_valid[r] = local < work.rows;
      row_offset[r] = work.row_tile_of(local) * 32;
    }
  }
  __device__ __forceinline__ void seek(int f) {
    const int g = f / work.k2_steps, kk = f - g * work.k2_steps;
    seek_group(g);
    k = kk;
    source = slice + static_cast<size_t>(kk) * k_stride;
  }
  __device__ __forceinline__ void issue(SharedStorage<NT, C>& shared, uint64_t streamed, int tid, int stage, int step) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
      copy16_async_streamed(&shared.ring16[stage][step * RT + r][tid], source + row_offset[r], streamed, row_valid[r]);
    source += k_stride;
    if (++k == work.k2_steps) {
      k = 0;
      source = slice;
      seek_group(group + 1);
    }
  }
};

// ---- Phase 1: g = x·Wg^T and u = x·Wu^T over this warp's range of the cluster's (tile, k-step)
// space, for the pass's tokens token0.. . Each tile's sums (or a range's part of them) are added
// into the tile owner's shared memory.
// fp8: one load per k-step holds the gate and up fragments (e4m3, widened to f16 here), a second
// one the k-step's x B-fragments, already f16 times the norm weight (stage_x_fragments), into the
// ring slot bf16 gives the up fragments; each tile's sums are scaled by their rows' scales as they
// are handed over.
template <int NT, int C, bool kFp8>
__device__ __forceinline__ void gate_up_pass(const SwigluFusedParams& p, SharedStorage<NT, C>& shared,
                                             const FusedWork<NT, C>& work, int token0, uint64_t streamed, bool normalize,
                                             int rank, int warp, int lane) {
  using Config = FusedConfig<NT, C>;
  constexpr int S = Config::kStages, kWarps = Config::kWarps, kThreads = Config::kThreads;
  const int tid = threadIdx.x, g = lane / 4, t = lane % 4;
  const int h_tiles = work.h_tiles, f1_begin = work.f1_begin, f1_end = work.f1_end;
  const __nv_bfloat16* x_row[NT];
  bool token_valid[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int token = token0 + nt * 8 + g;
    token_valid[nt] = token < p.tokens;
    x_row[nt] = p.x + static_cast<size_t>(token_valid[nt] ? token : 0) * p.hidden + 2 * t;
  }
  // Running positions of the issue side: k-step within the tile, weights of the k-step.
  int issue_k = f1_begin % h_tiles;
  const uint4* issue_weights = work.gate_up + static_cast<size_t>(f1_begin) * (kFp8 ? 32 : 64);
  // FP8: this lane's x fragments of the k-step ([k-step][32 lanes] x 8 bytes per n-tile),
  // zero-filled past the tokens (the n-tiles with this lane's token are a prefix). One n-tile: an
  // 8-byte copy or none, by a predicate; two: 16 bytes, of which the first 8 or all are read.
  const uint2* x_fragments = reinterpret_cast<const uint2*>(p.x_fragments) + lane * NT;
  const uint2* issue_x = x_fragments + issue_k * 32 * NT;
  int x_bytes = 0;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) x_bytes += token_valid[nt] ? 8 : 0;
  auto issue = [&](int, int stage, int step) {
    // gate_up: [tile][k-step][gate | up][32 lanes] uint4 (fp8: [tile][k-step][32 lanes] uint4 of
    // gate | up); x words zero-filled past M
    copy16_async_streamed(&shared.ring16[stage][step * 2][tid], issue_weights, streamed);
    if constexpr (kFp8) {
      if constexpr (NT == 1)
        copy8_async(&shared.ring16[stage][step * 2 + 1][tid], issue_x, token_valid[0]);
      else
        copy16_async_prefix(&shared.ring16[stage][step * 2 + 1][tid], issue_x, x_bytes);
      issue_x += 32 * NT;
    } else {
      copy16_async_streamed(&shared.ring16[stage][step * 2 + 1][tid], issue_weights + 32, streamed);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t* words = &shared.ring4[stage][step * Config::kXWords + nt * 2][0];
        copy4_async(words + tid, x_row[nt] + issue_k * 16, token_valid[nt]);
        copy4_async(words + kThreads + tid, x_row[nt] + issue_k * 16 + 8, token_valid[nt]);
      }
    }
    issue_weights += kFp8 ? 32 : 64;
    if (++issue_k == h_tiles) {
      issue_k = 0;
      if constexpr (kFp8) issue_x = x_fragments;
    }
  };
  float acc_gate[NT][4] = {}, acc_up[NT][4] = {};
  ring_prime<S, Config::kSteps1>(f1_begin, f1_end, issue);
  // RMSNorm folded in: the norm weight is in the packed columns, the sums are scaled by
  // 1/rms(x) before the SiLU, so each block only adds x^2 over its 1/C of H while its first
  // loads are in flight.
  if (normalize) add_norm_squares<C, kWarps>(p, shared.norm_squares, token0, 8 * NT, rank, warp, lane);
  // ... and of the consume side: k-step within the tile, the tile (cluster-local).
  int consume_k = f1_begin % h_tiles, consume_tile = f1_begin / h_tiles;
  ring_run<S, Config::kSteps1>(f1_begin, f1_end, issue, [&](int f, int stage, int step) {
    if constexpr (kFp8) {
      const uint4 packed = shared.ring16[stage][step * 2][tid];
      const uint4 gate = e4m3_fragment_to_f16(packed.x, packed.y), up = e4m3_fragment_to_f16(packed.z, packed.w);
      const uint4 x_words = shared.ring16[stage][step * 2 + 1][tid];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = nt == 0 ? x_words.x : x_words.z, b1 = nt == 0 ? x_words.y : x_words.w;
        mma_f16_m16n8k16(acc_gate[nt], gate, b0, b1);
        mma_f16_m16n8k16(acc_up[nt], up, b0, b1);
      }
    } else {
      const uint4 gate = shared.ring16[stage][step * 2][tid];
      const uint4 up = shared.ring16[stage][step * 2 + 1][tid];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b0 = shared.ring4[stage][step * Config::kXWords + nt * 2][tid];
        const uint32_t b1 = shared.ring4[stage][step * Config::kXWords + nt * 2 + 1][tid];
        mma_bf16_m16n8k16(acc_gate[nt], gate, b0, b1);
        mma_bf16_m16n8k16(acc_up[nt], up, b0, b1);
      }
    }
    if (consume_k == h_tiles - 1 || f == f1_end - 1) {  // tile or range ends: hand over
      const int owner = split_owner(work.cluster_tiles, C, consume_tile);
      float* sums = in_block<C>(shared.sums, owner);
      const int owned = consume_tile - split_point(work.cluster_tiles, C, owner);
      if constexpr (kFp8) {  // per-row scales: rows g and g + 8 of the tile, gate then up
        const int row = (work.cluster_begin + consume_tile) * 16 + g;
        const float gate_low = p.gate_up_scales[row], gate_high = p.gate_up_scales[row + 8];
        const float up_low = p.gate_up_scales[p.intermediate + row], up_high = p.gate_up_scales[p.intermediate + row + 8];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          acc_gate[nt][0] *= gate_low, acc_gate[nt][1] *= gate_low, acc_gate[nt][2] *= gate_high, acc_gate[nt][3] *= gate_high;
          acc_up[nt][0] *= up_low, acc_up[nt][1] *= up_low, acc_up[nt][2] *= up_high, acc_up[nt][3] *= up_high;
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          atomicAdd(&sums[sum_index<NT>(owned, 0, nt, c, lane)], acc_gate[nt][c]);
          atomicAdd(&sums[sum_index<NT>(owned, 1, nt, c, lane)], acc_up[nt][c]);
          acc_gate[nt][c] = 0.0f;
          acc_up[nt][c] = 0.0f;
        }
    }
    if (++consume_k == h_tiles) consume_k = 0, ++consume_tile;
  });
}

// ---- act = bf16(silu(g) * u) for this block's tiles, pushed into every block of the cluster;
// the sums are left zero for the next pass.
template <int NT, int C, bool kFp8>
__device__ __forceinline__ void push_activations(const SwigluFusedParams& p, SharedStorage<NT, C>& shared,
                                                 const FusedWork<NT, C>& work, bool normalize, int rank, int warp,
                                                 int lane) {
  using Config = FusedConfig<NT, C>;
  const int g = lane / 4, t = lane % 4;
  const int own_tiles = split_point(work.cluster_tiles, C, rank + 1) - work.own_begin;
  for (int tile = warp; tile < own_tiles; tile += Config::kWarps) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int column = (work.own_begin + tile) * 16 + g + (c >= 2 ? 8 : 0);
        const int token = nt * 8 + 2 * t + (c & 1);
        float& gate_sum = shared.sums[sum_index<NT>(tile, 0, nt, c, lane)];
        float& up_sum = shared.sums[sum_index<NT>(tile, 1, nt, c, lane)];
        const float inverse_rms = normalize ? rsqrtf(shared.norm_squares[token] / p.hidden + p.norm_eps) : 1.0f;
        const float gate = gate_sum * inverse_rms, up = up_sum * inverse_rms;
        // fp8: act is the f16 B operand of phase 2's f16 MMAs (the same 16 bits of storage).
        const float activation = silu(gate) * up;
        __nv_bfloat16 value;
        if constexpr (kFp8)
          value = __ushort_as_bfloat16(static_cast<unsigned short>(f16x2_saturated(activation, 0.0f) & 0xffffu));
        else
          value = __float2bfloat16(activation);
        for (int destination = 0; destination < C; ++destination)
          in_block<C>(&shared.act[0][0], destination)[token * Config::kActStride + column] = value;
        gate_sum = 0.0f;  // ready for the next pass
        up_sum = 0.0f;
      }
  }
}

// ---- Adds the warp's partial y of one phase-2 group (RT row tiles x the pass's tokens) into the
// accumulator. sm_90: staged in shared memory as one row per token, then one bulk reduction per
// token and run of consecutive row tiles, issued by the token's lane. Before sm_90, one atomic
// per value.
template <int NT, int C>
__device__ __forceinline__ void reduce_partial_y(const SwigluFusedParams& p, SharedStorage<NT, C>& shared,
                                                 const FusedWork<NT, C>& work, int group, int token0,
                                                 const float (&acc)[FusedConfig<NT, C>::kRowTiles][NT][4], int warp,
                                                 int lane) {
  using Config = FusedConfig<NT, C>;
  constexpr int RT = Config::kRowTiles;
  const int rows = work.rows;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int g = lane / 4, t = lane % 4;
  float (*staging)[Config::kStagingStride] = shared.staging[warp];
  const int pass_tokens = min(Config::kTokensPerPass, p.tokens - token0);
  bulk_wait_read();  // this lane's reductions of the last group have read their row
  __syncwarp();
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        staging[nt * 8 + 2 * t + (c & 1)][r * 16 + g + (c >= 2 ? 8 : 0)] = acc[r][nt][c];
  fence_shared_for_bulk();
  __syncwarp();
  if (lane < pass_tokens) {
    float* token_row = p.accumulator + static_cast<size_t>(token0 + lane) * p.hidden;
    // The group's valid row tiles are a prefix; they are consecutive except where the
    // rotation wraps around at h_tiles.
    for (int r = 0; r < RT && group * RT + r < rows;) {
      const int first = work.row_tile_of(group * RT + r);
      int run = 1;
      while (r + run < RT && group * RT + r + run < rows && work.row_tile_of(group * RT + r + run) == first + run)
        ++run;
      bulk_add_f32(token_row + first * 16, &staging[lane][r * 16], run * 64);
      r += run;
    }
    bulk_commit();
  }
#else
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      if (group * RT + r < rows)
        add_tile_to_accumulator(p.accumulator, p.hidden, p.tokens, work.row_tile_of(group * RT + r) * 16,
                                token0 + nt * 8, acc[r][nt], lane);
#endif
}

// ---- Phase 2: partial y rows = act · Wd[rows, slice]^T, summed in L2. Its first loads were
// issued before the barriers (ring_prime with the same stream).
// fp8: each load carries two I tiles of a row tile (widened to f16, against f16 act), and each
// row's sums are scaled by its down scale before they are reduced.
template <int NT, int C, bool kFp8>
__device__ __forceinline__ void down_pass(const SwigluFusedParams& p, SharedStorage<NT, C>& shared,
                                          const FusedWork<NT, C>& work, DownStream<NT, C>& down, int token0,
                                          uint64_t streamed, int warp, int lane) {
  using Config = FusedConfig<NT, C>;
  constexpr int S = Config::kStages, RT = Config::kRowTiles;
  const int tid = threadIdx.x, g = lane / 4, t = lane % 4;
  const int k2_steps = work.k2_steps, f2_begin = work.f2_begin, f2_end = work.f2_end;
  auto issue_down = [&](int, int stage, int step) { down.issue(shared, streamed, tid, stage, step); };
  float acc[RT][NT][4] = {};
  int group = f2_begin / k2_steps, k = f2_begin - group * k2_steps;  // running, as on the issue side
  ring_run<S, Config::kSteps2>(f2_begin, f2_end, issue_down, [&](int f, int stage, int step) {
    uint4 a[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) a[r] = shared.ring16[stage][step * RT + r][tid];
    if constexpr (kFp8) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const auto* act_row = reinterpret_cast<const uint32_t*>(&shared.act[nt * 8 + g][(2 * k + half) * 16 + 2 * t]);
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            const uint4 widened = half == 0 ? e4m3_fragment_to_f16(a[r].x, a[r].y) : e4m3_fragment_to_f16(a[r].z, a[r].w);
            mma_f16_m16n8k16(acc[r][nt], widened, act_row[0], act_row[4]);
          }
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __nv_bfloat16* act_row = &shared.act[nt * 8 + g][k * 16 + 2 * t];
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(act_row);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(act_row + 8);
#pragma unroll
        for (int r = 0; r < RT; ++r) mma_bf16_m16n8k16(acc[r][nt], a[r], b0, b1);
      }
    }
    if (k == k2_steps - 1 || f == f2_end - 1) {  // group or range ends: reduce into L2
      // Braced: a pragma right after an unbraced if is the if's whole body to nvcc, which left the
      // loop below running in the bf16 instances too.
      if constexpr (kFp8) {
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          if (group * RT + r >= work.rows) continue;
          const int row = work.row_tile_of(group * RT + r) * 16 + g;
          const float low = p.down_scales[row], high = p.down_scales[row + 8];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            acc[r][nt][0] *= low, acc[r][nt][1] *= low, acc[r][nt][2] *= high, acc[r][nt][3] *= high;
        }
      }
      reduce_partial_y(p, shared, work, group, token0, acc, warp, lane);
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[r][nt][c] = 0.0f;
    }
    if (++k == k2_steps) k = 0, ++group;
  });
  // The reductions have reached L2 before the finish's ticket, and the staging rows are free
  // for the next pass's x words.
  bulk_wait_complete();
}

// ---- Finish: the last `finishers` blocks to arrive convert the accumulator to bf16 (+ residual)
// into y, zero it and the counters for the next launch; tensor parallel, they also sum y over the
// ranks (each quad of y pushed to every peer, then summed: the same quads on every rank, since
// the finishers and their split are the same there).
template <int NT, int C>
__device__ __forceinline__ void finish_output(const SwigluFusedParams& p, SharedStorage<NT, C>& shared, int finishers,
                                              bool exchange, uint32_t epoch) {
  constexpr int kThreads = FusedConfig<NT, C>::kThreads;
  const int tid = threadIdx.x;
  __threadfence();  // this thread's reductions are visible before the block's arrival counts
  __syncthreads();
  if (tid == 0) shared.ticket = atomicAdd(&p.counters[0], 1u);
  __syncthreads();
  const unsigned blocks = gridDim.x;
  const unsigned ticket = shared.ticket;
  if (ticket < blocks - finishers) return;
  if (tid == 0) {
    // The grid is co-resident (the launcher sizes it so), so the stragglers are running.
    while (*reinterpret_cast<volatile unsigned*>(&p.counters[0]) < blocks) __nanosleep(64);
  }
  __syncthreads();
  __threadfence();
  const int finisher = static_cast<int>(ticket - (blocks - finishers));
  const int quads = p.tokens * p.hidden / 4;
  const int quad_begin = split_point(quads, finishers, finisher);
  const int quad_end = split_point(quads, finishers, finisher + 1);
  for (int quad = quad_begin + tid; quad < quad_end; quad += kThreads) {
    float4* partial = reinterpret_cast<float4*>(p.accumulator) + quad;
    const float4 v = __ldcg(partial);
    // No residual: add bf16 zeros (+0.0f leaves every sum as it is).
    const uint2 residual = p.residual ? *reinterpret_cast<const uint2*>(p.residual + quad * 4) : make_uint2(0, 0);
    const uint2 own = make_uint2(residual_sum_pair(v.x, v.y, residual.x), residual_sum_pair(v.z, v.w, residual.y));
    *reinterpret_cast<uint2*>(p.y + quad * 4) = own;
    *partial = make_float4(0, 0, 0, 0);
    if (exchange) lines::push_line(p.exchange, quad, own, epoch);
  }
  if (exchange)
    for (int quad = quad_begin + tid; quad < quad_end; quad += kThreads) {
      auto* y = reinterpret_cast<uint2*>(p.y + quad * 4);
      *y = lines::sum_line(p.exchange, quad, *y, epoch);
    }
  __syncthreads();
  trace::stamp(trace::Kernel::unknown, trace::Mark::finish);
  if (tid == 0) {
    // Not after an exchange: this thread's pushes to the peers would make the fence wait an NVLink
    // round trip, and the counts are read only after this grid completes.
    if (!exchange) __threadfence();
    // The last finisher resets the counters: every finisher has left its wait loop by now.
    if (atomicAdd(&p.counters[1], 1u) == static_cast<unsigned>(finishers) - 1) {
      p.counters[0] = 0;
      p.counters[1] = 0;
    }
    if (exchange) lines::finish_block(p.exchange.signals, epoch, finishers);
  }
}

template <int NT, int C, bool kFp8>
__global__ void __launch_bounds__(FusedConfig<NT, C>::kThreads, FusedConfig<NT, C>::kBlocksPerSm)
    swiglu_fused_kernel(const SwigluFusedParams p, int finishers) {
  using Config = FusedConfig<NT, C>;
  constexpr int S = Config::kStages, kThreads = Config::kThreads;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  auto& shared = *reinterpret_cast<SharedStorage<NT, C>*>(shared_raw);
  trace::stamp(trace::Kernel::fused_mlp, trace::Mark::start);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rank = blockIdx.x % C;
  const FusedWork<NT, C> work(p, warp, kFp8);
  const uint64_t streamed = evict_first_policy();  // the weights are read once
  DownStream<NT, C> down(p, work, lane, kFp8);
  auto issue_down = [&](int, int stage, int step) { down.issue(shared, streamed, tid, stage, step); };
  for (int i = tid; i < Config::kSumFloats; i += kThreads) shared.sums[i] = 0.0f;
  if (tid < 8 * NT) shared.norm_squares[tid] = 0.0f;
  const bool normalize = p.rms_normalize;
  // Launched programmatically (launches_programmatically), this grid may start before the kernel
  // that writes x has finished: nothing global is touched above this wait.
  wait_for_upstream_grids();
  // A programmatic next kernel (the next layer's fused QKV) may launch now: its blocks take the
  // SMs this grid's blocks leave as they finish (the grid is already resident) and start their
  // weight loads, then wait for this grid to complete before reading y. Faster in the step than
  // the trigger after phase 2 (docs/kernels/swiglu_fused.md, "Overlap with the kernels around it").
  allow_downstream_launch();
  // Tensor parallel: one epoch for both exchanges of the call (the slots' line areas differ).
  const bool exchange = p.exchange.active();
  const uint32_t epoch = exchange ? lines::next_epoch(p.exchange.signals) : 0;
  if (p.x_exchange.active()) sum_input_over_ranks<C, kThreads>(p, epoch, rank, tid);
  // FP8 calls are one pass of at most two n-tiles, the tokens x_fragments holds.
  static_assert(kSwigluFusedFp8MaxTokens <= 16, "FP8 x fragments hold 16 tokens");
  if constexpr (kFp8) stage_x_fragments<NT, C, kThreads>(p, rank, tid);
  // Every block's sums are zero before anyone adds into them (and x is summed, its FP8 fragments
  // written).
  cluster_barrier<C>();

  for (int token0 = 0; token0 < p.tokens; token0 += Config::kTokensPerPass) {
    gate_up_pass<NT, C, kFp8>(p, shared, work, token0, streamed, normalize, rank, warp, lane);
    trace::stamp(trace::Kernel::unknown, trace::Mark::phase);
    // Phase 2's first loads go out now, so the memory pipe stays full across the barriers below.
    down.seek(work.f2_begin);
    ring_prime<S, Config::kSteps2>(work.f2_begin, work.f2_end, issue_down);
    cluster_barrier<C>();  // every g and u of the cluster is summed at its owner
    trace::stamp(trace::Kernel::unknown, trace::Mark::barrier);
    push_activations<NT, C, kFp8>(p, shared, work, normalize, rank, warp, lane);
    cluster_barrier<C>();  // every block holds the cluster's activations
    // Every reader of this pass's norm_squares is past the barrier; other blocks add the next
    // pass's only after the end-of-pass barrier.
    if (tid < 8 * NT) shared.norm_squares[tid] = 0.0f;
    down_pass<NT, C, kFp8>(p, shared, work, down, token0, streamed, warp, lane);
    if (token0 + Config::kTokensPerPass < p.tokens)
      cluster_barrier<C>();  // the next pass pushes into act, which other blocks may still read
  }

  trace::stamp(trace::Kernel::unknown, trace::Mark::end);
  if (p.defer_sum) return;  // the sums stay in the accumulator for the kernels after this one
  finish_output(p, shared, finishers, exchange, epoch);
}

// Whether the (NT, C) instance launches as a programmatic dependent when the caller allows it
// (FusedMlpTuning::programmatic_launch): its blocks may start while the kernel before finishes and
// wait for it first thing. Only calls of up to 8 tokens on the grids that cover every SM
// (clusters of 2 or 4) gain in the decode step; clusters of 8, placed while o_proj's blocks still
// hold SMs, lose (docs/kernels/swiglu_fused.md, "The MLP as a programmatic dependent again" and "At
// up to 8 tokens, and a programmatic launch at one token").
template <int NT, int C>
bool launches_programmatically(const FusedMlpTuning& tuning) {
  return tuning.programmatic_launch && NT == 1 && (C == 2 || C == 4);
}

// The launch configuration of `blocks` blocks of the (NT, C) instance, in clusters of C.
template <int NT, int C>
struct FusedLaunch : ClusterLaunch {
  FusedLaunch(int blocks, cudaStream_t stream, bool programmatic = false)
      : ClusterLaunch(static_cast<unsigned>(blocks), FusedConfig<NT, C>::kThreads, sizeof(SharedStorage<NT, C>), C,
                      stream, programmatic) {}
};

// How many blocks can be resident at once for one (NT, C) instantiation on this device: the
// grid never exceeds it, so the finishers' wait for stragglers always ends.
struct Residency {
  int sm_count = 0;
  int max_blocks_per_sm = 0;  // without clusters
  int max_clusters = 0;       // with clusters of C (C > 1)
};

template <int NT, int C, bool kFp8>
cudaError_t residency_for(Residency& out) {
  static PerDevice<Residency> known;
  return known.get(out, [](Residency& r) {
    DeviceAttributes attributes;
    if (cudaError_t e = current_device_attributes(attributes); e != cudaSuccess) return e;
    r.sm_count = attributes.sm_count;
    if (C > 1 && !attributes.has_clusters()) return cudaSuccess;  // max_clusters stays 0: unsupported here
    const int smem = static_cast<int>(sizeof(SharedStorage<NT, C>));
    auto kernel = swiglu_fused_kernel<NT, C, kFp8>;
    if (cudaError_t e = opt_in_blocks_per_sm(kernel, FusedConfig<NT, C>::kThreads, smem, r.max_blocks_per_sm);
        e != cudaSuccess)
      return e;
    if (C > 1) {
      const FusedLaunch<NT, C> probe(C * r.sm_count, nullptr);
      return cudaOccupancyMaxActiveClusters(&r.max_clusters, kernel, &probe.config);
    }
    return cudaSuccess;
  });
}

template <int NT, int C, bool kFp8>
cudaError_t launch_instance(const SwigluFusedParams& p, const FusedMlpTuning& tuning, cudaStream_t stream) {
  static_assert(sizeof(SharedStorage<NT, C>) <= FusedConfig<NT, C>::kMaxSharedBytes,
                "fused MLP shared memory no longer fits the blocks per SM its configuration wants");
  Residency residency;
  if (cudaError_t e = residency_for<NT, C, kFp8>(residency); e != cudaSuccess) return e;
  if (C > 1 && residency.max_clusters < 1) return cudaErrorNotSupported;
  if (residency.max_blocks_per_sm < 1) return cudaErrorInvalidConfiguration;
  const int i_tiles = p.intermediate / 16;
  // A block holds at most kMaxTilesPerBlock tiles: raise the requested occupancy if I needs it.
  constexpr int kMaxTilesPerBlock = FusedConfig<NT, C>::kMaxTilesPerBlock;
  const int needed_per_sm = (i_tiles + kMaxTilesPerBlock * residency.sm_count - 1) / (kMaxTilesPerBlock * residency.sm_count);
  const int requested = tuning.blocks_per_sm > 0 ? tuning.blocks_per_sm : residency.max_blocks_per_sm;
  const int per_sm = std::min(std::max(requested, needed_per_sm), residency.max_blocks_per_sm);
  int resident = residency.sm_count * per_sm;
  if (C > 1) resident = std::min(resident, residency.max_clusters * C);
  // At least one tile of I per block, at least one cluster, whole clusters only.
  int blocks = std::min(i_tiles, resident) / C * C;
  // FP8 clusters take I in tile pairs (FusedWork): a block may own up to one pair's worth more.
  if (blocks < C) return cudaErrorInvalidConfiguration;
  const int clusters = blocks / C;
  const int tiles_per_block = kFp8 ? (2 * ((i_tiles / 2 + clusters - 1) / clusters) + C - 1) / C
                                   : (i_tiles + blocks - 1) / blocks;
  if (tiles_per_block > kMaxTilesPerBlock) return cudaErrorInvalidConfiguration;
  const int finishers = std::max(1, std::min({kMaxFinishers, blocks / 2, resident / 2}));

  trace::attach_unit();
  const FusedLaunch<NT, C> launch(blocks, stream, launches_programmatically<NT, C>(tuning));
  return cudaLaunchKernelEx(&launch.config, swiglu_fused_kernel<NT, C, kFp8>, p, finishers);
}

template <int NT, bool kFp8>
cudaError_t launch_for_tokens(const SwigluFusedParams& p, const FusedMlpTuning& tuning, cudaStream_t stream) {
  // Clusters of 2 fit every GPC, so the grid covers every SM, at the price of more partial sums
  // per output row; clusters of 4 pack two blocks on every SM; clusters of 8 must fit in a GPC and
  // leave SMs empty, but share each activation among the most blocks. The rule below is what
  // measured fastest per token count and shape (docs/kernels/swiglu_fused.md, "Clusters of 4 or 8",
  // "Clusters of 2", "Clusters of 2 on one block per SM: half the partial sums" and "Partial sums
  // as bulk reductions"): pairs up to H = 4096 at 9-16 tokens, and at up to 8 tokens wherever
  // H < 8192 or I >= 3H/4; else clusters of 4 at 9-16 tokens (and beyond 16), 8 at up to 8 tokens.
  const bool pairs = (NT == 2 && p.hidden <= 4096) ||
                     (NT == 1 && (p.hidden < 8192 || 4 * p.intermediate >= 3 * p.hidden));
  const bool four = p.hidden <= 2048 || NT == 2;
  int cluster = tuning.cluster_size > 0 ? tuning.cluster_size : pairs ? 2 : four ? 4 : 8;
  DeviceAttributes device;
  if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
  if (!device.has_clusters()) cluster = 1;
  const int i_tiles = p.intermediate / 16;  // a cluster needs at least one tile per block
  // NT = 4 with clusters of 8 would need 66 KB of exchanged activations: too much next to the ring.
  if constexpr (NT < 4)
    if (cluster >= 8 && i_tiles >= 8) return launch_instance<NT, 8, kFp8>(p, tuning, stream);
  if constexpr (NT <= 2)
    if (cluster == 2 && i_tiles >= 2) return launch_instance<NT, 2, kFp8>(p, tuning, stream);
  if (cluster >= 4 && i_tiles >= 4) return launch_instance<NT, 4, kFp8>(p, tuning, stream);
  return launch_instance<NT, 1, kFp8>(p, tuning, stream);
}

}  // namespace

namespace {

// 16-row tiles of I an SM's resident blocks own at once in passes of 8 NT tokens: with clusters
// every instance holds 16 warps an SM (one 16-warp block or two of 8); without, 8-warp blocks (C =
// 1), as many as the SM's shared memory holds, at most the configuration's.
template <int NT>
int resident_tiles_per_sm(const SwigluFusedDevice& device) {
  if (device.clusters) return FusedConfig<NT, 4>::kMaxTilesPerBlock * FusedConfig<NT, 4>::kBlocksPerSm;
  using Config = FusedConfig<NT, 1>;
  const int block_bytes = static_cast<int>(sizeof(SharedStorage<NT, 1>)) + kSharedReservedPerBlock;
  return Config::kMaxTilesPerBlock * std::min(Config::kBlocksPerSm, device.shared_bytes_per_sm / block_bytes);
}

}  // namespace

std::string swiglu_fused_unsupported(int hidden, int intermediate, int tokens, const SwigluFusedDevice& device,
                                     WeightFormat format) {
  if (format != WeightFormat::bf16 && format != WeightFormat::fp8_e4m3)
    return std::string("the fused MLP reads bf16 or per-row-scaled fp8_e4m3 weights, not ") + weight_format_name(format);
  if (format == WeightFormat::fp8_e4m3 && tokens > kSwigluFusedFp8MaxTokens)
    return "the fused MLP takes at most " + std::to_string(kSwigluFusedFp8MaxTokens) + " tokens of FP8 weights";
  if (!swiglu_fused_valid_shape(hidden, intermediate))
    return "the fused MLP needs hidden and intermediate sizes that are multiples of 64";
  if (tokens < 1) return "the fused MLP needs at least one token";
  const int tiles = tokens <= 8    ? resident_tiles_per_sm<1>(device)
                    : tokens <= 16 ? resident_tiles_per_sm<2>(device)
                                   : resident_tiles_per_sm<4>(device);
  if (device.sms > 0 && intermediate / 16 > tiles * device.sms)
    return "the fused MLP's resident blocks hold at most " + std::to_string(16 * tiles * device.sms) +
           " intermediate rows on this GPU at " + std::to_string(tokens) + " tokens";
  return "";
}

size_t swiglu_fused_accumulator_floats(int hidden, int max_tokens) {
  return static_cast<size_t>(hidden) * max_tokens;
}

size_t swiglu_fused_x_fragments_bytes(int hidden) {
  // Per k-step, 32 lanes x 16 bytes: 16 columns of 16 tokens in f16 (stage_x_fragments; calls of
  // up to 8 tokens use the first half).
  return static_cast<size_t>(hidden / 16) * 32 * sizeof(uint4);
}

cudaError_t launch_swiglu_fused(const SwigluFusedParams& p, const FusedMlpTuning& tuning, cudaStream_t stream) {
  if (!swiglu_fused_valid_shape(p.hidden, p.intermediate) || p.tokens < 1 || !p.x || !p.gate_up || !p.down ||
      (!p.y && !p.defer_sum) || !p.accumulator || !p.counters)
    return cudaErrorInvalidValue;
  const size_t elements = static_cast<size_t>(p.tokens) * p.hidden;
  if (p.exchange.active() && (p.defer_sum || !p.exchange.holds(elements))) return cudaErrorInvalidValue;
  // The input's exchange publishes its epoch through the output's (the finish).
  if (p.x_exchange.active() &&
      (!p.exchange.active() || !p.x_exchange.holds(elements) || !p.x_partial || p.x_exchange.ranks != p.exchange.ranks ||
       p.x_exchange.rank != p.exchange.rank || p.x_exchange.signals != p.exchange.signals ||
       p.x_exchange.lines[p.x_exchange.rank] == p.exchange.lines[p.exchange.rank]))
    return cudaErrorInvalidValue;
  if (p.format != WeightFormat::bf16) {
    if (p.format != WeightFormat::fp8_e4m3 || p.tokens > kSwigluFusedFp8MaxTokens || !p.gate_up_scales ||
        !p.down_scales || !p.x_fragments || (p.rms_normalize && !p.norm_weight))
      return cudaErrorInvalidValue;
    if (p.tokens <= 8) return launch_for_tokens<1, true>(p, tuning, stream);
    return launch_for_tokens<2, true>(p, tuning, stream);
  }
  if (p.tokens <= 8) return launch_for_tokens<1, false>(p, tuning, stream);
  if (p.tokens <= 16) return launch_for_tokens<2, false>(p, tuning, stream);
  return launch_for_tokens<4, false>(p, tuning, stream);  // passes of 32 tokens
}

}  // namespace deepfuse::kernels