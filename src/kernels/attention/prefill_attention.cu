// Causal prefill attention over the paged KV cache, FlashAttention-2 style on tensor cores.
// Design notes and expected speed: docs/kernels/prefill_attention.md.
//
// What it computes. Query row i of the chunk (position q_start + i) of head h attends to the keys
// at positions 0 .. q_start + i (only the last `sliding_window` of them when the window is set)
// of kv head h / (q_heads / kv_heads): out = softmax(q·Kᵀ · scale) · V, per row.
//
// The two numbers. With P visible (query, key) pairs per head, FLOPs = 4 · head_dim · q_heads · P
// (q·k and p·v, 2 each per dimension); a 4096-token prompt of Llama-3-8B (32 heads of 128) has
// P = 8.4 M, 137 GFLOP per layer. Bytes: HBM sees the sequence's K/V about once (every CTA of a
// GQA group and query tile reads the same pages, from L2). Each CTA streams its keys from L2:
// 2 · head_dim · 2 bytes per key for 4 · 64 · head_dim FLOPs, 64 FLOP per byte, ~3 TB/s of L2
// reads at 200 TFLOP/s. The limits are the tensor cores and the shared memory feeding them, then L2.
//
// Work split. One CTA of 4 warps per (64-row query tile, query head); each warp owns 16 query rows
// (one m16 tile) and keeps its Q fragments, its output accumulator and its softmax state in
// registers for the whole run. The grid's x is the query head, so the CTAs of one GQA group for
// one query tile are launched back to back and read the same K/V pages while they sit in L2; a CTA
// per (tile, kv head) covering the whole group would read K/V from L2 once instead of `group`
// times, but needs `group` times the registers or query tiles of 64/group tokens (group 7 divides
// nothing); per-head CTAs keep the kernel simple and give short prompts more CTAs. Query tiles are
// launched latest first: they see the most keys, and the short early tiles fill the grid's tail.
//
// The key loop. Keys come in tiles of 64 (4 pages of 16, gathered through the block table) with
// 16-byte cp.async copies into shared memory, double buffered: tile j+1 is in flight while tile j
// is multiplied. Rows are padded by 16 bytes so the 8 row addresses of one ldmatrix fall in 8
// different bank quads. Per tile and warp: S = Q·Kᵀ (16x64, mma.m16n8k16, K fragments by
// ldmatrix), online softmax in fp32 with exp2 and a log2(e)-prescaled scale, then O += P·V with P
// re-packed from the S accumulators as the A operand (no trip through shared memory) and V
// fragments by ldmatrix.trans. Tiles no row of the CTA can see are never loaded; a warp skips
// tiles none of its rows can see; only tiles that cut a warp's causal diagonal or window edge pay
// for the mask. Keys at or past the sequence's end are zero-filled, never read from the page.
#include "deepfuse/kernels/prefill_attention.hpp"

#include <climits>
#include <cmath>

#include "core/per_device.hpp"
#include "kernels/common/warp_tiles.cuh"
#include "kernels/common/log2e.cuh"
#include "kernels/common/pointer_checks.hpp"
#include "kernels/common/fragment.cuh"

namespace deepfuse::kernels {
namespace {

using namespace warp_tiles;  // cp.async, ldmatrix and bf16 packing wrappers

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;                     // one mma m16 tile of query rows
constexpr int kQueryTile = kWarps * kRowsPerWarp;    // 64 query rows per CTA
constexpr int kKeyTile = 64;                         // keys per K/V tile
constexpr int kMaxQueryTiles = 65535;                // gridDim.y limit
static_assert(kKeyTile % kKvPageSize == 0, "a key tile is whole pages");

template <int HeadDim>
struct PrefillTile {
  static_assert(HeadDim == 64 || HeadDim == 128, "head_dim 64 or 128");
  static constexpr int kChunksPerRow = HeadDim / 8;  // 16-byte chunks of bf16
  // +8 bf16 (16 bytes) per row: consecutive rows start 4 banks apart, so the 8 rows one ldmatrix
  // phase reads cover all 32 banks.
  static constexpr int kRowStride = HeadDim + 8;
  static constexpr int kTileElements = 64 * kRowStride;
  static constexpr int kChunksPerThread = 64 * kChunksPerRow / kThreads;
  // Q, then K and V double buffered.
  static constexpr size_t kSharedBytes = size_t{5} * kTileElements * sizeof(__nv_bfloat16);
  // Per thread: head_dim/2 floats of O, 32 of S, head_dim/4 words of Q fragments. ptxas (sm_90a)
  // gives 248 registers at 128 (2 CTAs fit) and 165 at 64 (3 CTAs; asking for 4 spills).
  static constexpr int kMinBlocksPerSm = HeadDim == 128 ? 2 : 3;
};
static_assert(kQueryTile == 64 && kKeyTile == 64, "PrefillTile assumes 64-row tiles");

// ---- Tile loads: every thread copies kChunksPerThread 16-byte chunks; consecutive threads take
// consecutive chunks of a row, so each warp reads whole 128-byte lines.

template <int HeadDim>
__device__ __forceinline__ void load_query_tile(const PrefillAttentionParams& p, int first_row, int head,
                                                __nv_bfloat16* q_tile) {
  using Tile = PrefillTile<HeadDim>;
#pragma unroll
  for (int i = 0; i < Tile::kChunksPerThread; ++i) {
    const int chunk = threadIdx.x + i * kThreads;
    const int row = chunk / Tile::kChunksPerRow;
    const int column = chunk % Tile::kChunksPerRow * 8;
    const int q_row = first_row + row;
    const bool inside = q_row < p.q_len;  // rows past the chunk are zeros, never written back
    const size_t offset = inside ? (static_cast<size_t>(q_row) * p.q_heads + head) * HeadDim + column : 0;
    copy16_async(shared_address(q_tile + row * Tile::kRowStride + column), p.q + offset, inside);
  }
}

// Keys first_key .. first_key + 63: 4 pages named by the block table row of the sequence.
template <int HeadDim>
__device__ __forceinline__ void load_key_value_tile(const PrefillAttentionParams& p, const int32_t* table_row,
                                                    int kv_head, int kv_len, int first_key,
                                                    __nv_bfloat16* k_tile, __nv_bfloat16* v_tile) {
  using Tile = PrefillTile<HeadDim>;
#pragma unroll
  for (int i = 0; i < Tile::kChunksPerThread; ++i) {
    const int chunk = threadIdx.x + i * kThreads;
    const int row = chunk / Tile::kChunksPerRow;
    const int column = chunk % Tile::kChunksPerRow * 8;
    const int key = first_key + row;
    // Past the sequence the page may hold stale data (even NaN bits) or not exist: zero-fill.
    const bool inside = key < kv_len;
    size_t offset = 0;
    if (inside) {
      const int32_t page = __ldg(table_row + key / kKvPageSize);
      offset = p.kv.page_offset(page, kv_head) + static_cast<size_t>(key % kKvPageSize) * HeadDim + column;
    }
    const int slot = row * Tile::kRowStride + column;
    copy16_async(shared_address(k_tile + slot), p.kv.k_pages + offset, inside);
    copy16_async(shared_address(v_tile + slot), p.kv.v_pages + offset, inside);
  }
}

// ---- Per-warp math on one 64-key tile. Fragment coordinates: lane = 4·g + t; an m16n8 C tile
// holds rows g (c[0], c[1]) and g + 8 (c[2], c[3]) at columns 2t, 2t + 1.

// scores[j] = Q (16 x head_dim) · K[keys 8j .. 8j+7]ᵀ.
template <int HeadDim>
__device__ __forceinline__ void multiply_query_key(float (&scores)[kKeyTile / 8][4],
                                                   const uint4 (&q_fragments)[HeadDim / 16],
                                                   const __nv_bfloat16* k_tile, int lane) {
  using Tile = PrefillTile<HeadDim>;
#pragma unroll
  for (int j = 0; j < kKeyTile / 8; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) scores[j][c] = 0.0f;
  // One ldmatrix.x4 covers 8 keys x 32 dimensions: the B operands of two k-steps.
#pragma unroll
  for (int k_pair = 0; k_pair < HeadDim / 32; ++k_pair) {
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
      const uint4 b =
          load_matrix_x4(shared_address(k_tile + (8 * j + (lane & 7)) * Tile::kRowStride + 32 * k_pair + (lane >> 3) * 8));
      mma_bf16_m16n8k16(scores[j], q_fragments[2 * k_pair], b.x, b.y);
      mma_bf16_m16n8k16(scores[j], q_fragments[2 * k_pair + 1], b.z, b.w);
    }
  }
}

// The online softmax step for one tile: scales the scores into the log2 domain, masks, raises the
// running maxima, rescales what was accumulated under the old maxima, and turns the scores into
// unnormalised probabilities. Row sums stay per thread (a quarter of each row) until the end.
template <int HeadDim>
__device__ __forceinline__ void online_softmax(float (&scores)[kKeyTile / 8][4], float (&output)[HeadDim / 8][4],
                                               float (&row_max)[2], float (&row_sum)[2], float scale_log2,
                                               bool needs_mask, int first_key, const int (&row_position)[2],
                                               int window, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // half 0: row g, half 1: row g + 8
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& score = scores[j][2 * half + e];
        score *= scale_log2;
        if (needs_mask) {
          const int key = first_key + 8 * j + 2 * t + e;
          const int position = row_position[half];
          if (key > position || (window > 0 && key <= position - window)) score = -INFINITY;
        }
        tile_max = fmaxf(tile_max, score);
      }
    }
    // The 4 lanes of a quad share the row.
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float new_max = fmaxf(row_max[half], tile_max);
    // A row that has seen only masked keys keeps max -inf; subtracting 0 instead keeps
    // exp2(-inf - max) at 0 rather than NaN.
    const float usable_max = new_max == -INFINITY ? 0.0f : new_max;
    const float correction = exp2f(row_max[half] - usable_max);
    row_max[half] = new_max;
    row_sum[half] *= correction;
#pragma unroll
    for (int n = 0; n < HeadDim / 8; ++n) {
      output[n][2 * half] *= correction;
      output[n][2 * half + 1] *= correction;
    }
#pragma unroll
    for (int j = 0; j < kKeyTile / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& score = scores[j][2 * half + e];
        score = exp2f(score - usable_max);
        row_sum[half] += score;
      }
    }
  }
}

// output += P (16 x 64) · V (64 x head_dim). The C fragments of S tiles 2s and 2s+1 are exactly
// the A fragment of key step s once packed to bf16.
template <int HeadDim>
__device__ __forceinline__ void multiply_probability_value(const float (&probabilities)[kKeyTile / 8][4],
                                                           float (&output)[HeadDim / 8][4],
                                                           const __nv_bfloat16* v_tile, int lane) {
  using Tile = PrefillTile<HeadDim>;
#pragma unroll
  for (int step = 0; step < kKeyTile / 16; ++step) {
    const float(&left)[4] = probabilities[2 * step];
    const float(&right)[4] = probabilities[2 * step + 1];
    const uint4 a = {pack_bf16x2(left[0], left[1]), pack_bf16x2(left[2], left[3]), pack_bf16x2(right[0], right[1]),
                     pack_bf16x2(right[2], right[3])};
    // One transposed ldmatrix.x4 covers 16 keys x 16 dimensions: the B operands of two n-tiles.
#pragma unroll
    for (int n_pair = 0; n_pair < HeadDim / 16; ++n_pair) {
      const uint4 b = load_matrix_x4_transposed(
          shared_address(v_tile + (16 * step + (lane & 15)) * Tile::kRowStride + 16 * n_pair + (lane >> 4) * 8));
      mma_bf16_m16n8k16(output[2 * n_pair], a, b.x, b.y);
      mma_bf16_m16n8k16(output[2 * n_pair + 1], a, b.z, b.w);
    }
  }
}

// Normalises the warp's 16 rows, stages them as bf16 in the warp's own rows of the Q tile (read
// only by this warp, long done) and writes them out with 16-byte stores.
template <int HeadDim>
__device__ __forceinline__ void store_output(const PrefillAttentionParams& p, float (&output)[HeadDim / 8][4],
                                             float (&row_sum)[2], __nv_bfloat16* warp_rows, int first_row,
                                             int head, int lane) {
  using Tile = PrefillTile<HeadDim>;
  const int g = lane / 4, t = lane % 4;
  float inverse[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inverse[half] = 1.0f / sum;  // > 0: every row sees at least its own key
  }
#pragma unroll
  for (int n = 0; n < HeadDim / 8; ++n) {
    const int column = 8 * n + 2 * t;
    *reinterpret_cast<uint32_t*>(warp_rows + g * Tile::kRowStride + column) =
        pack_bf16x2(output[n][0] * inverse[0], output[n][1] * inverse[0]);
    *reinterpret_cast<uint32_t*>(warp_rows + (g + 8) * Tile::kRowStride + column) =
        pack_bf16x2(output[n][2] * inverse[1], output[n][3] * inverse[1]);
  }
  __syncwarp();
  for (int chunk = lane; chunk < kRowsPerWarp * Tile::kChunksPerRow; chunk += 32) {
    const int row = chunk / Tile::kChunksPerRow;
    const int column = chunk % Tile::kChunksPerRow * 8;
    const int q_row = first_row + row;
    if (q_row < p.q_len)
      *reinterpret_cast<uint4*>(p.out + (static_cast<size_t>(q_row) * p.q_heads + head) * HeadDim + column) =
          *reinterpret_cast<const uint4*>(warp_rows + row * Tile::kRowStride + column);
  }
}

template <int HeadDim>
__global__ void __launch_bounds__(kThreads, PrefillTile<HeadDim>::kMinBlocksPerSm)
    prefill_attention_kernel(const PrefillAttentionParams p, const float scale_log2) {
  using Tile = PrefillTile<HeadDim>;
  extern __shared__ uint4 shared_storage[];  // uint4: the 16-byte alignment cp.async and ldmatrix need
  __nv_bfloat16* const q_tile = reinterpret_cast<__nv_bfloat16*>(shared_storage);
  __nv_bfloat16* const k_tiles = q_tile + Tile::kTileElements;  // [2][64][kRowStride]
  __nv_bfloat16* const v_tiles = k_tiles + 2 * Tile::kTileElements;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int head = blockIdx.x;
  const int kv_head = head / (p.q_heads / p.kv.kv_heads);
  const int query_tile = gridDim.y - 1 - blockIdx.y;  // latest (longest) tiles first
  const int kv_len = p.q_start + p.q_len;             // keys in the cache, this chunk's included
  const int window = p.sliding_window;

  // The CTA's rows and the key tiles any of them can see.
  const int first_row = query_tile * kQueryTile;
  const int cta_first_position = p.q_start + first_row;
  const int cta_last_position = min(cta_first_position + kQueryTile - 1, kv_len - 1);
  const int lowest_key = window > 0 ? max(0, cta_first_position - window + 1) : 0;
  const int first_key_tile = lowest_key / kKeyTile;
  const int last_key_tile = cta_last_position / kKeyTile;

  // This warp's rows; rows past the chunk act as copies of its last row and are not stored.
  const int warp_first_position = cta_first_position + warp * kRowsPerWarp;
  const bool warp_has_rows = warp_first_position < kv_len;
  const int warp_last_position = min(warp_first_position + kRowsPerWarp - 1, kv_len - 1);
  const int row_position[2] = {min(warp_first_position + g, kv_len - 1), min(warp_first_position + g + 8, kv_len - 1)};

  const int32_t* const table_row = p.kv.block_table + static_cast<size_t>(p.sequence) * p.kv.max_pages_per_seq;
  load_query_tile<HeadDim>(p, first_row, head, q_tile);
  commit_async();
  load_key_value_tile<HeadDim>(p, table_row, kv_head, kv_len, first_key_tile * kKeyTile, k_tiles, v_tiles);
  commit_async();
  wait_async<1>();  // the Q tile has landed (the first K/V tile may still be in flight)
  __syncthreads();

  uint4 q_fragments[HeadDim / 16];
#pragma unroll
  for (int k = 0; k < HeadDim / 16; ++k) {
    q_fragments[k] = load_matrix_x4(
        shared_address(q_tile + (warp * kRowsPerWarp + (lane & 15)) * Tile::kRowStride + 16 * k + (lane >> 4) * 8));
  }

  float output[HeadDim / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  for (int key_tile = first_key_tile; key_tile <= last_key_tile; ++key_tile) {
    const int buffer = (key_tile - first_key_tile) & 1;
    if (key_tile < last_key_tile)
      load_key_value_tile<HeadDim>(p, table_row, kv_head, kv_len, (key_tile + 1) * kKeyTile,
                                   k_tiles + (buffer ^ 1) * Tile::kTileElements,
                                   v_tiles + (buffer ^ 1) * Tile::kTileElements);
    commit_async();  // possibly empty: keeps "all but the newest group" meaning "this tile"
    wait_async<1>();
    __syncthreads();

    const int first_key = key_tile * kKeyTile;
    const int last_key = first_key + kKeyTile - 1;
    // The union of this warp's rows sees keys warp_first_position - window + 1 .. warp_last_position.
    const bool warp_sees_tile = warp_has_rows && first_key <= warp_last_position &&
                                (window <= 0 || last_key > warp_first_position - window);
    if (warp_sees_tile) {
      // Some key of the tile is hidden from some row: past the diagonal or before the window.
      const bool needs_mask =
          last_key > warp_first_position || (window > 0 && first_key <= warp_last_position - window);
      float scores[kKeyTile / 8][4];
      multiply_query_key<HeadDim>(scores, q_fragments, k_tiles + buffer * Tile::kTileElements, lane);
      online_softmax<HeadDim>(scores, output, row_max, row_sum, scale_log2, needs_mask, first_key, row_position,
                              window, t);
      multiply_probability_value<HeadDim>(scores, output, v_tiles + buffer * Tile::kTileElements, lane);
    }
    __syncthreads();  // everyone is done with this buffer before the next iteration refills it
  }

  if (warp_has_rows)
    store_output<HeadDim>(p, output, row_sum, q_tile + warp * kRowsPerWarp * Tile::kRowStride,
                          first_row + warp * kRowsPerWarp, head, lane);
}

bool valid_params(const PrefillAttentionParams& p) {
  const PagedKv& kv = p.kv;
  if (!p.q || !p.out || !kv.k_pages || !kv.v_pages || !kv.block_table) return false;
  if (!aligned16(p.q) || !aligned16(p.out) || !aligned16(kv.k_pages) || !aligned16(kv.v_pages)) return false;
  if (kv.head_dim != 64 && kv.head_dim != 128) return false;
  if (kv.kv_heads < 1 || p.q_heads < 1 || p.q_heads % kv.kv_heads != 0) return false;
  if (p.q_len < 1 || p.q_start < 0 || p.sequence < 0 || p.sliding_window < 0) return false;
  // Grid limit; positions stay two key tiles below INT_MAX so no tile bound in the kernel overflows.
  if (p.q_len > kMaxQueryTiles * kQueryTile || p.q_start > INT_MAX - 2 * kKeyTile - p.q_len) return false;
  const long long kv_len = static_cast<long long>(p.q_start) + p.q_len;
  if (kv.max_pages_per_seq < 1 || static_cast<long long>(kv.max_pages_per_seq) * kKvPageSize < kv_len) return false;
  return std::isfinite(p.scale) && p.scale > 0.0f;
}

// Lifts the 48 KB default limit on dynamic shared memory once per device and instantiation.
template <int HeadDim>
cudaError_t opt_in_shared_memory() {
  static PerDevice<bool> opted_in;
  bool done = false;
  return opted_in.get(done, [](bool& ok) {
    ok = true;
    return cudaFuncSetAttribute(prefill_attention_kernel<HeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(PrefillTile<HeadDim>::kSharedBytes));
  });
}

template <int HeadDim>
cudaError_t launch_for_head_dim(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (cudaError_t e = opt_in_shared_memory<HeadDim>(); e != cudaSuccess) return e;
  const dim3 grid(p.q_heads, (p.q_len + kQueryTile - 1) / kQueryTile);
  prefill_attention_kernel<HeadDim>
      <<<grid, kThreads, PrefillTile<HeadDim>::kSharedBytes, stream>>>(p, p.scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_prefill_attention(const PrefillAttentionParams& params, cudaStream_t stream) {
  if (!valid_params(params)) return cudaErrorInvalidValue;
  return params.kv.head_dim == 64 ? launch_for_head_dim<64>(params, stream) : launch_for_head_dim<128>(params, stream);
}

}  // namespace deepfuse::kernels
