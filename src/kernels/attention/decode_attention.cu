// Split-KV paged decode attention ("flash-decoding") in one launch. Design notes, versions and
// measurements: docs/kernels/decode_attention.md.
//
// What it computes. For each sequence b and query head h (kv head h / G, G = q_heads / kv_heads):
//   out[b, h] = softmax(q[b, h] · K^T * scale) · V   over the keys first..len-1 of sequence b,
// first = len - window with a sliding window, else 0. K and V come from the paged cache
// (paged_kv.cuh): a (page, kv head) is 16 tokens x head_dim contiguous bf16.
//
// The two numbers. Per key and kv head: K + V = 4·D bytes, 4·G·D FLOPs (q·k and p·v): G FLOP per
// byte, nothing for tensor cores. The floor is K+V bytes over the copy bandwidth: 1 x 32k tokens,
// 8 kv heads, D = 128 is 134 MB = 31 µs at 4.3 TB/s; 1 x 8k is 34 MB = 7.8 µs.
//
// Filling the GPU. A block owns one (sequence, kv head, split): the sequence's pages in the
// window are cut into `splits` equal chunks on the device (lengths are read there, so one graph
// serves every length up to plan.max_context). Blocks are 4 warps (two per SM) or, for a single
// sequence, 8 warps (one per SM, a split streamed twice as fast: half the partials to merge). The
// plan picks splits so that batch x kv_heads x splits blocks fill the resident block slots
// without a ragged last wave: 1 x 8k gets 16 splits of 32 pages, 1 x 32k 16 of 128, 8 x 32k 4
// splits of 4 warps, 32 x 8k one. A shorter sequence takes fewer splits of at least
// plan.min_pages_per_split (2 per warp; 8 per warp where the batch fills every block slot
// unsplit) pages: its merge would cost more than the streaming the extra splits spread.
//
// Bytes in flight (Little's law). 4.3 TB/s x ~1 µs of loaded HBM latency is ~4.3 MB in flight,
// ~33 KB per SM. Each warp streams its own pages (warp w takes pages w, w+W, ...) through its
// own ring of cp.async stages in shared memory, one (K page, V page) pair per stage: 3 stages of
// 8 KB at D = 128, 6 of 4 KB at D = 64, 24 KB per warp. With one stage being consumed, 16-20 KB
// per warp are in flight: 128-160 KB per SM with 8 warps resident, about 4x
// what Little asks, so latency spikes and the start of each block are covered. At 1 x 8k each
// warp has only ~4 pages: all its loads go out at once.
//
// Math per page (16 keys), one warp, tensor cores (mma.m16n8k16, bf16 in, fp32 accumulate):
//   S^T[16 keys x 8 heads] = K[16 x D] · Q^T   A = K from shared memory (ldmatrix), B = Q held in
//                                              registers for the whole block;
//   online softmax per head (the 16 keys sit in one column: a 3-step shuffle gives its max);
//   O^T[D x 8 heads] += V^T · P^T              A = V^T (ldmatrix.trans), B = P^T, which is S^T's
//                                              accumulator rounded to bf16 and transposed in
//                                              registers by movmatrix.
// Up to 8 query heads share one n-tile, so the group's heads cost one read of K/V; groups of
// 9..16 use two n-tiles. Shared rows are XOR-swizzled by 16-byte chunk (chunk ^ row % 8) so the
// 8 rows an ldmatrix phase reads hit 8 different bank groups.
//
// Merge. The warps of a block meet in shared memory (max, sum, O per head). A block that is
// its sequence's only split writes bf16 out directly. Otherwise it writes its normalised partial O
// (bf16) and log-sum-exp (fp32) to the workspace and takes a ticket (release + acquire) from the
// (sequence, kv head) counter; the last block to arrive pulls every split's partials through
// cp.async (one L2 round trip per chunk that fits in shared memory), weights them by
// exp2(lse - max lse), writes out, and resets the counter to zero for the next launch. One launch
// per call, no host synchronisation. A plan with cluster_merge (at most 8 splits of 8 warps; the
// engine's short-context plans) makes the splits of a (sequence, kv head) one thread-block
// cluster instead: each writes its partial into the first block's shared memory and arrives at a
// cluster barrier, and the first block merges, without a ticket or an L2 round trip.
//
// Overlap with the kernels around it (programmatic dependent launch): lengths, page ids and the
// first pages of the cache (all but the newest page, which the QKV kernel before this one writes)
// are requested before the upstream wait; after its last cache read a block lets the next kernel
// start. Per-block timelines and versions: docs/kernels/decode_attention.md.
//
// Padding and bounds: rows of a page outside [first, len) are zero-filled by cp.async and masked
// to -inf, so whatever the cache holds there (even NaN) never reaches the output; pages past the
// sequence's last one are never read; len is clamped to [0, plan.max_context]; len = 0 writes 0.
#include "deepfuse/kernels/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "deepfuse/error.hpp"
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

constexpr int kRingBytesPerWarp = 24 * 1024;
constexpr int kMaxGroup = 16;                  // query heads per kv head: two 8-wide n-tiles
constexpr int kMaxSplits = 256;
// Plan costs in pages a 4-warp block streams (~0.5 µs each at a 1/264 share of 4.3 TB/s): a
// block's start (length, then page-table reads) and a split merge each cost about two. The model
// fills every resident slot: plans of one 4-warp block per SM stream as fast alone, but lose in a
// graph where the next launch starts early (docs/kernels/decode_attention.md, "Where the time
// goes (v1, per-block timelines)").
constexpr int kBlockStartPages = 2;
constexpr int kMergePages = 2;
// Inside the decode step a split merge costs more than the model's two pages: the last block's
// ticket, its L2 round trips for the partials and the next kernel's wait come after the stream
// (docs/kernels/decode_attention.md, "Short sequences in a long plan: at least 8 pages per
// split"). A sequence shorter than max_context therefore keeps at least this many pages per split
// (4-warp blocks; twice as many for 8 warps); the plan's split count is only reached by long ones.
constexpr int kMinPagesPerSplit = 8;
// Where the batch's (sequence, kv head) pairs fill every resident block slot unsplit, splits only
// even out the waves, and an 8-page split's merge is pure cost: Llama-3-8B at batch 64 with
// 512-token sequences under a plan for 32k (17 splits) ran 4% slower steps with 4 splits of 8
// pages than unsplit (docs/kernels/decode_attention.md, "Batches that fill the GPU unsplit").
constexpr int kMinPagesPerSplitFullWave = 32;
// What a short-context plan's splits may stream at least (their bound, in pages each): the L2
// plans' minimum split (16 pages in 8 warps, 8 in 4), so that up to there only the merge changes.
constexpr int kClusterSplitBoundPages = 16;
// The cluster splits may stream longer: each page more per split is worth it while the L2 merge
// it spares costs more, and that merge's last block reads every split's bf16 partial of every
// query head of the group (splits x group x head_dim x 2 bytes). One page per split for each
// kMergeBytesPerClusterPage of them, fitted to where one sequence's 8 cluster splits stopped
// paying in the decode step (docs/kernels/decode_attention.md, "Longer cluster splits where the
// merge is large").
constexpr int kMergeBytesPerClusterPage = 400;
// A batch's cluster splits (4 per sequence for two, 2 for three or four) stream 32 to 64 pages,
// whatever the merge: where a batch's clusters gained in the step (same section).
constexpr int kBatchClusterSplitMinPages = 32;
constexpr int kBatchClusterSplitMaxPages = 64;

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
// merges them: no ticket and no L2 round trip after the last partial. At most 8 splits (the
// portable cluster size; the H200 holds 15 clusters of 8 one-per-SM blocks at once, 7 of 16),
// 8-warp blocks (the mailbox does not fit beside two 4-warp blocks per SM), one 8-head n-tile.
constexpr int kMaxClusterSplits = 8;

template <int D>
struct Mailbox {  // after the rings in the first block of the cluster: one slot per split
  float lse[kMaxClusterSplits][8];
  float partial[kMaxClusterSplits][8][D];  // normalised, fp32
};

template <int D, int W, bool kCluster>
constexpr int kernel_shared_bytes() {
  return BlockShape<W>::kSharedBytes + (kCluster ? static_cast<int>(sizeof(Mailbox<D>)) : 0);
}

// ---- Workspace: [counters (batch*kv_heads u32)] [lse (pairs*splits*G f32)] [partial O (pairs*splits*G*D bf16)]
struct WorkspaceLayout {
  size_t lse_offset = 0;
  size_t partial_offset = 0;
  size_t bytes = 0;
};

size_t align_up(size_t bytes, size_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

WorkspaceLayout workspace_layout(int batch, int kv_heads, int group, int head_dim, int splits) {
  WorkspaceLayout layout;
  if (splits <= 1) return layout;  // a single split writes the output directly
  const size_t pairs = static_cast<size_t>(batch) * kv_heads;
  layout.lse_offset = align_up(pairs * sizeof(unsigned), 256);
  layout.partial_offset = layout.lse_offset + align_up(pairs * splits * group * sizeof(float), 256);
  layout.bytes = layout.partial_offset + pairs * splits * group * head_dim * sizeof(__nv_bfloat16);
  return layout;
}

struct KernelArgs {
  const __nv_bfloat16* q;
  __nv_bfloat16* out;
  const __nv_bfloat16* k_pages;
  const __nv_bfloat16* v_pages;
  const int32_t* block_table;
  const int32_t* seq_lens;
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

// One block per (split, kv head, sequence) = (blockIdx.x, .y, .z). HT: 8-head n-tiles (1 or 2);
// W: warps per block; kCluster: the splits of a (sequence, kv head) are one cluster and merge
// in its first block (else through the workspace).
template <int D, int HT, int W, bool kCluster>
__global__ void __launch_bounds__(BlockShape<W>::kThreads, BlockShape<W>::kPerSm)
    decode_attention_kernel(const KernelArgs a) {
  static_assert(!kCluster || (W == 8 && HT == 1), "cluster merges: 8-warp blocks, at most 8 heads per kv head");
  using Geo = Geometry<D>;
  constexpr int kWarps = W, kThreads = BlockShape<W>::kThreads, kSharedBytes = BlockShape<W>::kSharedBytes;
  constexpr int S = Geo::kStages;
  extern __shared__ __align__(128) unsigned char shared[];
  __shared__ unsigned ticket;
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
      for (int i = threadIdx.x; i < a.group * D / 8; i += kThreads) reinterpret_cast<uint4*>(out)[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  if (split >= range.active) return;

  // ---- This warp's pages: range.page_begin + warp + kWarps * j, j < my_pages. Their ids come
  // 32 at a time (lane l holds entry j = 32c + l), the next 32 fetched a chunk ahead.
  const int32_t* table_row = a.block_table + static_cast<size_t>(sequence) * a.max_pages_per_seq;
  const int warp_page0 = range.page_begin + warp;
  const int span = range.page_end - range.page_begin;
  const int my_pages = span > warp ? (span - warp + kWarps - 1) / kWarps : 0;
  auto page_ids = [&](int chunk) -> int32_t {
    const int j = 32 * chunk + lane;
    return j < my_pages ? table_row[warp_page0 + kWarps * j] : 0;
  };
  int32_t ids_now = page_ids(0), ids_next = page_ids(1);

  const unsigned ring = shared_address(shared) + warp * kRingBytesPerWarp;
  const size_t page_stride = static_cast<size_t>(a.kv_heads) * kKvPageSize * D;  // elements per page id
  const size_t head_offset = static_cast<size_t>(kv_head) * kKvPageSize * D;

  // K/V pages are read once per step, like the weights: evict-first in L2 (l2_policy.cuh). In the
  // decode step 0.3-1.6% faster from 2k tokens up, Llama-3.2-1B at 512 tokens 0.1-0.5% slower
  // (docs/kernels/decode_attention.md, "K/V pages marked evict-first").
  const uint64_t read_once = evict_first_policy();
  // Starts the copies of this warp's page j into stage j % S (and commits, even when empty, so
  // every stage is one commit group).
  auto issue = [&](int j) {
    if (j < my_pages) {
      if (j % 32 == 0 && j > 0) {
        ids_now = ids_next;
        ids_next = page_ids(j / 32 + 1);
      }
      const int32_t id = __shfl_sync(0xffffffffu, ids_now, j % 32);
      const int token0 = (warp_page0 + kWarps * j) * kKvPageSize;
      const size_t offset = static_cast<size_t>(id) * page_stride + head_offset;
      const unsigned stage = ring + (j % S) * Geo::kStageBytes;
#pragma unroll
      for (int r = 0; r < Geo::kChunksPerLane; ++r) {
        const int chunk = lane + 32 * r;
        const int row = chunk / Geo::kChunksPerRow, column = chunk % Geo::kChunksPerRow;
        const int token = token0 + row;
        const bool valid = token >= range.first_key && token < range.length;
        const unsigned destination = stage + (row * Geo::kChunksPerRow + (column ^ (row & 7))) * 16;
        copy16_async_with_policy(destination, a.k_pages + offset + chunk * 8, read_once, valid);
        copy16_async_with_policy(destination + Geo::kPageBytes, a.v_pages + offset + chunk * 8, read_once, valid);
      }
    }
    commit_async();
  };

  // Pages before the newest hold keys of earlier steps, written by kernels long finished: their
  // copies start before the upstream wait, overlapping the QKV kernel's tail. The newest page
  // (the current token's key, appended by the QKV kernel) and q wait for it.
  const int newest_page = (range.length - 1) / kKvPageSize;
  int primed = 0;
  while (primed < S - 1 && warp_page0 + kWarps * primed != newest_page) issue(primed++);
  wait_for_upstream_grids();
  trace::stamp(trace::Kernel::unknown, trace::Mark::upstream);
  while (primed < S - 1) issue(primed++);
  // Q as mma B fragments: b0 = q[head g][16k + 2t, +1], b1 = the same 8 dims later.
  uint32_t q_frag[HT][Geo::kDimSteps][2];
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
    const int head = 8 * ht + g;
    const __nv_bfloat16* q_row = a.q + (group_row0 + head) * D + 2 * t;
#pragma unroll
    for (int k = 0; k < Geo::kDimSteps; ++k) {
      q_frag[ht][k][0] = head < a.group ? *reinterpret_cast<const uint32_t*>(q_row + 16 * k) : 0u;
      q_frag[ht][k][1] = head < a.group ? *reinterpret_cast<const uint32_t*>(q_row + 16 * k + 8) : 0u;
    }
  }

  // ldmatrix row addresses. K (A = keys x dims): matrices {keys 0-7, 8-15} x {dims +0, +8}, lane l
  // points at key l % 16, chunk 2k + l / 16. V^T (A = dims x keys, transposed load): matrices
  // {dims +0, +8} x {keys 0-7, 8-15}: key l % 8 + 8 (l / 16), chunk 2m + (l / 8) % 2.
  const int k_row = lane & 15, v_row = (lane & 7) + 8 * (lane >> 4);
  const int k_swizzle = (lane >> 4) ^ (lane & 7), v_swizzle = ((lane >> 3) & 1) ^ (lane & 7);
  const unsigned k_lane = k_row * Geo::kChunksPerRow * 16, v_lane = v_row * Geo::kChunksPerRow * 16;

  float o[HT][Geo::kDimSteps][4];  // O^T: [dim 16m + g (+8)][head 2t, 2t+1]
  float row_max[HT][2], row_sum[HT][2];  // per head 2t, 2t+1 of each tile; sums are per lane until the end
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
    for (int m = 0; m < Geo::kDimSteps; ++m) o[ht][m][0] = o[ht][m][1] = o[ht][m][2] = o[ht][m][3] = 0.0f;
    row_max[ht][0] = row_max[ht][1] = -INFINITY;
    row_sum[ht][0] = row_sum[ht][1] = 0.0f;
  }

  auto consume = [&](int j) {
    const unsigned k_stage = ring + (j % S) * Geo::kStageBytes, v_stage = k_stage + Geo::kPageBytes;
    float s[HT][4];
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) s[ht][0] = s[ht][1] = s[ht][2] = s[ht][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < Geo::kDimSteps; ++k) {
      const uint4 keys = load_matrix_x4(k_stage + k_lane + ((2 * k) ^ k_swizzle) * 16);
#pragma unroll
      for (int ht = 0; ht < HT; ++ht) mma_bf16_m16n8k16(s[ht], keys, q_frag[ht][k][0], q_frag[ht][k][1]);
    }
    // S^T rows are keys g and g + 8 of the page; every page holds at least one key in range, so
    // each head's running max is finite after its first page.
    const int key_low = (warp_page0 + kWarps * j) * kKvPageSize + g, key_high = key_low + 8;
    const bool low_in = key_low >= range.first_key && key_low < range.length;
    const bool high_in = key_high >= range.first_key && key_high < range.length;
    uint32_t p_frag[HT][2];
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
      const float x0 = low_in ? s[ht][0] * a.scale_log2 : -INFINITY, x1 = low_in ? s[ht][1] * a.scale_log2 : -INFINITY;
      const float x2 = high_in ? s[ht][2] * a.scale_log2 : -INFINITY, x3 = high_in ? s[ht][3] * a.scale_log2 : -INFINITY;
      float page_max0 = fmaxf(x0, x2), page_max1 = fmaxf(x1, x3);
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) {  // over g: the 16 keys of head column 2t (+1)
        page_max0 = fmaxf(page_max0, __shfl_xor_sync(0xffffffffu, page_max0, offset));
        page_max1 = fmaxf(page_max1, __shfl_xor_sync(0xffffffffu, page_max1, offset));
      }
      const float max0 = fmaxf(row_max[ht][0], page_max0), max1 = fmaxf(row_max[ht][1], page_max1);
      const float alpha0 = exp2f(row_max[ht][0] - max0), alpha1 = exp2f(row_max[ht][1] - max1);
      row_max[ht][0] = max0, row_max[ht][1] = max1;
      const uint32_t p_low = pack_bf16x2(exp2f(x0 - max0), exp2f(x1 - max1));   // key g
      const uint32_t p_high = pack_bf16x2(exp2f(x2 - max0), exp2f(x3 - max1));  // key g + 8
      // Sum the bf16-rounded weights the p·v product uses, so the normalisation matches them.
      row_sum[ht][0] = row_sum[ht][0] * alpha0 + low_bf16(p_low) + low_bf16(p_high);
      row_sum[ht][1] = row_sum[ht][1] * alpha1 + high_bf16(p_low) + high_bf16(p_high);
#pragma unroll
      for (int m = 0; m < Geo::kDimSteps; ++m) {
        o[ht][m][0] *= alpha0, o[ht][m][1] *= alpha1, o[ht][m][2] *= alpha0, o[ht][m][3] *= alpha1;
      }
      p_frag[ht][0] = transpose_8x8(p_low);   // P^T B fragment: keys 2t, 2t+1 of head g
      p_frag[ht][1] = transpose_8x8(p_high);  // keys 2t+8, 2t+9
    }
#pragma unroll
    for (int m = 0; m < Geo::kDimSteps; ++m) {
      const uint4 values = load_matrix_x4_transposed(v_stage + v_lane + ((2 * m) ^ v_swizzle) * 16);
#pragma unroll
      for (int ht = 0; ht < HT; ++ht) mma_bf16_m16n8k16(o[ht][m], values, p_frag[ht][0], p_frag[ht][1]);
    }
  };

  // ---- The ring: S - 1 pages in flight while one is consumed (the first S - 1 issued above).
  for (int j = 0; j < my_pages; ++j) {
    __syncwarp();  // every lane has read stage (j - 1) % S before it is refilled
    issue(j + S - 1);
    wait_async<S - 1>();  // this lane's copies of page j have landed
    __syncwarp();         // ... and every other lane's
    consume(j);
  }
  wait_async<0>();
  trace::stamp(trace::Kernel::unknown, trace::Mark::phase);
  // The cache reads are done: a programmatic next kernel (o_proj) may take the SMs blocks leave
  // and start its own prologue; it still waits for this whole grid before reading the output.
  allow_downstream_launch();
#pragma unroll
  for (int ht = 0; ht < HT; ++ht)
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2)
        row_sum[ht][c] += __shfl_xor_sync(0xffffffffu, row_sum[ht][c], offset);
  __syncthreads();  // every warp is done with its ring: the merge scratch overlays the rings

  // ---- Block merge: scratch = O[warp][head][dim] (padded rows), then max and sum per (warp, head).
  constexpr int kHeads = 8 * HT;
  float* scratch = reinterpret_cast<float*>(shared);
  float* warp_max_of = scratch + kWarps * kHeads * Geo::kScratchStride;
  float* warp_sum_of = warp_max_of + kWarps * kHeads;
  static_assert((kWarps * kHeads * (D + 4) + 2 * kWarps * kHeads) * 4 <= kSharedBytes, "merge scratch fits the rings");
  {
    float* mine = scratch + warp * kHeads * Geo::kScratchStride;
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
      const int head = 8 * ht + 2 * t;
#pragma unroll
      for (int m = 0; m < Geo::kDimSteps; ++m) {
        const int dim = 16 * m + g;
        mine[head * Geo::kScratchStride + dim] = o[ht][m][0];
        mine[(head + 1) * Geo::kScratchStride + dim] = o[ht][m][1];
        mine[head * Geo::kScratchStride + dim + 8] = o[ht][m][2];
        mine[(head + 1) * Geo::kScratchStride + dim + 8] = o[ht][m][3];
      }
      if (g == 0) {
        warp_max_of[warp * kHeads + head] = row_max[ht][0], warp_max_of[warp * kHeads + head + 1] = row_max[ht][1];
        warp_sum_of[warp * kHeads + head] = row_sum[ht][0], warp_sum_of[warp * kHeads + head + 1] = row_sum[ht][1];
      }
    }
  }
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
  for (int item = threadIdx.x; item < a.group * (D / 4); item += kThreads) {
    const int head = item / (D / 4), dim = 4 * (item % (D / 4));
    float best = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) best = fmaxf(best, warp_max_of[w * kHeads + head]);
    float total = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(warp_max_of[w * kHeads + head] - best);  // 0 for a warp without pages
      total += f * warp_sum_of[w * kHeads + head];
      const float4 v = *reinterpret_cast<const float4*>(scratch + (w * kHeads + head) * Geo::kScratchStride + dim);
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

  // ---- Last block of the (sequence, kv head) merges the splits. The barrier orders every
  // thread's partial writes before thread 0's ticket, whose release makes them visible GPU-wide
  // and whose acquire (for the last block) makes the other blocks' visible to this one; the
  // second barrier hands that on to the block. Cheaper than a full fence on each side.
  __syncthreads();
  unsigned* counter = a.counters + static_cast<size_t>(sequence) * a.kv_heads + kv_head;
  if (threadIdx.x == 0) ticket = ticket_acq_rel(counter);
  __syncthreads();
  if (ticket != static_cast<unsigned>(range.active - 1)) return;
  if (threadIdx.x == 0) atomicExch(counter, 0u);  // every split has counted: ready for the next launch
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

int pages_for(int context) { return (context + kKvPageSize - 1) / kKvPageSize; }

// Thread-block clusters (sm_90 and later) on the current device.
bool device_has_clusters() {
  DeviceAttributes device;
  return current_device_attributes(device) == cudaSuccess && device.has_clusters();
}

// The plan as plan_decode_attention makes it; anything else is a caller's mistake.
bool plan_is_consistent(const DecodeAttentionPlan& plan) {
  if (plan.batch < 1 || plan.kv_heads < 1 || plan.q_heads < 1 || plan.q_heads % plan.kv_heads != 0 ||
      plan.q_heads / plan.kv_heads > kMaxGroup || (plan.head_dim != 64 && plan.head_dim != 128) ||
      plan.max_context < 1 || plan.splits_per_sequence < 1 || plan.splits_per_sequence > kMaxSplits ||
      plan.pages_per_split < 1 || plan.min_pages_per_split < 1 || (plan.warps_per_block != 4 && plan.warps_per_block != 8))
    return false;
  if (static_cast<long long>(plan.splits_per_sequence) * plan.pages_per_split < pages_for(plan.max_context)) return false;
  if (plan.cluster_merge && (plan.warps_per_block != 8 || plan.q_heads / plan.kv_heads > 8 ||
                             plan.splits_per_sequence < 2 || plan.splits_per_sequence > kMaxClusterSplits))
    return false;
  const WorkspaceLayout layout = workspace_layout(plan.batch, plan.kv_heads, plan.q_heads / plan.kv_heads,
                                                  plan.head_dim, plan.splits_per_sequence);
  return plan.workspace_bytes >= layout.bytes && plan.batch <= 65535 && plan.kv_heads <= 65535;
}

}  // namespace

DecodeAttentionPlan plan_decode_attention(int batch, int q_heads, int kv_heads, int head_dim, int max_context,
                                          int num_sms, int forced_splits, int forced_warps, SplitMerge merge) {
  auto text = [](int v) { return std::to_string(v); };
  DF_CHECK(batch >= 1 && batch <= 65535, "decode attention: batch " + text(batch) + " is outside [1, 65535]");
  DF_CHECK(kv_heads >= 1 && kv_heads <= 65535, "decode attention: kv_heads " + text(kv_heads) + " is outside [1, 65535]");
  DF_CHECK(q_heads >= 1 && q_heads % kv_heads == 0,
           "decode attention: q_heads " + text(q_heads) + " is not a positive multiple of kv_heads " + text(kv_heads));
  DF_CHECK(q_heads / kv_heads <= kMaxGroup, "decode attention: " + text(q_heads / kv_heads) +
                                                " query heads per kv head; at most " + text(kMaxGroup) + " supported");
  DF_CHECK(head_dim == 64 || head_dim == 128, "decode attention: head_dim " + text(head_dim) + " (64 or 128 supported)");
  DF_CHECK(max_context >= 1, "decode attention: max_context " + text(max_context) + " must be at least 1");
  DF_CHECK(num_sms >= 1, "decode attention: num_sms " + text(num_sms) + " must be at least 1");
  DF_CHECK(forced_splits >= 0 && forced_splits <= kMaxSplits,
           "decode attention: forced_splits " + text(forced_splits) + " is outside [0, " + text(kMaxSplits) + "]");
  DF_CHECK(forced_warps == 0 || forced_warps == 4 || forced_warps == 8,
           "decode attention: forced_warps " + text(forced_warps) + " (0, 4 or 8 supported)");
  const int group = q_heads / kv_heads;
  DF_CHECK(merge != SplitMerge::cluster || (group <= 8 && forced_warps != 4 && forced_splits <= kMaxClusterSplits),
           "decode attention: a cluster merge needs blocks of 8 warps, at most 8 query heads per kv head and at most " +
               text(kMaxClusterSplits) + " splits");
  const int max_pages = pages_for(max_context);
  const bool cluster = merge == SplitMerge::cluster;

  // A single sequence takes blocks of 8 warps: half the splits and partials for its merge; faster
  // at batch 1, mixed at 2-8 sequences (docs/kernels/decode_attention.md, "Blocks of 8 warps for
  // one sequence").
  const long long pairs = static_cast<long long>(batch) * kv_heads;
  const int warps = forced_warps > 0 ? forced_warps : batch == 1 || cluster ? 8 : 4;
  const long long slots = static_cast<long long>(num_sms) * (8 / warps);
  const int min_pages = (pairs >= slots ? kMinPagesPerSplitFullWave : kMinPagesPerSplit) * warps / 4;
  // Cost of s splits, in pages a 4-warp block streams: waves of resident blocks times each
  // block's start and pages, plus the merge. Only s that leave no split empty are distinct. The
  // plan serves every length up to max_context, and shorter sequences run fewer, shorter splits
  // (min_pages each), so a grid of several waves at max_context runs a wave and a part at mid
  // lengths: where the pairs fit one wave, the plan keeps to one (docs/kernels/decode_attention.md,
  // "One wave where the pairs fit one").
  int best_splits = 1;
  long long best_cost = std::numeric_limits<long long>::max();
  for (int splits = 1; splits <= std::min(max_pages, kMaxSplits); ++splits) {
    const int per_split = (max_pages + splits - 1) / splits;
    if ((max_pages + per_split - 1) / per_split != splits) continue;
    const long long waves = (pairs * splits + slots - 1) / slots;
    if (pairs <= slots && waves > 1) continue;
    const long long cost = waves * (kBlockStartPages + (per_split * 4 + warps - 1) / warps) + (splits > 1 ? kMergePages : 0);
    if (cost < best_cost) best_cost = cost, best_splits = splits;
  }

  // The count of distinct non-empty splits nearest below a request.
  auto distinct_splits = [&](int requested) {
    const int per_split = (max_pages + requested - 1) / requested;
    return (max_pages + per_split - 1) / per_split;
  };
  if (forced_splits > 0) {
    best_splits = distinct_splits(std::min(forced_splits, max_pages));
  } else if (cluster) {  // one cluster per (sequence, kv head): as many splits as it holds
    best_splits = distinct_splits(std::min(max_pages, kMaxClusterSplits));
  }

  DecodeAttentionPlan plan;
  plan.batch = batch;
  plan.q_heads = q_heads;
  plan.kv_heads = kv_heads;
  plan.head_dim = head_dim;
  plan.max_context = max_context;
  plan.splits_per_sequence = best_splits;
  plan.pages_per_split = (max_pages + best_splits - 1) / best_splits;
  // A cluster merge is cheap enough that every split streams even at a few pages
  // (docs/kernels/decode_attention.md, "Splits merged in a cluster").
  plan.min_pages_per_split = forced_splits > 0 || cluster ? 1 : min_pages;
  plan.warps_per_block = warps;
  plan.cluster_merge = cluster && best_splits > 1;
  plan.workspace_bytes = workspace_layout(batch, kv_heads, q_heads / kv_heads, head_dim, best_splits).bytes;
  return plan;
}

namespace {

// Pages one split of a short-context plan may stream, against the L2 plan it stands in for. The
// rule was measured where the clusters hold 32 (Qwen2.5-7B) or 64 blocks on 132 SMs; on fewer
// than a fifth of the SMs (a model with one or two kv heads) they would stream a long cache too
// slowly, so those keep the 16 pages.
int cluster_split_max_pages(const DecodeAttentionPlan& l2_plan, long long cluster_blocks, int num_sms) {
  if (5 * cluster_blocks < num_sms) return kClusterSplitBoundPages;
  const long long merge_bytes = 2LL * l2_plan.splits_per_sequence * (l2_plan.q_heads / l2_plan.kv_heads) * l2_plan.head_dim;
  long long pages = std::max<long long>(kClusterSplitBoundPages, merge_bytes / kMergeBytesPerClusterPage);
  if (l2_plan.batch > 1) pages = std::clamp<long long>(pages, kBatchClusterSplitMinPages, kBatchClusterSplitMaxPages);
  return static_cast<int>(pages);
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

std::optional<DecodeAttentionPlan> plan_short_context_decode_attention(const DecodeAttentionPlan& plan, int num_sms,
                                                                       const ResidentClusters& resident) {
  if (plan.cluster_merge || plan.q_heads / plan.kv_heads > 8) return std::nullopt;
  // A batch's sequences share one sequence's 8 splits per kv head (4 each for 2 sequences, 2 for
  // 3-4, none from 5): the grid keeps the single-sequence plan's block count
  // (docs/kernels/decode_attention.md, "Splits merged in a cluster").
  const long long pairs = static_cast<long long>(plan.batch) * plan.kv_heads;
  int largest = kMaxClusterSplits;
  while (largest > 1 && largest * plan.batch > kMaxClusterSplits) largest /= 2;
  for (int cluster = largest; cluster >= 2; cluster /= 2) {
    if (pairs > resident.of(cluster)) continue;  // a cluster left for a second wave would wait
    const int max_pages = cluster_split_max_pages(plan, pairs * cluster, num_sms);
    const int context = static_cast<int>(std::min<long long>(plan.max_context, 1LL * cluster * max_pages * kKvPageSize));
    DecodeAttentionPlan shorter = plan_decode_attention(plan.batch, plan.q_heads, plan.kv_heads, plan.head_dim,
                                                        context, num_sms, cluster, 8, SplitMerge::cluster);
    if (!shorter.cluster_merge) return std::nullopt;  // a single page: nothing to merge
    return shorter;
  }
  return std::nullopt;
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
  if (!(params.scale > 0.0f) || !std::isfinite(params.scale) || params.sliding_window < 0) return cudaErrorInvalidValue;

  const int group = plan.q_heads / plan.kv_heads;
  const WorkspaceLayout layout = workspace_layout(plan.batch, plan.kv_heads, group, plan.head_dim, plan.splits_per_sequence);
  unsigned char* workspace = static_cast<unsigned char*>(params.workspace);
  KernelArgs args{};
  args.q = params.q;
  args.out = params.out;
  args.k_pages = kv.k_pages;
  args.v_pages = kv.v_pages;
  args.block_table = kv.block_table;
  args.seq_lens = params.seq_lens;
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
