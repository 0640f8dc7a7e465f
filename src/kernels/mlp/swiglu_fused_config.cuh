// The fused SwiGLU MLP's configuration, shared-memory layout, work split and the small device
// helpers its phases share (included by swiglu_fused.cu only; the design essay opens that file).
#pragma once

#include <cuda_bf16.h>

#include "deepfuse/kernels/swiglu_fused.hpp"
#include "kernels/all_reduce/line_exchange.cuh"
#include "kernels/common/async_ring.cuh"
#include "kernels/common/fragment.cuh"

namespace deepfuse::kernels {
namespace {

constexpr int kMaxFinishers = 16;
constexpr int kSharedReservedPerBlock = 1024;  // the runtime's own shared memory per block

template <int NT, int C>  // NT: n-tiles of 8 tokens per pass; C: cluster size
struct FusedConfig {
  static_assert(NT == 1 || NT == 2 || NT == 4, "passes hold 8, 16 or 32 tokens");
  static constexpr int kTokensPerPass = 8 * NT;
  // 16 warps a block (one block per SM) in clusters of 2, and at 9-16 tokens in any cluster; else
  // 8 warps, two blocks per SM. Same ring bytes per SM either way. One block per SM is faster at
  // 9-16 tokens, and 16-warp pairs halve the clusters, so the partial sums of y through L2
  // (docs/kernels/swiglu_fused.md, "One block of 16 warps at 9-16 tokens" and "Clusters of 2 on one
  // block per SM: half the partial sums"). Without clusters (sm_80: 164 KB per SM) it would not fit.
  static constexpr int kWarps = C > 1 && (NT == 2 || C == 2) ? 16 : 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlocksPerSm = 16 / kWarps;
  static constexpr int kMaxTilesPerBlock = 6 * kWarps / 8;  // 16-row tiles of I one block owns
  // 228 KB of shared memory per SM, 1 KB of it reserved per block.
  static constexpr size_t kMaxSharedBytes = 227 * 1024 / kBlocksPerSm - kSharedReservedPerBlock;
  static constexpr int kRowTiles = NT == 1 ? 4 : NT == 2 ? 2 : 1;  // phase-2 output row tiles per warp item
  // The load ring: kStages stages per thread, each kSteps k-steps deep (see ring_run below).
  // A fifth stage pays only where one 16-warp block per SM has room for it, at up to 8 tokens
  // (docs/kernels/swiglu_fused.md, "A fifth ring stage at up to 8 tokens, tried and not kept").
  static constexpr int kStages = NT == 1 ? (kWarps == 16 ? 5 : 4) : 3;
  static constexpr int kSteps1 = NT == 4 ? 1 : 2;  // phase 1: gate + up fragments (+ x words) per k-step
  static constexpr int kSteps2 = NT == 1 ? 1 : 2;  // phase 2: kRowTiles down fragments per k-step
  static constexpr int kXWords = 2 * NT;           // x B-fragment words per phase-1 k-step
  static constexpr int kSlots16 = kSteps1 * 2 > kSteps2 * kRowTiles ? kSteps1 * 2 : kSteps2 * kRowTiles;
  static constexpr int kSlots4 = kSteps1 * kXWords;
  // Row strides in bf16: +8 makes each 4 words mod 32 banks, so the 8 tokens x 4 lanes of a
  // B-fragment load hit 32 different banks.
  static constexpr int kActStride = C * kMaxTilesPerBlock * 16 + 8;
  static constexpr int kSumFloats = kMaxTilesPerBlock * 2 * NT * 4 * 32;  // phase-1 g and u per tile
  // A warp's staged partial y: one row per token of kRowTiles x 16 output rows, +4 floats so the
  // C-fragment stores of the 8 x 4 lanes hit 32 banks (and rows stay 16-byte aligned).
  static constexpr int kStagingStride = kRowTiles * 16 + 4;
};

template <int NT, int C>
struct SharedStorage {
  using Config = FusedConfig<NT, C>;
  uint4 ring16[Config::kStages][Config::kSlots16][Config::kThreads];  // thread-private columns
  union {
    uint32_t ring4[Config::kStages][Config::kSlots4][Config::kThreads];  // x words, phase 1 only
    // Phase 2 (sm_90): each warp's partial y of one group, [token][row], for bulk reductions.
    float staging[Config::kWarps][Config::kTokensPerPass][Config::kStagingStride];
  };
  float sums[Config::kSumFloats];  // phase-1 g and u per tile in C-fragment order, lane-minor
  __nv_bfloat16 act[8 * NT][Config::kActStride];  // the cluster's slice, pushed by the tiles' owners
  float norm_squares[8 * NT];  // RMSNorm: the pass's per-token sums of x^2, summed over the cluster
  unsigned ticket;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Bulk reductions: the TMA unit adds a run of floats from shared memory into global memory, one
// instruction per run (docs/kernels/swiglu_fused.md, "Partial sums as bulk reductions").
__device__ __forceinline__ void bulk_add_f32(float* global, const float* shared, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(global),
               "r"(shared_address(shared)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until this thread's bulk reductions have read their shared-memory rows.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// Waits until this thread's bulk reductions are done, and orders them before its later accesses.
__device__ __forceinline__ void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;" ::: "memory");
}
// Makes this thread's shared-memory writes visible to the bulk copies issued after a sync.
__device__ __forceinline__ void fence_shared_for_bulk() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#else
// Before sm_90: one atomic per value of a 16x8 C tile (output rows row0.., tokens token0..).
__device__ __forceinline__ void add_tile_to_accumulator(float* accumulator, int hidden, int tokens, int row0,
                                                        int token0, const float (&c)[4], int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int token = token0 + 2 * (lane % 4) + (i & 1), row = row0 + lane / 4 + (i >= 2 ? 8 : 0);
    if (token < tokens) atomicAdd(accumulator + static_cast<size_t>(token) * hidden + row, c[i]);
  }
}
__device__ __forceinline__ void bulk_wait_complete() {}  // no bulk reductions in flight
#endif

// Adds sum(x^2) over this block's 1/C of the hidden columns, for tokens token0.. of the pass,
// into norm_squares of every block in the cluster (one warp per token).
template <int C, int kWarps>
__device__ void add_norm_squares(const SwigluFusedParams& p, float* norm_squares, int token0, int pass_tokens,
                                 int rank, int warp, int lane) {
  const int vectors = p.hidden / 8;  // 16-byte vectors per row
  const int begin = split_point(vectors, C, rank), end = split_point(vectors, C, rank + 1);
  for (int local = warp; local < pass_tokens && token0 + local < p.tokens; local += kWarps) {
    const uint4* row = reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(token0 + local) * p.hidden);
    float squares = 0.0f;
    for (int v = begin + lane; v < end; v += 32) {
      const uint4 bits = row[v];
      const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
        squares += pair.x * pair.x + pair.y * pair.y;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    if (lane < C) atomicAdd(in_block<C>(norm_squares + local, lane), squares);
  }
}

// The input's sum over the ranks (SwigluFusedParams::x_exchange): this block pushes its share of
// this rank's partial to the peers (the grid's blocks split the lines), then sums its share of
// every line (the cluster's blocks split them) into x. The cluster barrier after it makes x whole
// for the cluster's reads; every cluster writes the same bits.
template <int C, int kThreads>
__device__ void sum_input_over_ranks(const SwigluFusedParams& p, uint32_t epoch, int rank, int tid) {
  const int quads = p.tokens * p.hidden / 4, blocks = static_cast<int>(gridDim.x), block = blockIdx.x;
  const auto* partial = reinterpret_cast<const uint2*>(p.x_partial);
  for (int quad = split_point(quads, blocks, block) + tid; quad < split_point(quads, blocks, block + 1); quad += kThreads)
    lines::push_line(p.x_exchange, quad, partial[quad], epoch);
  auto* x = reinterpret_cast<uint2*>(const_cast<__nv_bfloat16*>(p.x));  // writable: the params' contract
  for (int quad = split_point(quads, C, rank) + tid; quad < split_point(quads, C, rank + 1); quad += kThreads)
    x[quad] = lines::sum_line(p.x_exchange, quad, partial[quad], epoch);
}

// FP8: x times the norm weight (bf16 1.0 without one), each product in fp32 rounded once to f16
// and clamped to its finite range, into p.x_fragments in the order phase 1's MMAs take their B
// operand: per k-step and lane 4g + t, the words {b0, b1} of token g (and of token 8 + g at NT =
// 2; fragment.cuh), so a lane streams a k-step's x with one copy and uses it as it lands. The norm
// weight is applied once per call instead of once per k-step of every tile. Each cluster writes
// every value for the call's tokens (its blocks split them exactly as sum_input_over_ranks does,
// so with an input exchange each thread reads back only x it summed itself); the clusters write
// the same bits, and the cluster barrier after it makes them whole for the cluster's copies.
template <int NT, int C, int kThreads>
__device__ void stage_x_fragments(const SwigluFusedParams& p, int rank, int tid) {
  constexpr int kLaneWords = 2 * NT;          // a lane's words per k-step
  const int quads = p.tokens * p.hidden / 4;  // 4 columns of one token (hidden % 64 == 0)
  const auto* x = reinterpret_cast<const uint2*>(p.x);
  auto* words = reinterpret_cast<uint32_t*>(p.x_fragments);
  auto scaled = [](uint32_t x_pair, uint32_t w_pair) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x_pair));
    const float2 w = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w_pair));
    return f16x2_saturated(v.x * w.x, v.y * w.y);
  };
  for (int quad = split_point(quads, C, rank) + tid; quad < split_point(quads, C, rank + 1); quad += kThreads) {
    const int token = quad * 4 / p.hidden, column = quad * 4 - token * p.hidden;
    const uint2 v = x[quad];
    uint2 w = make_uint2(0x3f803f80u, 0x3f803f80u);  // bf16 1.0 pairs
    if (p.norm_weight) {
      const auto* pairs = reinterpret_cast<const unsigned*>(p.norm_weight + column);
      w = make_uint2(__ldg(pairs), __ldg(pairs + 1));
    }
    // Columns 2t, 2t + 1 (and 2t + 2, 2t + 3: lane + 1) of the k-step's first or second 8 (b0 or b1).
    const int k = column / 16, within = column % 16, lane = token % 8 * 4 + within % 8 / 2;
    uint32_t* word = words + (static_cast<size_t>(k) * 32 + lane) * kLaneWords + token / 8 * 2 + within / 8;
    word[0] = scaled(v.x, w.x);
    word[kLaneWords] = scaled(v.y, w.y);
  }
  // Without a cluster, whose barrier releases the writes to the other blocks' SMs, make sure the
  // block barrier after this has them in L2, where phase 1's 16-byte copies (cp.async.cg) read
  // past L1.
  if constexpr (C == 1) __threadfence();
}

// ---- Where a block's work lies. Phase 1: the cluster's C x kWarps warps take equal contiguous
// ranges of the cluster's flattened (tile, k-step) space, f = tile * h_tiles + k (also the packed
// gate_up order), and stream them without a break; g and u sums cut by a range end meet in the tile
// owner's shared memory through distributed-shared-memory atomics. Blocks own tiles for the
// activation only. Phase 2: f = group * k2_steps + k over this block's output row tiles (rotated by
// cluster, so clusters reduce into different rows at any moment) in groups of kRowTiles, and the
// cluster's I tiles; warps take equal ranges, sums cut by a range end meet in the L2 reduction.
template <int NT, int C>
struct FusedWork {
  using Config = FusedConfig<NT, C>;
  static constexpr int RT = Config::kRowTiles;
  int h_tiles;                      // k-steps of phase 1, row tiles of phase 2
  int cluster_begin, cluster_tiles;  // this cluster's slice of I (at least one tile per block: the grid is <= I / 16)
  int own_begin;                    // this block's tiles, cluster-local
  int f1_begin, f1_end;             // this warp's phase-1 range
  const uint4* gate_up;             // the slice's packed gate and up weights, this lane's column
  int row_rotation, row_begin, rows;
  int k2_steps;                     // phase-2 loads per row tile: I tiles (bf16) or pairs of them (FP8)
  int f2_begin, f2_end;             // this warp's phase-2 range

  // fp8: e4m3 weights (SwigluFusedParams::format): one load carries a k-step's gate and up
  // fragments (phase 1) or two I tiles of a row tile (phase 2), so clusters take I in tile pairs.
  __device__ __forceinline__ FusedWork(const SwigluFusedParams& p, int warp, bool fp8 = false) {
    constexpr int kWarps = Config::kWarps;
    h_tiles = p.hidden / 16;
    const int i_tiles = p.intermediate / 16;
    const int clusters = gridDim.x / C;
    const int cluster = blockIdx.x / C, rank = blockIdx.x % C;
    const int unit = fp8 ? 2 : 1;  // tiles per split unit
    cluster_begin = unit * split_point(i_tiles / unit, clusters, cluster);
    cluster_tiles = unit * split_point(i_tiles / unit, clusters, cluster + 1) - cluster_begin;
    const int work1 = cluster_tiles * h_tiles;
    const int cluster_warp = rank * kWarps + warp;
    f1_begin = split_point(work1, C * kWarps, cluster_warp);
    f1_end = split_point(work1, C * kWarps, cluster_warp + 1);
    gate_up = p.gate_up + static_cast<size_t>(cluster_begin) * h_tiles * (fp8 ? 32 : 64) + threadIdx.x % 32;
    own_begin = split_point(cluster_tiles, C, rank);
    row_rotation = split_point(h_tiles, clusters, cluster);
    row_begin = split_point(h_tiles, C, rank);
    rows = split_point(h_tiles, C, rank + 1) - row_begin;
    k2_steps = cluster_tiles / unit;
    const int work2 = (rows + RT - 1) / RT * k2_steps;
    f2_begin = split_point(work2, kWarps, warp), f2_end = split_point(work2, kWarps, warp + 1);
  }
  __device__ __forceinline__ int row_tile_of(int local) const { return (row_begin + local + row_rotation) % h_tiles; }
};

// Phase-1 g and u of (tile, gate or up, n-tile, C-fragment element), lane-minor.
template <int NT>
__device__ __forceinline__ int sum_index(int tile, int which, int nt, int c, int lane) {
  return (((tile * 2 + which) * NT + nt) * 4 + c) * 32 + lane;
}

}  // namespace

inline bool swiglu_fused_valid_shape(int hidden, int intermediate) {
  return hidden > 0 && intermediate > 0 && hidden % 64 == 0 && intermediate % 64 == 0;
}

}  // namespace deepfuse::kernels
