// The persistent batch-1 decode kernel: design in persistent_decode.cuh and
// docs/kernels/persistent_decode.md.
#include "kernels/persistent/persistent_decode.cuh"

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "kernels/attention/paged_kv.cuh"
#include "kernels/common/async_ring.cuh"
#include "kernels/common/l2_policy.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/mlp/silu.cuh"
#include "kernels/persistent/weight_stream.cuh"

namespace deepfuse::kernels {
namespace {

using persistent::consumer_sync;
using persistent::Ring;
using persistent::RingState;
using persistent::warp_sum;
using warp_tiles::warp_max;
using persistent::kConsumers;
using persistent::kConsumerWarps;
using persistent::kIterationElements;
using persistent::kStageBytes;
using persistent::kThreads;

constexpr int kMaxGroup = 8;       // query heads per KV head
constexpr int kMaxHeadDim = 128;
constexpr int kTilePositions = 32;  // keys per warp tile: one per lane
constexpr int kPositionsPerSplit = 256;  // attention splits: at least this many keys each
constexpr int kLogEntries = 96;  // marks per block and log kept in a DEEPFUSE_TRACE build
constexpr int kPageTable = 512;  // page ids of a block's attention item kept in shared memory (8192 keys)

// Counters in the workspace; each only grows during a launch.
enum Counter : int {
  kQkvDone,    // blocks done with the layer's q | k | v rows
  kItemsDone,  // attention items (KV head, split) whose partial output is written
  kODone,      // blocks done with o_proj rows
  kUpDone,     // blocks done with their act slice
  kDownDone,   // blocks done with down rows (the layer's output)
  kExit,       // blocks done with the launch
  kCounterSlots = 64,
};

struct Workspace {
  unsigned* counters;
  float* qkv;                    // [q_size + 2 kv_size], bf16-rounded
  float* partial_o;              // [kv_heads][max_splits][group][head_dim]
  float* partial_ml;             // [kv_heads][max_splits][group][2]: max score, sum of exponentials
  __nv_bfloat16* act;            // [I]
};

__host__ __device__ inline size_t align256(size_t bytes) { return (bytes + 255) & ~size_t{255}; }
__host__ __device__ inline int max_splits(const PersistentDecodeShape& s, int blocks) {
  return blocks / s.kv_heads > 1 ? blocks / s.kv_heads : 1;
}

// Carves the workspace; with base == nullptr, only its size (returned) is meaningful.
__host__ __device__ inline size_t carve_workspace(const PersistentDecodeShape& s, int blocks, void* base,
                                                  Workspace* w) {
  const int group = s.q_heads / s.kv_heads;
  const size_t partials = static_cast<size_t>(s.kv_heads) * max_splits(s, blocks) * group;
  const size_t sizes[] = {kCounterSlots * sizeof(unsigned),
                          static_cast<size_t>(s.q_size() + 2 * s.kv_size()) * sizeof(float),
                          partials * s.head_dim * sizeof(float),
                          partials * 2 * sizeof(float),
                          static_cast<size_t>(s.intermediate) * sizeof(__nv_bfloat16)};
  char* p = static_cast<char*>(base);
  size_t offset = 0;
  void* parts[5];
  for (int i = 0; i < 5; ++i) {
    parts[i] = p ? p + offset : nullptr;
    offset += align256(sizes[i]);
  }
  if (w) *w = {static_cast<unsigned*>(parts[0]), static_cast<float*>(parts[1]), static_cast<float*>(parts[2]),
               static_cast<float*>(parts[3]), static_cast<__nv_bfloat16*>(parts[4])};
  return offset;
}

// Shared memory besides the ring: the staged activation vector, the row sums and the attention's
// per-block state.
struct SharedLayout {
  int stages;
  size_t barriers, ring, x, acc, attention, pages, total;
};
constexpr size_t kAttentionShared =
    sizeof(float) *
    (2 * kMaxGroup * kMaxHeadDim + 2 * kMaxHeadDim + kConsumerWarps * kMaxGroup * 2 + 2 * kMaxGroup + 8 +
     kMaxHeadDim / 2);

__host__ __device__ inline int max_block_rows(int rows, int blocks) { return (rows + blocks - 1) / blocks; }

__host__ __device__ inline SharedLayout shared_layout(const PersistentDecodeShape& s, int blocks, int stages) {
  const int x_elements = max(max(s.hidden, s.q_size()), s.intermediate);
  const int acc_rows = max(max(max_block_rows(s.q_size() + 2 * s.kv_size(), blocks), max_block_rows(s.hidden, blocks)),
                           2 * max_block_rows(s.intermediate, blocks));
  SharedLayout l{};
  l.stages = stages;
  l.barriers = 0;
  l.ring = align256(2 * stages * sizeof(uint64_t));
  l.x = l.ring + static_cast<size_t>(stages) * kStageBytes;
  l.acc = l.x + align256(x_elements * sizeof(__nv_bfloat16));
  l.attention = l.acc + align256(acc_rows * sizeof(float) + 32 * sizeof(float));
  l.pages = l.attention + align256(kAttentionShared);
  l.total = l.pages + align256(kPageTable * sizeof(int32_t));
  return l;
}

// The block's share [begin, end) of `rows` rows.
struct Rows {
  int begin, end;
  __device__ int count() const { return end - begin; }
};
__device__ inline Rows block_rows(int rows) {
  return {split_point(rows, gridDim.x, blockIdx.x), split_point(rows, gridDim.x, blockIdx.x + 1)};
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ unsigned load_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Orders this thread's memory operations (and, cumulatively, what it saw through a block barrier)
// at GPU scope; lighter than __threadfence()'s sequentially consistent fence.
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// The consumer warps' side of a hand-off between blocks: thread 0 polls (relaxed loads), then one
// fence gives the acquire.
__device__ void wait_for(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    while (load_relaxed(counter) < target) {
    }
    fence_acq_rel();
  }
  consumer_sync();
}
// After the block's part is written (by any consumer thread): counts it.
__device__ void signal(unsigned* counter) {
  consumer_sync();
  if (threadIdx.x == 0) {
    fence_acq_rel();
    atomicAdd(counter, 1u);
  }
}

// Sum over the consumer threads; every one gets it.
__device__ float consumer_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  consumer_sync();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kConsumerWarps; ++w) total += scratch[w];
  consumer_sync();
  return total;
}

// x (bf16 [n], global) -> shared; with `normalize`, x * 1/rms(x) (* weight when given), rounded
// to bf16 as the norm's output is.
__device__ void stage_vector(__nv_bfloat16* xs, const __nv_bfloat16* x, int n, bool normalize,
                             const __nv_bfloat16* weight, float eps, float* scratch) {
  float squares = 0.0f;
  constexpr int kLoads = 4;  // 16-byte loads per thread in flight together
  for (int first = threadIdx.x * 8; first < n; first += kLoads * kConsumers * 8) {
    uint4 bits[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = first + u * kConsumers * 8;
      if (i < n) bits[u] = __ldcg(reinterpret_cast<const uint4*>(x + i));
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int i = first + u * kConsumers * 8;
      if (i >= n) continue;
      *reinterpret_cast<uint4*>(xs + i) = bits[u];
      const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits[u]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = __bfloat1622float2(pairs[j]);
        squares += v.x * v.x + v.y * v.y;
      }
    }
  }
  if (!normalize) return;  // the caller syncs before the vector is read
  const float inverse_rms = rsqrtf(consumer_sum(squares, scratch) / n + eps);
  for (int i = threadIdx.x * 2; i < n; i += kConsumers * 2) {
    float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(xs + i));
    v.x *= inverse_rms, v.y *= inverse_rms;
    if (weight) {
      const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(weight + i));
      v.x = bf16_round(v.x) * g.x, v.y = bf16_round(v.y) * g.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(xs + i) = __floats2bfloat162_rn(v.x, v.y);
  }
}

__device__ void zero(float* p, int n) {
  for (int i = threadIdx.x; i < n; i += kConsumers) p[i] = 0.0f;
}

// What the consumer warps work with.
using Log = trace::BlockLog<kLogEntries>;

struct Consumer {
  const PersistentDecodeParams& p;
  Workspace ws;
  Log* log;                 // thread 0's marks (a DEEPFUSE_TRACE build)
  float* scratch;           // 32 floats
  float* attention_shared;  // kAttentionShared bytes
};

// ---- attention -------------------------------------------------------------------------------

// Element d of a head (fp32 at `head`) after RoPE: rotate-half pairs (d, d + head_dim / 2).
__device__ float rotated(const float* head, int d, int head_dim, float position, const float* inv_freq) {
  const int half = head_dim / 2;
  const int i = d % half;
  float s, c;
  sincosf(position * __ldg(inv_freq + i), &s, &c);
  const float x1 = __ldcg(head + i), x2 = __ldcg(head + i + half);
  return d < half ? x1 * c - x2 * s : x2 * c + x1 * s;
}

// A value row's slice for one lane: HD / 32 bf16.
template <int HD>
using ValueBits = std::conditional_t<HD == 128, uint2, unsigned>;

template <int HD>
__device__ __forceinline__ void unpack_values(const ValueBits<HD>& bits, float* v) {
  if constexpr (HD == 128) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  } else {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
    v[0] = a.x, v[1] = a.y;
  }
}
template <int HD>
__device__ __forceinline__ ValueBits<HD> pack_values(const float* v) {
  ValueBits<HD> bits;
  if constexpr (HD == 128) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    bits.x = *reinterpret_cast<const unsigned*>(&a), bits.y = *reinterpret_cast<const unsigned*>(&b);
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]);
    bits = *reinterpret_cast<const unsigned*>(&a);
  }
  return bits;
}

// How one layer's attention is cut: splits per KV head of at least kPositionsPerSplit keys, at
// most one item per block.
struct AttentionSplit {
  int window_start, span, splits;
  __device__ AttentionSplit(const PersistentDecodeParams& p) {
    const int length = *p.seq_len;
    window_start = p.sliding_window > 0 ? max(0, length - p.sliding_window) : 0;
    span = max(length - window_start, 0);
    splits = min(max((span + kPositionsPerSplit - 1) / kPositionsPerSplit, 1), max_splits(p.shape, gridDim.x));
  }
  __device__ int items(const PersistentDecodeShape& s) const { return s.kv_heads * splits; }
  __device__ int begin(int split) const { return window_start + split_point(span, splits, split); }
  __device__ int end(int split) const { return window_start + split_point(span, splits, split + 1); }
};

// The block's attention item (at most one: splits <= blocks / kv_heads): its KV head, split and
// keys [begin, end), and the pages that hold them.
struct AttentionItem {
  bool present;
  int kv_head, split, begin, end, first_page, pages;
  __device__ AttentionItem(const AttentionSplit& cut, const PersistentDecodeShape& s) {
    present = static_cast<int>(blockIdx.x) < cut.items(s);
    kv_head = present ? blockIdx.x / cut.splits : 0;
    split = present ? blockIdx.x % cut.splits : 0;
    begin = present ? cut.begin(split) : 0;
    end = present ? cut.end(split) : 0;
    first_page = begin / kKvPageSize;
    pages = end > begin ? (end - 1) / kKvPageSize - first_page + 1 : 0;
  }
};

// Keys and values ride the weight ring: a stage holds `kv_pages_per_stage` pages of keys in its
// first half and the same pages of values in its second.
__host__ __device__ inline int kv_pages_per_stage(int head_dim) {
  return kStageBytes / 2 / (kKvPageSize * head_dim * static_cast<int>(sizeof(__nv_bfloat16)));
}

// The producer's side: the item's pages of one layer, stage by stage (page ids from the table the
// producer warp filled at launch, or from the block table past its end).
__device__ void produce_item_pages(const persistent::Ring& ring, RingState& at, const PersistentDecodeParams& p,
                                   const PersistentDecodeLayer& layer, const AttentionItem& item,
                                   const int32_t* page_ids, uint64_t policy) {
  const PersistentDecodeShape& s = p.shape;
  const unsigned page_bytes = kKvPageSize * s.head_dim * sizeof(__nv_bfloat16);
  const int per_stage = kv_pages_per_stage(s.head_dim);
  const PagedKv kv{layer.k_pages, layer.v_pages, p.block_table, p.max_pages_per_seq, s.kv_heads, s.head_dim};
  for (int first = 0; first < item.pages; first += per_stage) {
    const int n = min(per_stage, item.pages - first);
    persistent::barrier_wait(&ring.empty[at.stage], at.phase ^ 1);
    persistent::barrier_expect_bytes(&ring.full[at.stage], 2 * n * page_bytes);
    char* stage = ring.stages + static_cast<size_t>(at.stage) * kStageBytes;
    for (int i = 0; i < n; ++i) {
      const int index = first + i;
      const int32_t page =
          index < kPageTable ? page_ids[index] : __ldg(p.block_table + item.first_page + index);
      const size_t offset = kv.page_offset(page, item.kv_head);
      persistent::bulk_copy(stage + i * page_bytes, layer.k_pages + offset, page_bytes, &ring.full[at.stage], policy);
      persistent::bulk_copy(stage + kStageBytes / 2 + i * page_bytes, layer.v_pages + offset, page_bytes,
                            &ring.full[at.stage], policy);
    }
    at.advance(ring.count);
  }
}

// One (KV head, context split) item: keys [begin, end) for the head's group of query heads, its
// pages arriving through the ring (kv_pages_per_stage per stage). The new token's key and value
// (at `position`) come from the qkv scratch, rotated here; split 0 appends them to the cache.
// Each warp takes tiles of 32 keys of a stage, one per lane: scores, online softmax, then the
// value rows weighted by the lanes' probabilities. The block's warps meet in shared memory and
// leave the item's partial output for o_proj's staging to merge.
template <int HD, int GROUP>
__device__ void attention_item(const Consumer& c, const Ring& ring, RingState& at, const PersistentDecodeLayer& layer,
                               const AttentionItem& item, int position, const unsigned* qkv_done,
                               unsigned qkv_target) {
  constexpr int kDims = HD / 32;  // value dims per lane
  constexpr int kChunks = HD / 8;  // 16-byte chunks per key row
  constexpr int kRowBytes = HD * 2;
  constexpr int kPageBytes = kKvPageSize * kRowBytes;
  const PersistentDecodeParams& p = c.p;
  const PersistentDecodeShape& s = p.shape;
  constexpr int group = GROUP;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_head = item.kv_head, begin = item.begin, end = item.end;
  float* q = c.attention_shared;                 // [kMaxGroup][HD] rotated, bf16-rounded
  float* out = q + kMaxGroup * kMaxHeadDim;      // [kMaxGroup][HD] the block's weighted values
  float* k_new = out + kMaxGroup * kMaxHeadDim;  // [HD]
  float* v_new = k_new + kMaxHeadDim;            // [HD]
  float* warp_stats = v_new + kMaxHeadDim;       // [warps][kMaxGroup][2]: max score, sum of exponentials
  float* totals = warp_stats + kConsumerWarps * kMaxGroup * 2;  // [kMaxGroup][2] the block's
  // The new key as a bf16 row (16-byte aligned), read in place of the cache's row at `position`.
  auto* k_new_row = reinterpret_cast<__nv_bfloat16*>(totals + kMaxGroup * 2 + 8);
  const float pos = static_cast<float>(position);
  const PagedKv kv{layer.k_pages, layer.v_pages, p.block_table, p.max_pages_per_seq, s.kv_heads, HD};

  wait_for(qkv_done, qkv_target);  // also: the previous item's readers of the shared memory are done
  if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::upstream);
  for (int i = threadIdx.x; i < (group + 2) * HD; i += kConsumers) {
    const int j = i / HD, d = i % HD;
    if (j < group) {
      q[i] = bf16_round(rotated(c.ws.qkv + (kv_head * group + j) * HD, d, HD, pos, p.inv_freq));
      out[i] = 0.0f;
    } else if (j == group) {
      k_new[d] = bf16_round(rotated(c.ws.qkv + s.q_size() + kv_head * HD, d, HD, pos, p.inv_freq));
      k_new_row[d] = __float2bfloat16_rn(k_new[d]);
    } else {
      v_new[d] = __ldcg(c.ws.qkv + s.q_size() + s.kv_size() + kv_head * HD + d);
    }
  }
  consumer_sync();
  if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::phase);
  if (item.split == 0)
    for (int d = threadIdx.x; d < HD; d += kConsumers) {
      const size_t at_token = kv.token_offset(0, position, kv_head) + d;
      layer.k_pages[at_token] = __float2bfloat16_rn(k_new[d]);
      layer.v_pages[at_token] = __float2bfloat16_rn(v_new[d]);
    }

  float m[GROUP], l[GROUP], o[GROUP][kDims];
#pragma unroll
  for (int j = 0; j < GROUP; ++j) {
    m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDims; ++e) o[j][e] = 0.0f;
  }
  const int per_stage = kv_pages_per_stage(HD);
  int tiles_before = 0;  // tiles of the earlier stages: tile t goes to warp t % warps
  for (int first = 0; first < item.pages; first += per_stage) {
    const int stage_key = (item.first_page + first) * kKvPageSize;  // the stage's first key
    const int key_begin = max(begin, stage_key);
    const int key_end = min(end, stage_key + min(per_stage, item.pages - first) * kKvPageSize);
    const int tiles = (key_end - key_begin + kTilePositions - 1) / kTilePositions;
    persistent::barrier_wait(&ring.full[at.stage], at.phase);
    if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::start);
    const char* keys = ring.stages + static_cast<size_t>(at.stage) * kStageBytes;
    const char* values = keys + kStageBytes / 2;
    for (int t = (warp - tiles_before % kConsumerWarps + kConsumerWarps) % kConsumerWarps; t < tiles;
         t += kConsumerWarps) {
      const int tile = key_begin + t * kTilePositions;
      const int key = tile + lane;
      const bool valid = key < key_end;
      const int row = min(key, key_end - 1) - stage_key;  // lanes past the end repeat the last key
      float score[GROUP];
#pragma unroll
      for (int j = 0; j < GROUP; ++j) score[j] = 0.0f;
      // Each lane starts at a different 16-byte chunk of its row: rows are kRowBytes apart, so the
      // same chunk of 8 rows would share banks. The lane at `position` reads the new key instead
      // (no divergent path).
      const char* key_row = key == position
                                ? reinterpret_cast<const char*>(k_new_row)
                                : keys + (row / kKvPageSize) * kPageBytes + (row % kKvPageSize) * kRowBytes;
#pragma unroll 4
      for (int c0 = 0; c0 < kChunks; ++c0) {
        const int chunk = (c0 + lane) % kChunks;
        const uint4 bits = *reinterpret_cast<const uint4*>(key_row + chunk * 16);
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 k = __bfloat1622float2(pairs[e]);
#pragma unroll
          for (int j = 0; j < GROUP; ++j) {
            score[j] = fmaf(q[j * HD + chunk * 8 + 2 * e], k.x, score[j]);
            score[j] = fmaf(q[j * HD + chunk * 8 + 2 * e + 1], k.y, score[j]);
          }
        }
      }
      // Online softmax per query head; score[j] becomes the lane's weight.
#pragma unroll
      for (int j = 0; j < GROUP; ++j) {
        const float scaled = score[j] * p.attention_scale;
        const float m_new = fmaxf(m[j], warp_max(valid ? scaled : -INFINITY));
        const float alpha = m[j] == -INFINITY ? 0.0f : __expf(m[j] - m_new);
        score[j] = valid ? __expf(scaled - m_new) : 0.0f;
        l[j] = l[j] * alpha + warp_sum(score[j]);
#pragma unroll
        for (int e = 0; e < kDims; ++e) o[j][e] *= alpha;
        m[j] = m_new;
      }
      if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::start);
      // Value rows: the lane holds dims [lane * kDims, +kDims) of every row.
      const int count = min(kTilePositions, key_end - tile);
      for (int t2 = 0; t2 < count; ++t2) {
        const int r = tile + t2 - stage_key;
        ValueBits<HD> bits = *reinterpret_cast<const ValueBits<HD>*>(
            values + (r / kKvPageSize) * kPageBytes + (r % kKvPageSize) * kRowBytes + lane * kDims * 2);
        if (tile + t2 == position) bits = pack_values<HD>(v_new + lane * kDims);
        float v[kDims];
        unpack_values<HD>(bits, v);
#pragma unroll
        for (int j = 0; j < GROUP; ++j) {
          const float weight = __shfl_sync(0xffffffffu, score[j], t2);
#pragma unroll
          for (int e = 0; e < kDims; ++e) o[j][e] = fmaf(weight, v[e], o[j][e]);
        }
      }
    }
    tiles_before += tiles;
    __syncwarp();
    if (lane == 0) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      persistent::barrier_arrive(&ring.empty[at.stage]);
    }
    at.advance(ring.count);
  }

  if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::barrier);
  // The block's warps meet: rescale each to the block's max, add up in shared memory.
  if (lane == 0)
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
        warp_stats[(warp * kMaxGroup + j) * 2] = m[j];
        warp_stats[(warp * kMaxGroup + j) * 2 + 1] = l[j];
      }
  consumer_sync();
#pragma unroll
  for (int j = 0; j < GROUP; ++j) {
      float block_max = -INFINITY;
      for (int w = 0; w < kConsumerWarps; ++w) block_max = fmaxf(block_max, warp_stats[(w * kMaxGroup + j) * 2]);
      const float rescale = m[j] == -INFINITY ? 0.0f : __expf(m[j] - block_max);
      if (rescale != 0.0f)
#pragma unroll
        for (int e = 0; e < kDims; ++e) atomicAdd(&out[j * HD + lane * kDims + e], o[j][e] * rescale);
      if (warp == 0 && lane == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kConsumerWarps; ++w) {
          const float mw = warp_stats[(w * kMaxGroup + j) * 2];
          if (mw != -INFINITY) sum += warp_stats[(w * kMaxGroup + j) * 2 + 1] * __expf(mw - block_max);
        }
        totals[j * 2] = block_max, totals[j * 2 + 1] = sum;
      }
    }
  consumer_sync();

  // The item's partial output and its (max, sum); o_proj's staging merges the splits.
  const size_t first_partial = (static_cast<size_t>(kv_head) * max_splits(s, gridDim.x) + item.split) * group;
  for (int i = threadIdx.x; i < group * HD; i += kConsumers) c.ws.partial_o[first_partial * HD + i] = out[i];
  for (int i = threadIdx.x; i < group * 2; i += kConsumers) c.ws.partial_ml[first_partial * 2 + i] = totals[i];
  if (threadIdx.x == 0) c.log->stamp(trace::Kernel::persistent_attention, trace::Mark::finish);
  signal(&c.ws.counters[kItemsDone]);
}

// Calls f(integral_constant head_dim, integral_constant group) for the shape's head_dim (64,
// 128) and query heads per KV head (1..8): the attention's loops unroll over exactly the group,
// which keeps its code, run cold once per layer, short.
template <typename F>
__device__ void dispatch_head_shape(const PersistentDecodeShape& s, F f) {
  const int group = s.q_heads / s.kv_heads;
  auto by_group = [&](auto hd) {
    switch (group) {
      case 1: return f(hd, std::integral_constant<int, 1>{});
      case 2: return f(hd, std::integral_constant<int, 2>{});
      case 3: return f(hd, std::integral_constant<int, 3>{});
      case 4: return f(hd, std::integral_constant<int, 4>{});
      case 5: return f(hd, std::integral_constant<int, 5>{});
      case 6: return f(hd, std::integral_constant<int, 6>{});
      case 7: return f(hd, std::integral_constant<int, 7>{});
      default: return f(hd, std::integral_constant<int, 8>{});
    }
  };
  if (s.head_dim == 128)
    by_group(std::integral_constant<int, 128>{});
  else
    by_group(std::integral_constant<int, 64>{});
}

// The block's attention item of one layer, if it has one; it waits for the q | k | v hand-off
// itself (blocks without an item do not wait for it at all).
__device__ void attention(const Consumer& c, const Ring& ring, RingState& at, const PersistentDecodeLayer& layer,
                          const AttentionItem& item, const unsigned* qkv_done, unsigned qkv_target) {
  if (!item.present) return;
  const int position = *c.p.position;
  dispatch_head_shape(c.p.shape, [&](auto hd, auto group) {
    attention_item<decltype(hd)::value, decltype(group)::value>(c, ring, at, layer, item, position, qkv_done,
                                                                qkv_target);
  });
}

// o_proj's input: the attention output of every query head, merged from the items' partials
// (each block merges all of them itself: no extra hand-off), rounded to bf16 into shared memory.
__device__ void stage_attention_output(const Consumer& c, const AttentionSplit& cut, __nv_bfloat16* xs) {
  const PersistentDecodeShape& s = c.p.shape;
  const int group = s.q_heads / s.kv_heads, room = max_splits(s, gridDim.x);
  constexpr int kElements = 8;  // per thread and pass: their loads go out together
  constexpr int kSplitBatch = 1;  // splits whose loads go out together
  auto partial = [&](int i, int sp) {
    const int h = i / s.head_dim, d = i % s.head_dim;
    return c.ws.partial_o + ((static_cast<size_t>(h / group) * room + sp) * group + h % group) * s.head_dim + d;
  };
  float* weights = c.attention_shared;  // [q_heads][splits]: e^(m - M) / L per split
  for (int h = threadIdx.x; h < s.q_heads; h += kConsumers) {
    const int kv_head = h / group, j = h % group;
    const float* ml = c.ws.partial_ml + (static_cast<size_t>(kv_head) * room * group + j) * 2;
    float head_max = -INFINITY;
    for (int sp = 0; sp < cut.splits; ++sp) head_max = fmaxf(head_max, __ldcg(ml + sp * group * 2));
    float total = 0.0f;
    for (int sp = 0; sp < cut.splits; ++sp) {
      const float m = __ldcg(ml + sp * group * 2);
      const float w = m == -INFINITY ? 0.0f : __expf(m - head_max);
      weights[h * cut.splits + sp] = w;
      total += w * __ldcg(ml + sp * group * 2 + 1);
    }
    for (int sp = 0; sp < cut.splits; ++sp) weights[h * cut.splits + sp] *= total > 0.0f ? 1.0f / total : 0.0f;
  }
  consumer_sync();
  for (int first = threadIdx.x; first < s.q_size(); first += kElements * kConsumers) {
    float sum[kElements] = {};
    for (int sp0 = 0; sp0 < cut.splits; sp0 += kSplitBatch) {
      float part[kElements][kSplitBatch];
#pragma unroll
      for (int u = 0; u < kElements; ++u)
#pragma unroll
        for (int sp = 0; sp < kSplitBatch; ++sp)
          part[u][sp] = sp0 + sp < cut.splits ? __ldcg(partial(min(first + u * kConsumers, s.q_size() - 1), sp0 + sp))
                                              : 0.0f;
#pragma unroll
      for (int u = 0; u < kElements; ++u) {
        const int h = min(first + u * kConsumers, s.q_size() - 1) / s.head_dim;
#pragma unroll
        for (int sp = 0; sp < kSplitBatch; ++sp)
          if (sp0 + sp < cut.splits) sum[u] = fmaf(weights[h * cut.splits + sp0 + sp], part[u][sp], sum[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kElements; ++u)
      if (first + u * kConsumers < s.q_size()) xs[first + u * kConsumers] = __float2bfloat16_rn(sum[u]);
  }
}

// ---- the kernel ------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads, 1) persistent_decode_kernel(const PersistentDecodeParams p, int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char shared[];
  const PersistentDecodeShape& s = p.shape;
  const SharedLayout layout = shared_layout(s, gridDim.x, stages);
  Ring ring{shared + layout.ring, reinterpret_cast<uint64_t*>(shared + layout.barriers),
            reinterpret_cast<uint64_t*>(shared + layout.barriers) + stages, stages};
  __shared__ Log consumer_log, producer_log;
  if (threadIdx.x == 0) ring.init(), consumer_log.init(), producer_log.init();
  __syncthreads();

  const Rows qkv_rows = block_rows(s.q_size() + 2 * s.kv_size());
  const Rows hidden_rows = block_rows(s.hidden);
  const Rows act_rows = block_rows(s.intermediate);

  const AttentionSplit cut(p);  // the sequence's length is fixed for the launch
  const AttentionItem item(cut, s);

  if (threadIdx.x >= kConsumers) {  // the producer warp: one thread streams every slab in order
    // The item's page ids, once for every layer (they share the block table).
    auto* page_ids = reinterpret_cast<int32_t*>(shared + layout.pages);
    for (int i = threadIdx.x - kConsumers; i < min(item.pages, kPageTable); i += 32)
      page_ids[i] = __ldg(p.block_table + item.first_page + i);
    __syncwarp();
    if (threadIdx.x == kConsumers) {
      const uint64_t policy = evict_first_policy();
      RingState at;
      for (int l = 0; l < s.layers; ++l) {
        const PersistentDecodeLayer& w = p.layers[l];
        persistent::produce_slab(ring, at, w.qkv, qkv_rows.begin, qkv_rows.count(), s.hidden, policy);
        produce_item_pages(ring, at, p, w, item, page_ids, policy);
        persistent::produce_slab(ring, at, w.o_proj, hidden_rows.begin, hidden_rows.count(), s.q_size(), policy);
        persistent::produce_slab(ring, at, w.gate_up, act_rows.begin, act_rows.count(), s.hidden, policy);
        persistent::produce_slab(ring, at, w.gate_up, s.intermediate + act_rows.begin, act_rows.count(), s.hidden,
                                 policy);
        persistent::produce_slab(ring, at, w.down, hidden_rows.begin, hidden_rows.count(), s.intermediate, policy);
        producer_log.stamp(trace::Kernel::persistent_producer, trace::Mark::end);
      }
      producer_log.flush();
    }
    return;
  }

  Workspace ws;
  carve_workspace(s, gridDim.x, p.workspace, &ws);
  auto* xs = reinterpret_cast<__nv_bfloat16*>(shared + layout.x);
  auto* acc = reinterpret_cast<float*>(shared + layout.acc);
  auto* scratch = acc + (layout.attention - layout.acc) / sizeof(float) - 32;
  const Consumer c{p, ws, &consumer_log, scratch, reinterpret_cast<float*>(shared + layout.attention)};
  unsigned* counters = ws.counters;
  const __nv_bfloat16* embedding = p.embed_tokens + static_cast<size_t>(*p.id) * s.hidden;
  const unsigned blocks = gridDim.x;
  RingState at;
  unsigned items_done = 0;  // attention items of the layers so far
  if (threadIdx.x == 0) consumer_log.stamp(trace::Kernel::persistent_qkv, trace::Mark::start);

  // One matrix operation of the block: wait for its input (no counter: none), stage it, run the
  // block's `slabs` slabs of `rows` rows (each into its own `rows` sums), finish each row, count
  // the block's part done.
  auto matrix_operation = [&](trace::Kernel kind, const unsigned* input_ready, unsigned target, auto stage,
                              int slabs, int rows, int k, auto finish_row, unsigned* done) {
    if (input_ready) wait_for(input_ready, target);
    if (threadIdx.x == 0) consumer_log.stamp(kind, trace::Mark::upstream);
    stage();
    zero(acc, slabs * rows);
    consumer_sync();
    for (int slab = 0; slab < slabs; ++slab) persistent::consume_slab(ring, at, rows, k, xs, acc + slab * rows);
    consumer_sync();
    if (threadIdx.x == 0) consumer_log.stamp(kind, trace::Mark::phase);
    for (int r = threadIdx.x; r < rows; r += kConsumers) finish_row(r);
    signal(done);
  };

  for (int l = 0; l < s.layers; ++l) {
    const PersistentDecodeLayer& w = p.layers[l];
    const unsigned layer_done = (l + 1) * blocks;
    // q | k | v rows of rmsnorm(residual stream)
    matrix_operation(
        trace::Kernel::persistent_qkv, l > 0 ? &counters[kDownDone] : nullptr, l * blocks,
        [&] { stage_vector(xs, l == 0 ? embedding : p.residual, s.hidden, true, w.input_norm, p.norm_eps, scratch); },
        1, qkv_rows.count(), s.hidden,
        [&](int r) {
          const float bias = w.qkv_bias ? __bfloat162float(w.qkv_bias[qkv_rows.begin + r]) : 0.0f;
          ws.qkv[qkv_rows.begin + r] = bf16_round(acc[r] + bias);
        },
        &counters[kQkvDone]);

    attention(c, ring, at, w, item, &counters[kQkvDone], layer_done);
    items_done += cut.items(s);
    if (threadIdx.x == 0) consumer_log.stamp(trace::Kernel::persistent_attention, trace::Mark::end);

    // o_proj + o_bias, added to the residual stream (layer 0: to the embedding)
    matrix_operation(
        trace::Kernel::persistent_o_proj, &counters[kItemsDone], items_done,
        [&] { stage_attention_output(c, cut, xs); },
        1, hidden_rows.count(), s.q_size(),
        [&](int r) {
          const int h = hidden_rows.begin + r;
          const float base = __bfloat162float(l == 0 ? embedding[h] : p.residual[h]);
          const float bias = w.o_bias ? __bfloat162float(w.o_bias[h]) : 0.0f;
          p.residual[h] = __float2bfloat16_rn(acc[r] + bias + base);
        },
        &counters[kODone]);

    // gate and up rows of the block's slice of I (two slabs) -> act
    matrix_operation(
        trace::Kernel::persistent_gate_up, &counters[kODone], layer_done,
        [&] { stage_vector(xs, p.residual, s.hidden, true, w.post_norm, p.norm_eps, scratch); }, 2, act_rows.count(),
        s.hidden,
        [&](int r) {
          const float gate = bf16_round(acc[r]), up = bf16_round(acc[act_rows.count() + r]);
          ws.act[act_rows.begin + r] = __float2bfloat16_rn(silu(gate) * up);
        },
        &counters[kUpDone]);

    // down rows, added to the residual stream
    matrix_operation(
        trace::Kernel::persistent_down, &counters[kUpDone], layer_done,
        [&] { stage_vector(xs, ws.act, s.intermediate, false, nullptr, 0.0f, scratch); }, 1, hidden_rows.count(),
        s.intermediate,
        [&](int r) {
          const int h = hidden_rows.begin + r;
          p.residual[h] = __float2bfloat16_rn(acc[r] + __bfloat162float(p.residual[h]));
        },
        &counters[kDownDone]);
  }

  if (threadIdx.x == 0) consumer_log.flush();
  // The last block out zeroes the counters for the next launch.
  if (threadIdx.x == 0 && atomicAdd(&counters[kExit], 1u) == blocks - 1)
    for (int i = 0; i < kCounterSlots; ++i) counters[i] = 0;
#else
  __trap();  // sm_90 only; the launcher refuses older devices
#endif
}

constexpr int kMaxStages = 12;

struct DeviceFacts {
  int sms = 0, major = 0, shared_optin = 0;
};
DeviceFacts device_facts(int device) {
  DeviceFacts f;
  cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&f.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaFuncAttributes kernel{};  // its static shared memory (the trace logs) comes off the top
  if (f.major >= 9 && cudaFuncGetAttributes(&kernel, persistent_decode_kernel) == cudaSuccess)
    f.shared_optin -= static_cast<int>(kernel.sharedSizeBytes);
  return f;
}

bool shape_ok(const PersistentDecodeShape& s) {
  const auto multiple = [](int v) { return v > 0 && v % kIterationElements == 0; };
  return s.layers >= 1 && multiple(s.hidden) && multiple(s.intermediate) && multiple(s.q_size()) &&
         (s.head_dim == 64 || s.head_dim == 128) && s.kv_heads >= 1 && s.q_heads % s.kv_heads == 0 &&
         s.q_heads / s.kv_heads <= kMaxGroup && s.vocab >= 1;
}

// Stages that fit beside the rest of the shared memory (0: not even two).
int stages_that_fit(const PersistentDecodeShape& s, const DeviceFacts& f) {
  int stages = kMaxStages;
  while (stages >= 2 && shared_layout(s, f.sms, stages).total > static_cast<size_t>(f.shared_optin)) --stages;
  return stages >= 2 ? stages : 0;
}

}  // namespace

bool persistent_decode_supported(const PersistentDecodeShape& shape, int device) {
  const DeviceFacts f = device_facts(device);
  return f.major >= 9 && shape_ok(shape) && stages_that_fit(shape, f) >= 4;
}

size_t persistent_decode_workspace_bytes(const PersistentDecodeShape& shape, int num_sms) {
  return carve_workspace(shape, num_sms, nullptr, nullptr);
}

cudaError_t launch_persistent_decode(const PersistentDecodeParams& p, cudaStream_t stream) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const DeviceFacts f = device_facts(device);
  if (f.major < 9) return cudaErrorNotSupported;
  if (!shape_ok(p.shape) || !p.layers || !p.embed_tokens || !p.inv_freq || !p.id || !p.position || !p.seq_len ||
      !p.block_table || !p.residual || !p.workspace || p.max_pages_per_seq < 1)
    return cudaErrorInvalidValue;
  const int stages = stages_that_fit(p.shape, f);
  if (stages == 0) return cudaErrorInvalidValue;
  const size_t shared_bytes = shared_layout(p.shape, f.sms, stages).total;
  trace::attach_unit();
  if (cudaError_t e = cudaFuncSetAttribute(persistent_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(shared_bytes));
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(f.sms);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;  // every block resident at once: they wait for each other
  config.attrs = &cooperative;
  config.numAttrs = 1;
  if (cudaError_t e = cudaLaunchKernelEx(&config, persistent_decode_kernel, p, stages); e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
