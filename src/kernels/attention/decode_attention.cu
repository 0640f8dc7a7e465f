// Split-KV paged decode attention ("flash-decoding"): the kernel and its launcher. The planner is
// decode_attention_plan.cpp. Design, its numbers and every version tried:
// docs/kernels/decode_attention.md.
//
// One block of W = 4 or 8 warps per (split, kv head, sequence); per sequence b and query head h:
//   out[b, h] = softmax(q[b, h] · K^T * scale) · V   over keys [first, len) of the paged cache.
// The kernel's phases, in order:
//   split_range            this block's pages (lengths are read on the device: one graph serves all)
//   PageStream             each warp streams its (K page, V page) pairs through its own cp.async ring
//   load_q_fragments       q of the group's heads as mma B fragments, held for the whole block
//   attend_page            per 16-key page, on tensor cores: S^T = K·Q^T, online softmax, O^T += V^T·P^T
//   write_warp_state, merge_warps   the warps meet in shared memory; the block writes out or a partial
//   merge_mailbox          (cluster plans) the first block of the cluster merges the splits
//   last_to_arrive, merge_splits    (else) the last block of a (sequence, kv head) merges them via L2
// Padding and bounds: rows of a page outside [first, len) are zero-filled by cp.async and masked
// to -inf, so whatever the cache holds there (even NaN) never reaches the output; pages past the
// sequence's last one are never read; len is clamped to [0, plan.max_context]; len = 0 writes 0.
#include "deepfuse/kernels/decode_attention.hpp"

#include <cmath>
#include <string>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "deepfuse/error.hpp"
#include "kernels/attention/decode_attention_plan.hpp"
#include "kernels/common/warp_tiles.cuh"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/cluster_sync.cuh"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/log2e.cuh"
#include "kernels/common/l2_policy.cuh"
#include "kernels/common/pointer_checks.hpp"
#include "kernels/common/trace.cuh"
#include "kernels/common/fragment.cuh"

namespace deepfuse::kernels {
namespace {

using namespace warp_tiles;
using namespace decode_attention_detail;

// 24 KB of cp.async stages per warp: 3 stages of 8 KB at D = 128, 6 of 4 KB at D = 64. With one
// stage being consumed, 16-20 KB per warp are in flight, about 4x what Little's law asks at
// 4.3 TB/s (docs/kernels/decode_attention.md, "Design (v1)").
constexpr int kRingBytesPerWarp = 24 * 1024;

// A block of W = 4 or 8 warps, each with its own ring. Two 4-warp blocks fit an SM (2 x (96 KB +
// the 1 KB the runtime reserves per block) of the H100/H200's 228 KB), one 8-warp block: it
// streams a split twice as fast, so a sequence needs half the splits, partials and merges.
template <int W>
struct BlockShape {
  static_assert(W == 4 || W == 8, "4 or 8 warps per block");
  static constexpr int kThreads = 32 * W;
  static constexpr int kSharedBytes = W * kRingBytesPerWarp;
  static constexpr int kPerSm = 8 / W;
  static_assert(kPerSm * (kSharedBytes + 1024 + 16) <= 228 * 1024, "the blocks no longer fit one SM");
};

template <int D>
struct Geometry {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kChunksPerRow = D / 8;                   // 16-byte chunks per key row
  static constexpr int kPageBytes = kKvPageSize * D * 2;        // one (page, kv head) of K or of V
  static constexpr int kStageBytes = 2 * kPageBytes;            // the K page, then the V page
  static constexpr int kStages = kRingBytesPerWarp / kStageBytes;
  static constexpr int kChunksPerLane = kPageBytes / 16 / 32;   // cp.async per lane per page
  static constexpr int kDimSteps = D / 16;                      // k-steps of q·k, m-tiles of p·v
  static constexpr int kScratchStride = D + 4;                  // floats; keeps merge writes conflict-free
  static_assert(kStages >= 2, "the ring needs at least two stages");
  static_assert(kChunksPerRow % 8 == 0, "the swizzle permutes groups of 8 chunks within a row");
};

// Merging in a cluster (plan.cluster_merge): the splits of a (sequence, kv head) are the blocks of
// one thread-block cluster and send their partials to the first block's shared memory, which
// merges them: no ticket and no L2 round trip after the last partial. At most kMaxClusterSplits
// splits, 8-warp blocks (the mailbox does not fit beside two 4-warp blocks per SM), one 8-head n-tile.
template <int D>
struct Mailbox {  // after the rings in the first block of the cluster: one slot per split
  float lse[kMaxClusterSplits][8];
  float partial[kMaxClusterSplits][8][D];  // normalised, fp32
};

template <int D, int W, bool kCluster>
constexpr int kernel_shared_bytes() {
  return BlockShape<W>::kSharedBytes + (kCluster ? static_cast<int>(sizeof(Mailbox<D>)) : 0);
}

struct KernelArgs {
  const __nv_bfloat16* q;
  __nv_bfloat16* out;
  const __nv_bfloat16* k_pages;
  const __nv_bfloat16* v_pages;
  const int32_t* block_table;
  const int32_t* sequences;  // block-table row of each query, or null: its own
  const int32_t* seq_lens;
  int appended_keys;  // DecodeAttentionParams::appended_keys
  unsigned* counters;
  float* lse;      // log2-domain log-sum-exp per (pair, split, head)
  __nv_bfloat16* partial;  // normalised partial output per (pair, split, head, dim): bf16 halves the merge's reads
  int max_pages_per_seq;
  int kv_heads;
  int group;
  int splits;
  int min_pages_per_split;
  int max_context;
  int sliding_window;
  float scale_log2;  // scale * log2(e): softmax in base 2
};

// The keys a (sequence, split) block attends to. Every block of a sequence computes the same
// numbers, so they agree on how many splits are active without talking.
struct SplitRange {
  int length = 0;      // keys in the sequence (clamped)
  int first_key = 0;   // first key inside the window
  int page_begin = 0;  // this split's pages [page_begin, page_end)
  int page_end = 0;
  int active = 0;      // splits with at least one page
};

__device__ __forceinline__ SplitRange split_range(const KernelArgs& a, int sequence, int split) {
  SplitRange r;
  r.length = min(max(a.seq_lens[sequence], 0), a.max_context);
  if (r.length == 0) return r;
  r.first_key = a.sliding_window > 0 ? max(0, r.length - a.sliding_window) : 0;
  const int first_page = r.first_key / kKvPageSize;
  const int pages = (r.length + kKvPageSize - 1) / kKvPageSize - first_page;
  // As many splits as keep min_pages_per_split each (at most the plan's), the pages spread evenly
  // over them: a sequence just past a multiple of the minimum gets no one-page split to merge.
  const int wanted = min(a.splits, max(1, pages / a.min_pages_per_split));
  const int per_split = (pages + wanted - 1) / wanted;
  r.active = (pages + per_split - 1) / per_split;
  r.page_begin = first_page + split * per_split;
  r.page_end = min(r.page_begin + per_split, first_page + pages);
  return r;
}

// Takes the next ticket of a counter: an atomic increment with release (this thread's writes, and
// those ordered before it by a block barrier, are visible first) and acquire semantics at GPU scope.
__device__ __forceinline__ unsigned ticket_acq_rel(unsigned* counter) {
  unsigned previous;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(previous) : "l"(counter) : "memory");
  return previous;
}

// Cross-split merge, run by the last block of a (sequence, kv head) to finish. out points at the
// group's first head; slot0 is the (pair, split 0) index into lse and partial.
template <int D, int HT, int W>
__device__ void merge_splits(const KernelArgs& a, int active, size_t slot0, __nv_bfloat16* out,
                             unsigned char* shared) {
  constexpr int kWarps = W, kThreads = BlockShape<W>::kThreads, kSharedBytes = BlockShape<W>::kSharedBytes;
  constexpr int kVector = 8;  // bf16 values per 16-byte copy
  const int group = a.group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int items = group * (D / kVector);  // 16-byte vectors of the group's partial output
  float* weights = reinterpret_cast<float*>(shared);  // [active][group]: lse, then exp2(lse - max)
  float* inverse_total = weights + active * group;    // [group]
  const int header_floats = (active * group + group + 3) / 4 * 4;
  uint4* chunk = reinterpret_cast<uint4*>(weights + header_floats);
  const int capacity = (kSharedBytes - header_floats * 4) / (items * 16);  // splits per chunk, >= 19

  // The first chunk of partials is requested before the log-sum-exps, so the two L2 round trips overlap.
  const uint4* partials = reinterpret_cast<const uint4*>(a.partial + slot0 * group * D);
  auto request_chunk = [&](int c0) {
    const int count = min(capacity, active - c0);
    for (int p = threadIdx.x; p < count * items; p += kThreads)
      copy16_async(shared_address(chunk + p), partials + static_cast<size_t>(c0) * items + p, true);
    commit_async();
  };
  request_chunk(0);
  for (int i = threadIdx.x; i < active * group; i += kThreads) weights[i] = __ldcg(a.lse + slot0 * group + i);
  __syncthreads();
  for (int head = warp; head < group; head += kWarps) {
    float best = -INFINITY;
    for (int s = lane; s < active; s += 32) best = fmaxf(best, weights[s * group + head]);
    best = warp_max(best);
    float total = 0.0f;
    for (int s = lane; s < active; s += 32) {
      const float w = exp2f(weights[s * group + head] - best);
      weights[s * group + head] = w;
      total += w;
    }
    total = warp_sum(total);
    if (lane == 0) inverse_total[head] = 1.0f / total;
  }

  constexpr int kItemsPerThread = (HT * 8 * (D / kVector) + kThreads - 1) / kThreads;
  float acc[kItemsPerThread][kVector];
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i)
#pragma unroll
    for (int j = 0; j < kVector; ++j) acc[i][j] = 0.0f;
  for (int c0 = 0; c0 < active; c0 += capacity) {
    wait_async<0>();
    __syncthreads();  // the chunk (and, the first time, the weights) are complete
    const int count = min(capacity, active - c0);
#pragma unroll
    for (int i = 0; i < kItemsPerThread; ++i) {
      const int item = threadIdx.x + i * kThreads;
      if (item >= items) continue;
      const int head = item / (D / kVector);
#pragma unroll 4
      for (int s = 0; s < count; ++s) {
        const float w = weights[(c0 + s) * group + head];
        const uint4 bits = chunk[s * items + item];
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
        for (int j = 0; j < kVector / 2; ++j) {
          const float2 v = __bfloat1622float2(pairs[j]);
          acc[i][2 * j] += w * v.x, acc[i][2 * j + 1] += w * v.y;
        }
      }
    }
    if (c0 + capacity < active) {
      __syncthreads();  // everyone is done with this chunk before the next overwrites it
      request_chunk(c0 + capacity);
    }
  }
#pragma unroll
  for (int i = 0; i < kItemsPerThread; ++i) {
    const int item = threadIdx.x + i * kThreads;
    if (item >= items) continue;
    const float inv = inverse_total[item / (D / kVector)];
    store_bf16x4(out + kVector * item,
                 make_float4(acc[i][0] * inv, acc[i][1] * inv, acc[i][2] * inv, acc[i][3] * inv));
    store_bf16x4(out + kVector * item + 4,
                 make_float4(acc[i][4] * inv, acc[i][5] * inv, acc[i][6] * inv, acc[i][7] * inv));
  }
}

// Cross-split merge in the first block of a cluster, once every active split's slot is filled.
template <int D, int W>
__device__ void merge_mailbox(const Mailbox<D>& box, int active, int group, __nv_bfloat16* out) {
  for (int item = threadIdx.x; item < group * (D / 4); item += BlockShape<W>::kThreads) {
    const int head = item / (D / 4), dim = 4 * (item % (D / 4));
    float best = -INFINITY;
    for (int s = 0; s < active; ++s) best = fmaxf(best, box.lse[s][head]);
    float total = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < active; ++s) {
      const float w = exp2f(box.lse[s][head] - best);
      const float4 v = *reinterpret_cast<const float4*>(&box.partial[s][head][dim]);
      total += w;
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
    const float inv = 1.0f / total;
    store_bf16x4(out + head * D + dim, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
  }
}

// ---- Streaming: this warp's pages of the split are page_begin + warp + W·j for j < count. Stage
// j % S of the warp's ring holds page j's K page, then its V page. Page ids come 32 at a time (lane
// l holds entry j = 32c + l), the next 32 fetched a chunk ahead. Shared rows are XOR-swizzled by
// 16-byte chunk (chunk ^ row % 8) so the 8 rows an ldmatrix phase reads hit 8 bank groups.
template <int D, int W>
struct PageStream {
  using Geo = Geometry<D>;
  static constexpr int S = Geo::kStages;
  const __nv_bfloat16* k_pages;
  const __nv_bfloat16* v_pages;
  SplitRange range;
  const int32_t* table_row;
  int lane, first_page, count;
  int32_t ids_now, ids_next;
  unsigned ring;
  size_t page_stride, head_offset;  // elements per page id; the kv head's offset in a page
  uint64_t read_once;

  __device__ __forceinline__ PageStream(const KernelArgs& a, const SplitRange& split, unsigned char* shared,
                                        int sequence, int kv_head, int warp, int lane_id)
      : k_pages(a.k_pages), v_pages(a.v_pages), range(split), lane(lane_id) {
    const int row = a.sequences ? a.sequences[sequence] : sequence;
    table_row = a.block_table + static_cast<size_t>(row) * a.max_pages_per_seq;
    first_page = range.page_begin + warp;
    const int span = range.page_end - range.page_begin;
    count = span > warp ? (span - warp + W - 1) / W : 0;
    ids_now = page_ids(0), ids_next = page_ids(1);
    ring = shared_address(shared) + warp * kRingBytesPerWarp;
    page_stride = static_cast<size_t>(a.kv_heads) * kKvPageSize * D;
    head_offset = static_cast<size_t>(kv_head) * kKvPageSize * D;
    // K/V pages are read once per step, like the weights: evict-first in L2 (l2_policy.cuh). In the
    // decode step 0.3-1.6% faster from 2k tokens up, Llama-3.2-1B at 512 tokens 0.1-0.5% slower
    // (docs/kernels/decode_attention.md, "K/V pages marked evict-first").
    read_once = evict_first_policy();
  }

  __device__ __forceinline__ int32_t page_ids(int chunk) const {
    const int j = 32 * chunk + lane;
    return j < count ? table_row[first_page + W * j] : 0;
  }
  __device__ __forceinline__ int first_token(int j) const { return (first_page + W * j) * kKvPageSize; }
  __device__ __forceinline__ unsigned stage(int j) const { return ring + (j % S) * Geo::kStageBytes; }

  // Starts the copies of page j into its stage (and commits, even when empty, so every stage is
  // one commit group). Rows outside [first_key, length) are zero-filled.
  __device__ __forceinline__ void issue(int j) {
    if (j < count) {
      if (j % 32 == 0 && j > 0) {
        ids_now = ids_next;
        ids_next = page_ids(j / 32 + 1);
      }
      const int32_t id = __shfl_sync(0xffffffffu, ids_now, j % 32);
      const int token0 = first_token(j);
      const size_t offset = static_cast<size_t>(id) * page_stride + head_offset;
      const unsigned destination0 = stage(j);
#pragma unroll
      for (int r = 0; r < Geo::kChunksPerLane; ++r) {
        const int chunk = lane + 32 * r;
        const int row = chunk / Geo::kChunksPerRow, column = chunk % Geo::kChunksPerRow;
        const int token = token0 + row;
        const bool valid = token >= range.first_key && token < range.length;
        const unsigned destination = destination0 + (row * Geo::kChunksPerRow + (column ^ (row & 7))) * 16;
        copy16_async_with_policy(destination, k_pages + offset + chunk * 8, read_once, valid);
        copy16_async_with_policy(destination + Geo::kPageBytes, v_pages + offset + chunk * 8, read_once, valid);
      }
    }
    commit_async();
  }
};

// ---- A warp's registers for its pages. q as mma B fragments (b0 = q[head g][16k + 2t, +1], b1
// the same 8 dims later); O^T as C fragments ([dim 16m + g (+8)][head 2t, 2t+1]); per head 2t,
// 2t+1 of each 8-head tile the running max and sum (sums per lane until finish_row_sums).
template <int D, int HT>
struct WarpState {
  static constexpr int kDimSteps = Geometry<D>::kDimSteps;
  uint32_t q[HT][kDimSteps][2];
  float o[HT][kDimSteps][4];
  float row_max[HT][2], row_sum[HT][2];
};

// Up to 8 query heads share one n-tile, so the group's heads cost one read of K/V; groups of
// 9..16 use two n-tiles. Heads past the group are zero.
template <int D, int HT>
__device__ __forceinline__ void load_q_fragments(const KernelArgs& a, size_t group_row0, int g, int t,
                                                 WarpState<D, HT>& state) {
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
    const int head = 8 * ht + g;
    const __nv_bfloat16* q_row = a.q + (group_row0 + head) * D + 2 * t;
#pragma unroll
    for (int k = 0; k < Geometry<D>::kDimSteps; ++k) {
      state.q[ht][k][0] = head < a.group ? *reinterpret_cast<const uint32_t*>(q_row + 16 * k) : 0u;
      state.q[ht][k][1] = head < a.group ? *reinterpret_cast<const uint32_t*>(q_row + 16 * k + 8) : 0u;
    }
  }
}

template <int D, int HT>
__device__ __forceinline__ void reset_softmax(WarpState<D, HT>& state) {
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
    for (int m = 0; m < Geometry<D>::kDimSteps; ++m)
      state.o[ht][m][0] = state.o[ht][m][1] = state.o[ht][m][2] = state.o[ht][m][3] = 0.0f;
    state.row_max[ht][0] = state.row_max[ht][1] = -INFINITY;
    state.row_sum[ht][0] = state.row_sum[ht][1] = 0.0f;
  }
}

// This lane's ldmatrix row addresses within a stage. K (A = keys x dims): matrices {keys 0-7,
// 8-15} x {dims +0, +8}, lane l points at key l % 16, chunk 2k + l / 16. V^T (A = dims x keys,
// transposed load): matrices {dims +0, +8} x {keys 0-7, 8-15}: key l % 8 + 8 (l / 16), chunk
// 2m + (l / 8) % 2.
template <int D>
struct FragmentRows {
  unsigned k_lane, v_lane;
  int k_swizzle, v_swizzle;
  __device__ __forceinline__ explicit FragmentRows(int lane) {
    const int k_row = lane & 15, v_row = (lane & 7) + 8 * (lane >> 4);
    k_swizzle = (lane >> 4) ^ (lane & 7), v_swizzle = ((lane >> 3) & 1) ^ (lane & 7);
    k_lane = k_row * Geometry<D>::kChunksPerRow * 16, v_lane = v_row * Geometry<D>::kChunksPerRow * 16;
  }
};

// S^T[16 keys x 8 heads] = K[16 x D] · Q^T per 8-head tile (mma.m16n8k16, bf16 in, fp32 out).
template <int D, int HT>
__device__ __forceinline__ void page_scores(unsigned k_stage, const FragmentRows<D>& rows,
                                            const WarpState<D, HT>& state, float (&s)[HT][4]) {
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) s[ht][0] = s[ht][1] = s[ht][2] = s[ht][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < Geometry<D>::kDimSteps; ++k) {
    const uint4 keys = load_matrix_x4(k_stage + rows.k_lane + ((2 * k) ^ rows.k_swizzle) * 16);
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) mma_bf16_m16n8k16(s[ht], keys, state.q[ht][k][0], state.q[ht][k][1]);
  }
}

// The online softmax in base 2 over one page, per head column: the 16 keys of a head sit in one
// column, so a 3-step shuffle over g gives its max. Rescales O and the sums, and returns P^T as
// mma B fragments (S^T's weights rounded to bf16, transposed in registers by movmatrix).
template <int D, int HT>
__device__ __forceinline__ void softmax_update(const float (&s)[HT][4], bool low_in, bool high_in, float scale_log2,
                                               WarpState<D, HT>& state, uint32_t (&p_frag)[HT][2]) {
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
    const float x0 = low_in ? s[ht][0] * scale_log2 : -INFINITY, x1 = low_in ? s[ht][1] * scale_log2 : -INFINITY;
    const float x2 = high_in ? s[ht][2] * scale_log2 : -INFINITY, x3 = high_in ? s[ht][3] * scale_log2 : -INFINITY;
    float page_max0 = fmaxf(x0, x2), page_max1 = fmaxf(x1, x3);
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {  // over g: the 16 keys of head column 2t (+1)
      page_max0 = fmaxf(page_max0, __shfl_xor_sync(0xffffffffu, page_max0, offset));
      page_max1 = fmaxf(page_max1, __shfl_xor_sync(0xffffffffu, page_max1, offset));
    }
    float (&row_max)[2] = state.row_max[ht];
    float (&row_sum)[2] = state.row_sum[ht];
    const float max0 = fmaxf(row_max[0], page_max0), max1 = fmaxf(row_max[1], page_max1);
    const float alpha0 = exp2f(row_max[0] - max0), alpha1 = exp2f(row_max[1] - max1);
    row_max[0] = max0, row_max[1] = max1;
    const uint32_t p_low = pack_bf16x2(exp2f(x0 - max0), exp2f(x1 - max1));   // key g
    const uint32_t p_high = pack_bf16x2(exp2f(x2 - max0), exp2f(x3 - max1));  // key g + 8
    // Sum the bf16-rounded weights the p·v product uses, so the normalisation matches them.
    row_sum[0] = row_sum[0] * alpha0 + low_bf16(p_low) + low_bf16(p_high);
    row_sum[1] = row_sum[1] * alpha1 + high_bf16(p_low) + high_bf16(p_high);
#pragma unroll
    for (int m = 0; m < Geometry<D>::kDimSteps; ++m) {
      float (&o)[4] = state.o[ht][m];
      o[0] *= alpha0, o[1] *= alpha1, o[2] *= alpha0, o[3] *= alpha1;
    }
    p_frag[ht][0] = transpose_8x8(p_low);   // P^T B fragment: keys 2t, 2t+1 of head g
    p_frag[ht][1] = transpose_8x8(p_high);  // keys 2t+8, 2t+9
  }
}

// O^T[D x 8 heads] += V^T · P^T per 8-head tile; A = V^T from a transposed ldmatrix.
template <int D, int HT>
__device__ __forceinline__ void accumulate_values(unsigned v_stage, const FragmentRows<D>& rows,
                                                  const uint32_t (&p_frag)[HT][2], WarpState<D, HT>& state) {
#pragma unroll
  for (int m = 0; m < Geometry<D>::kDimSteps; ++m) {
    const uint4 values = load_matrix_x4_transposed(v_stage + rows.v_lane + ((2 * m) ^ rows.v_swizzle) * 16);
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) mma_bf16_m16n8k16(state.o[ht][m], values, p_frag[ht][0], p_frag[ht][1]);
  }
}

// One landed page j of the stream. S^T rows are keys g and g + 8 of the page; every page holds at
// least one key in range, so each head's running max is finite after its first page.
template <int D, int HT, int W>
__device__ __forceinline__ void attend_page(const PageStream<D, W>& stream, int j, const FragmentRows<D>& rows,
                                            float scale_log2, int g, WarpState<D, HT>& state) {
  const unsigned k_stage = stream.stage(j), v_stage = k_stage + Geometry<D>::kPageBytes;
  float s[HT][4];
  page_scores(k_stage, rows, state, s);
  const SplitRange& range = stream.range;
  const int key_low = stream.first_token(j) + g, key_high = key_low + 8;
  const bool low_in = key_low >= range.first_key && key_low < range.length;
  const bool high_in = key_high >= range.first_key && key_high < range.length;
  uint32_t p_frag[HT][2];
  softmax_update(s, low_in, high_in, scale_log2, state, p_frag);
  accumulate_values(v_stage, rows, p_frag, state);
}

// The ring: S - 1 pages in flight while one is consumed (the first S - 1 issued by the kernel).
template <int D, int HT, int W>
__device__ __forceinline__ void attend_pages(PageStream<D, W>& stream, float scale_log2, int lane,
                                             WarpState<D, HT>& state) {
  constexpr int S = Geometry<D>::kStages;
  const FragmentRows<D> rows(lane);
  reset_softmax(state);
  for (int j = 0; j < stream.count; ++j) {
    __syncwarp();  // every lane has read stage (j - 1) % S before it is refilled
    stream.issue(j + S - 1);
    wait_async<S - 1>();  // this lane's copies of page j have landed
    __syncwarp();         // ... and every other lane's
    attend_page(stream, j, rows, scale_log2, lane / 4, state);
  }
  wait_async<0>();
}

// Each head's sum over the 8 lanes g that hold its keys.
template <int D, int HT>
__device__ __forceinline__ void finish_row_sums(WarpState<D, HT>& state) {
#pragma unroll
  for (int ht = 0; ht < HT; ++ht)
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2)
        state.row_sum[ht][c] += __shfl_xor_sync(0xffffffffu, state.row_sum[ht][c], offset);
}

// ---- The block merge's scratch, over the rings once every warp is done with its own:
// O[warp][head][dim] in padded rows, then max and sum per (warp, head).
template <int D, int HT, int W>
struct MergeScratch {
  static constexpr int kHeads = 8 * HT, kStride = Geometry<D>::kScratchStride;
  static_assert((W * kHeads * (D + 4) + 2 * W * kHeads) * 4 <= BlockShape<W>::kSharedBytes, "merge scratch fits the rings");
  float* o;
  float* max_of;
  float* sum_of;
  __device__ __forceinline__ explicit MergeScratch(unsigned char* shared)
      : o(reinterpret_cast<float*>(shared)), max_of(o + W * kHeads * kStride), sum_of(max_of + W * kHeads) {}
};

template <int D, int HT, int W>
__device__ __forceinline__ void write_warp_state(const MergeScratch<D, HT, W>& scratch, const WarpState<D, HT>& state,
                                                 int warp, int g, int t) {
  constexpr int kHeads = MergeScratch<D, HT, W>::kHeads, kStride = MergeScratch<D, HT, W>::kStride;
  float* mine = scratch.o + warp * kHeads * kStride;
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
    const int head = 8 * ht + 2 * t;
#pragma unroll
    for (int m = 0; m < Geometry<D>::kDimSteps; ++m) {
      const int dim = 16 * m + g;
      mine[head * kStride + dim] = state.o[ht][m][0];
      mine[(head + 1) * kStride + dim] = state.o[ht][m][1];
      mine[head * kStride + dim + 8] = state.o[ht][m][2];
      mine[(head + 1) * kStride + dim + 8] = state.o[ht][m][3];
    }
    if (g == 0) {
      scratch.max_of[warp * kHeads + head] = state.row_max[ht][0], scratch.max_of[warp * kHeads + head + 1] = state.row_max[ht][1];
      scratch.sum_of[warp * kHeads + head] = state.row_sum[ht][0], scratch.sum_of[warp * kHeads + head + 1] = state.row_sum[ht][1];
    }
  }
}

// The block's output per head, its warps merged: bf16 out when the block is its sequence's only
// split, else a normalised partial and its log-sum-exp, into the cluster's mailbox (fp32) or the
// workspace (bf16) at `slot`.
template <int D, int HT, int W, bool kCluster>
__device__ __forceinline__ void merge_warps(const KernelArgs& a, const MergeScratch<D, HT, W>& scratch, bool only_split,
                                            size_t slot, int split, Mailbox<D>* mailbox, __nv_bfloat16* out) {
  constexpr int kHeads = MergeScratch<D, HT, W>::kHeads, kStride = MergeScratch<D, HT, W>::kStride;
  for (int item = threadIdx.x; item < a.group * (D / 4); item += BlockShape<W>::kThreads) {
    const int head = item / (D / 4), dim = 4 * (item % (D / 4));
    float best = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) best = fmaxf(best, scratch.max_of[w * kHeads + head]);
    float total = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float f = exp2f(scratch.max_of[w * kHeads + head] - best);  // 0 for a warp without pages
      total += f * scratch.sum_of[w * kHeads + head];
      const float4 v = *reinterpret_cast<const float4*>(scratch.o + (w * kHeads + head) * kStride + dim);
      acc.x += f * v.x, acc.y += f * v.y, acc.z += f * v.z, acc.w += f * v.w;
    }
    const float inv = 1.0f / total;
    acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (only_split) {
      store_bf16x4(out + head * D + dim, acc);
    } else if constexpr (kCluster) {
      *reinterpret_cast<float4*>(&mailbox->partial[split][head][dim]) = acc;
      if (dim == 0) mailbox->lse[split][head] = best + log2f(total);
    } else {
      store_bf16x4(a.partial + (slot * a.group + head) * D + dim, acc);
      if (dim == 0) a.lse[slot * a.group + head] = best + log2f(total);
    }
  }
}

// Whether this block is the last of its (sequence, kv head) to finish, which then merges the
// splits. The barrier orders every thread's partial writes before thread 0's ticket, whose release
// makes them visible GPU-wide and whose acquire (for the last block) makes the other blocks'
// visible to this one; the second barrier hands that on to the block. Cheaper than a full fence
// on each side. The last block resets the counter to zero for the next launch.
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, int active) {
  __shared__ unsigned ticket;
  __syncthreads();
  if (threadIdx.x == 0) ticket = ticket_acq_rel(counter);
  __syncthreads();
  if (ticket != static_cast<unsigned>(active - 1)) return false;
  if (threadIdx.x == 0) atomicExch(counter, 0u);  // every split has counted: ready for the next launch
  return true;
}

// One block per (split, kv head, sequence) = (blockIdx.x, .y, .z). HT: 8-head n-tiles (1 or 2);
// W: warps per block; kCluster: the splits of a (sequence, kv head) are one cluster and merge
// in its first block (else through the workspace).
template <int D, int HT, int W, bool kCluster>
__global__ void __launch_bounds__(BlockShape<W>::kThreads, BlockShape<W>::kPerSm)
    decode_attention_kernel(const KernelArgs a) {
  static_assert(!kCluster || (W == 8 && HT == 1), "cluster merges: 8-warp blocks, at most 8 heads per kv head");
  extern __shared__ __align__(128) unsigned char shared[];
  const int split = blockIdx.x, kv_head = blockIdx.y, sequence = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const size_t group_row0 = (static_cast<size_t>(sequence) * a.kv_heads + kv_head) * a.group;  // (seq, q head) row
  __nv_bfloat16* out = a.out + group_row0 * D;
  trace::stamp(trace::Kernel::decode_attention, trace::Mark::start);
  // Phase 1 of the cluster barrier: this block has started, so its mailbox may be written.
  if constexpr (kCluster) cluster_arrive_relaxed();

  // Lengths and page ids come from the host, not from the kernel before this one: they are read
  // before the upstream wait (a programmatic launch may start while the QKV kernel finishes).
  const SplitRange range = split_range(a, sequence, split);
  if (range.length == 0) {  // padded batch slot: zeros, once
    wait_for_upstream_grids();
    if (split == 0)
      for (int i = threadIdx.x; i < a.group * D / 8; i += BlockShape<W>::kThreads)
        reinterpret_cast<uint4*>(out)[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  if (split >= range.active) return;

  PageStream<D, W> stream(a, range, shared, sequence, kv_head, warp, lane);
  // The first S - 1 pages. Pages before those holding the keys the QKV kernel appends (the
  // current token's, and in a verify step its sequence's earlier entries', which may sit on the
  // page before) hold keys of earlier steps, written by kernels long finished: their copies start
  // before the upstream wait, overlapping the QKV kernel's tail. The appended keys' pages and q
  // wait for it. (This loop stays in the kernel: inside a helper it is unrolled before it is
  // inlined, differently.)
  constexpr int S = Geometry<D>::kStages;
  const int appended_page = first_appended_page(range.length, a.appended_keys);
  int primed = 0;
  while (primed < S - 1 && stream.first_page + W * primed < appended_page) stream.issue(primed++);
  wait_for_upstream_grids();
  trace::stamp(trace::Kernel::unknown, trace::Mark::upstream);
  while (primed < S - 1) stream.issue(primed++);
  WarpState<D, HT> state;
  load_q_fragments(a, group_row0, g, t, state);
  attend_pages(stream, a.scale_log2, lane, state);
  trace::stamp(trace::Kernel::unknown, trace::Mark::phase);
  // The cache reads are done: a programmatic next kernel (o_proj) may take the SMs blocks leave
  // and start its own prologue; it still waits for this whole grid before reading the output.
  allow_downstream_launch();
  finish_row_sums(state);
  __syncthreads();  // every warp is done with its ring: the merge scratch overlays the rings
  const MergeScratch<D, HT, W> scratch(shared);
  write_warp_state(scratch, state, warp, g, t);
  __syncthreads();

  const bool only_split = range.active == 1;
  const size_t slot = (static_cast<size_t>(sequence) * a.kv_heads + kv_head) * a.splits + split;
  Mailbox<D>* mailbox = nullptr;  // the first block's, for a cluster merge
  if constexpr (kCluster) {
    if (!only_split) {
      cluster_wait_acquire();  // phase 1: every block of the cluster has started
      mailbox = in_block<kMaxClusterSplits>(reinterpret_cast<Mailbox<D>*>(shared + BlockShape<W>::kSharedBytes), 0);
    }
  }
  merge_warps<D, HT, W, kCluster>(a, scratch, only_split, slot, split, mailbox, out);
  trace::stamp(trace::Kernel::unknown, trace::Mark::end);
  if (only_split) return;

  if constexpr (kCluster) {
    // Phase 2: this split's slot is written (release); the first block waits for every split.
    cluster_arrive_release();
    if (split != 0) return;
    cluster_wait_acquire();
    merge_mailbox<D, W>(*mailbox, range.active, a.group, out);
    trace::stamp(trace::Kernel::unknown, trace::Mark::finish);
    return;
  }
  if (!last_to_arrive(a.counters + static_cast<size_t>(sequence) * a.kv_heads + kv_head, range.active)) return;
  merge_splits<D, HT, W>(a, range.active, slot - split, out, shared);
  trace::stamp(trace::Kernel::unknown, trace::Mark::finish);
}

// Shared-memory opt-in, once per (instantiation, device).
template <int D, int HT, int W, bool kCluster>
cudaError_t prepare_kernel() {
  static PerDevice<bool> prepared;
  bool done = false;
  return prepared.get(done, [](bool& ok) {
    auto kernel = decode_attention_kernel<D, HT, W, kCluster>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             kernel_shared_bytes<D, W, kCluster>());
        e != cudaSuccess)
      return e;
    ok = true;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  });
}

template <int D, int HT, int W, bool kCluster = false>
cudaError_t launch_instance(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  if (cudaError_t e = prepare_kernel<D, HT, W, kCluster>(); e != cudaSuccess) return e;
  trace::attach_unit();
  // A programmatic dependent launch: blocks may start (lengths, page ids) while the kernel before
  // finishes; they wait for it before reading q and the cache. Faster in the decode step
  // (docs/kernels/decode_attention.md, "Programmatic dependent launch").
  const ClusterLaunch launch(grid, BlockShape<W>::kThreads, kernel_shared_bytes<D, W, kCluster>(),
                             kCluster ? static_cast<int>(grid.x) : 1, stream, /*programmatic=*/true);
  return cudaLaunchKernelEx(&launch.config, decode_attention_kernel<D, HT, W, kCluster>, args);
}

// Thread-block clusters (sm_90 and later) on the current device.
bool device_has_clusters() {
  DeviceAttributes device;
  return current_device_attributes(device) == cudaSuccess && device.has_clusters();
}

// A refused query is an answer too: no clusters (counts of 0), kept like any other.
template <int D>
ResidentClusters resident_clusters_of() {
  static PerDevice<ResidentClusters> known;
  ResidentClusters resident;
  DF_CHECK_CUDA(known.get(resident, [](ResidentClusters& r) {
    if (!device_has_clusters() || prepare_kernel<D, 1, 8, true>() != cudaSuccess) {
      cudaGetLastError();  // leave nothing behind for the next launch
      return cudaSuccess;
    }
    for (int cluster : {2, 4, 8}) {
      const ClusterLaunch probe(dim3(cluster, 1, 1), BlockShape<8>::kThreads, kernel_shared_bytes<D, 8, true>(),
                                cluster, nullptr);
      int count = 0;
      if (cudaOccupancyMaxActiveClusters(&count, decode_attention_kernel<D, 1, 8, true>, &probe.config) != cudaSuccess) {
        cudaGetLastError();
        r = ResidentClusters{};
        return cudaSuccess;
      }
      (cluster == 2 ? r.of2 : cluster == 4 ? r.of4 : r.of8) = count;
    }
    return cudaSuccess;
  }));
  return resident;
}

}  // namespace

ResidentClusters decode_attention_resident_clusters(int head_dim) {
  DF_CHECK(head_dim == 64 || head_dim == 128, "decode attention: head_dim " + std::to_string(head_dim) + " (64 or 128 supported)");
  return head_dim == 64 ? resident_clusters_of<64>() : resident_clusters_of<128>();
}

cudaError_t launch_decode_attention(const DecodeAttentionPlan& plan, const DecodeAttentionParams& params,
                                    cudaStream_t stream) {
  const PagedKv& kv = params.kv;
  if (!plan_is_consistent(plan)) return cudaErrorInvalidValue;
  if (!params.q || !params.out || !params.seq_lens || !kv.k_pages || !kv.v_pages || !kv.block_table)
    return cudaErrorInvalidValue;
  if (kv.kv_heads != plan.kv_heads || kv.head_dim != plan.head_dim ||
      static_cast<long long>(kv.max_pages_per_seq) * kKvPageSize < plan.max_context)
    return cudaErrorInvalidValue;
  if (!aligned(params.q, 4) || !aligned(params.out, 16) || !aligned(kv.k_pages, 16) || !aligned(kv.v_pages, 16))
    return cudaErrorInvalidValue;
  if (plan.workspace_bytes > 0 && (!params.workspace || !aligned(params.workspace, 16))) return cudaErrorInvalidValue;
  if (!(params.scale > 0.0f) || !std::isfinite(params.scale) || params.sliding_window < 0 || params.appended_keys < 1)
    return cudaErrorInvalidValue;

  const int group = plan.q_heads / plan.kv_heads;
  const WorkspaceLayout layout = workspace_layout(plan.batch, plan.kv_heads, group, plan.head_dim, plan.splits_per_sequence);
  unsigned char* workspace = static_cast<unsigned char*>(params.workspace);
  KernelArgs args{};
  args.q = params.q;
  args.out = params.out;
  args.k_pages = kv.k_pages;
  args.v_pages = kv.v_pages;
  args.block_table = kv.block_table;
  args.sequences = params.sequences;
  args.seq_lens = params.seq_lens;
  args.appended_keys = params.appended_keys;
  args.counters = layout.bytes ? reinterpret_cast<unsigned*>(workspace) : nullptr;
  args.lse = layout.bytes ? reinterpret_cast<float*>(workspace + layout.lse_offset) : nullptr;
  args.partial =
      layout.bytes ? reinterpret_cast<__nv_bfloat16*>(workspace + layout.partial_offset) : nullptr;
  args.max_pages_per_seq = kv.max_pages_per_seq;
  args.kv_heads = plan.kv_heads;
  args.group = group;
  args.splits = plan.splits_per_sequence;
  args.min_pages_per_split = plan.min_pages_per_split;
  args.max_context = plan.max_context;
  args.sliding_window = params.sliding_window;
  args.scale_log2 = params.scale * kLog2e;

  const dim3 grid(plan.splits_per_sequence, plan.kv_heads, plan.batch);
  const bool one_tile = group <= 8;
  if (plan.cluster_merge && device_has_clusters()) {
    return plan.head_dim == 64 ? launch_instance<64, 1, 8, true>(args, grid, stream)
                               : launch_instance<128, 1, 8, true>(args, grid, stream);
  }
  if (plan.warps_per_block == 8) {
    if (plan.head_dim == 64)
      return one_tile ? launch_instance<64, 1, 8>(args, grid, stream) : launch_instance<64, 2, 8>(args, grid, stream);
    return one_tile ? launch_instance<128, 1, 8>(args, grid, stream) : launch_instance<128, 2, 8>(args, grid, stream);
  }
  if (plan.head_dim == 64)
    return one_tile ? launch_instance<64, 1, 4>(args, grid, stream) : launch_instance<64, 2, 4>(args, grid, stream);
  return one_tile ? launch_instance<128, 1, 4>(args, grid, stream) : launch_instance<128, 2, 4>(args, grid, stream);
}

int decode_attention_launches(const DecodeAttentionPlan&) { return 1; }

}  // namespace deepfuse::kernels
