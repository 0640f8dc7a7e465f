// QKV epilogue: bias, rotary position embedding, and the append to the paged KV cache.
//
// For each token t at position p = positions[t] (one launch covers a decode step or a prefill
// chunk, any mix of sequences), with x = qkv[t] (times 1/rms of the token's residual row when the
// input norm is folded into the weights, folded_norm.cuh; + bias) split into q_heads + 2 kv_heads
// heads:
//   q heads:  q_out[t, h]                    = rope(x_h, p)
//   k heads:  k_pages at (sequences[t], p)   = rope(x_h, p)
//   v heads:  v_pages at (sequences[t], p)   = x_h
// rope is Hugging Face's rotate-half form: for i < d/2, with angle = p * inv_freq[i] (fp32, then
// sincosf), (x_i, x_{i+d/2}) -> (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos + x_i sin). Everything is
// fp32 from the bf16 inputs and rounded to bf16 once, on the store. A padded token (p < 0) gets a
// zero q row and leaves the cache alone; so does a position the block table cannot hold or whose
// page id is negative (the runtime's bug, but the kernel must not write outside its pages).
//
// The two numbers: bytes = tokens * (q_heads + 2 kv_heads) * d * 2 read, the same written; ~6
// FLOPs and one sincosf per rotated pair. Memory-bound by far; a decode step at batch 8 moves
// ~100 KB, so this is one launch's latency.
//
// Tiling: one thread per (token, head, chunk), chunk = W consecutive pairs: the thread loads W
// values from the first half of the head and the matching W from the second half (two 16-byte
// loads at W = 8), rotates the W pairs in registers and stores both halves, so rotate-half needs
// no shuffles or shared memory. W = 8 when d/2 is a multiple of 8 (d = 64, 80, 96, 128, ...), else
// W = 4 (d a multiple of 8 makes d/2 a multiple of 4). Consecutive threads cover consecutive
// chunks, heads, then tokens: coalesced reads of each qkv row, and a K/V head's W-value chunks
// land contiguously in its page row.
//
// Programmatic dependent launch: the kernel waits for the upstream grid before its first read and
// lets the next kernel be scheduled at once, so the decode attention after it (batches past the
// fused QKV kernel's 32 tokens) requests its older cache pages while this one runs.
#include "deepfuse/kernels/rope_kv_append.hpp"

#include <algorithm>
#include <cstddef>

#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/pointer_checks.hpp"
#include "kernels/common/row_rms.cuh"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;

// W bf16 values moved as one load/store: 16 bytes at W = 8, 8 bytes at W = 4.
template <int W>
struct Chunk;
template <>
struct Chunk<8> {
  using Bits = uint4;
};
template <>
struct Chunk<4> {
  using Bits = uint2;
};

template <int W>
__device__ __forceinline__ void load_chunk(const __nv_bfloat16* source, float (&values)[W]) {
  const typename Chunk<W>::Bits bits = *reinterpret_cast<const typename Chunk<W>::Bits*>(source);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
  for (int j = 0; j < W / 2; ++j) {
    const float2 pair = __bfloat1622float2(pairs[j]);
    values[2 * j] = pair.x;
    values[2 * j + 1] = pair.y;
  }
}

template <int W>
__device__ __forceinline__ void store_chunk(__nv_bfloat16* destination, const float (&values)[W]) {
  typename Chunk<W>::Bits bits;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&bits);
#pragma unroll
  for (int j = 0; j < W / 2; ++j) pairs[j] = __floats2bfloat162_rn(values[2 * j], values[2 * j + 1]);
  *reinterpret_cast<typename Chunk<W>::Bits*>(destination) = bits;
}

// Where (token, head)'s rotated values go: q_out, its cache slot, or nowhere (padded or
// unplaceable K/V: the cache stays untouched).
__device__ __forceinline__ __nv_bfloat16* destination_of(const RopeKvAppendParams& p, size_t token, int head,
                                                          int position) {
  const int d = p.kv.head_dim;
  const bool is_q = head < p.q_heads, is_v = head >= p.q_heads + p.kv.kv_heads;
  if (is_q) return p.q_out + (token * p.q_heads + head) * d;
  if (position < 0 || position / kKvPageSize >= p.kv.max_pages_per_seq) return nullptr;
  const int sequence = __ldg(p.sequences + token);
  const int kv_head = is_v ? head - p.q_heads - p.kv.kv_heads : head - p.q_heads;
  const size_t entry = static_cast<size_t>(sequence) * p.kv.max_pages_per_seq + position / kKvPageSize;
  const int32_t page = sequence < 0 ? -1 : __ldg(p.kv.block_table + entry);
  if (page < 0) return nullptr;
  const size_t offset = p.kv.page_offset(page, kv_head) + static_cast<size_t>(position % kKvPageSize) * d;
  return (is_v ? p.kv.v_pages : p.kv.k_pages) + offset;
}

// One (token, head, chunk) item: its two halves loaded (before anything that waits, so a folded
// norm's reduction overlaps the loads), scaled by `inverse_rms` (1 without a folded norm), biased,
// rotated and stored.
template <int W>
struct Item {
  __nv_bfloat16* destination = nullptr;
  int first = 0, position = 0;
  bool rotate = false;
  float low[W], high[W];

  __device__ void load(const RopeKvAppendParams& p, size_t token, int head, int chunk) {
    const int d = p.kv.head_dim, half = d / 2;
    first = chunk * W;  // this item's pairs are (first + j, first + j + half), j < W
    position = __ldg(p.positions + token);
    rotate = head < p.q_heads + p.kv.kv_heads;  // q and k; v is only biased
    destination = destination_of(p, token, head, position);
    if (!destination || position < 0) return;
    const size_t row_width = static_cast<size_t>(p.q_heads + 2 * p.kv.kv_heads) * d;
    const size_t column = static_cast<size_t>(head) * d + first;
    load_chunk<W>(p.qkv + token * row_width + column, low);
    load_chunk<W>(p.qkv + token * row_width + column + half, high);
  }

  __device__ void finish_and_store(const RopeKvAppendParams& p, int head, float inverse_rms) {
    if (!destination) return;
    const int half = p.kv.head_dim / 2;
    if (position < 0) {  // padded token: q row of zeros
#pragma unroll
      for (int j = 0; j < W; ++j) low[j] = high[j] = 0.0f;
    } else {
#pragma unroll
      for (int j = 0; j < W; ++j) low[j] *= inverse_rms, high[j] *= inverse_rms;
      if (p.qkv_bias) {
        const size_t column = static_cast<size_t>(head) * p.kv.head_dim + first;
        float bias_low[W], bias_high[W];
        load_chunk<W>(p.qkv_bias + column, bias_low);
        load_chunk<W>(p.qkv_bias + column + half, bias_high);
#pragma unroll
        for (int j = 0; j < W; ++j) low[j] += bias_low[j], high[j] += bias_high[j];
      }
      if (rotate) {
#pragma unroll
        for (int j = 0; j < W; ++j) {
          float sine, cosine;
          sincosf(static_cast<float>(position) * __ldg(p.inv_freq + first + j), &sine, &cosine);
          const float x1 = low[j], x2 = high[j];
          low[j] = x1 * cosine - x2 * sine;
          high[j] = x2 * cosine + x1 * sine;
        }
      }
    }
    store_chunk<W>(destination + first, low);
    store_chunk<W>(destination + first + half, high);
  }
};

template <int W>
__global__ void rope_kv_append_kernel(RopeKvAppendParams p) {
  allow_downstream_launch();
  wait_for_upstream_grids();
  const int chunks_per_head = p.kv.head_dim / 2 / W;
  const int heads = p.q_heads + 2 * p.kv.kv_heads;
  const size_t total = static_cast<size_t>(p.tokens) * heads * chunks_per_head;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(index % chunks_per_head);
    const int head = static_cast<int>(index / chunks_per_head % heads);
    Item<W> item;
    item.load(p, index / chunks_per_head / heads, head, chunk);
    item.finish_and_store(p, head, 1.0f);
  }
}

// With a folded input norm: block row blockIdx.y is one token, one item per thread, and the block
// reduces the token's 1/rms while the items' loads are in flight.
template <int W>
__global__ void __launch_bounds__(1024) rope_kv_append_normalized_kernel(RopeKvAppendParams p) {
  __shared__ float scratch[32];
  allow_downstream_launch();
  wait_for_upstream_grids();
  const int chunks_per_head = p.kv.head_dim / 2 / W;
  const int heads = p.q_heads + 2 * p.kv.kv_heads;
  const size_t token = blockIdx.y;
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  const bool active = index < heads * chunks_per_head;
  const int head = index / chunks_per_head;
  Item<W> item;
  if (active) item.load(p, token, head, index % chunks_per_head);
  const FoldedRmsNorm& norm = p.input_norm;
  const float inverse_rms = row_inverse_rms(norm.input + token * norm.hidden, norm.hidden, norm.eps, scratch);
  if (active) item.finish_and_store(p, head, inverse_rms);
}

}  // namespace

cudaError_t launch_rope_kv_append(const RopeKvAppendParams& p, cudaStream_t stream) {
  const PagedKv& kv = p.kv;
  if (!p.qkv || !p.inv_freq || !p.positions || !p.sequences || !p.q_out || !kv.k_pages || !kv.v_pages ||
      !kv.block_table)
    return cudaErrorInvalidValue;
  if (p.tokens < 1 || p.q_heads < 1 || kv.kv_heads < 1 || p.q_heads % kv.kv_heads != 0 || kv.head_dim < 8 ||
      kv.head_dim % 8 != 0 || kv.max_pages_per_seq < 1)
    return cudaErrorInvalidValue;
  if (!aligned16(p.qkv) || !aligned16(p.q_out) || !aligned16(kv.k_pages) || !aligned16(kv.v_pages) ||
      (p.qkv_bias && !aligned16(p.qkv_bias)))
    return cudaErrorInvalidValue;
  const size_t element = sizeof(__nv_bfloat16);
  const size_t qkv_bytes = static_cast<size_t>(p.tokens) * (p.q_heads + 2 * kv.kv_heads) * kv.head_dim * element;
  const size_t q_bytes = static_cast<size_t>(p.tokens) * p.q_heads * kv.head_dim * element;
  if (overlaps(p.q_out, q_bytes, p.qkv, qkv_bytes)) return cudaErrorInvalidValue;
  if (!valid_folded_norm(p.input_norm)) return cudaErrorInvalidValue;

  const int half = kv.head_dim / 2;
  const int width = half % 8 == 0 ? 8 : 4;
  if (p.input_norm.input) {
    constexpr int kMaxTokens = 65535;
    if (p.tokens > kMaxTokens) return cudaErrorInvalidValue;
    // One block per token where its items fit (each block reduces the token's 1/rms itself).
    constexpr int kMaxThreads = 1024;
    const int items = (p.q_heads + 2 * kv.kv_heads) * (half / width);
    const int threads = std::min(kMaxThreads, (items + 31) / 32 * 32);
    const ClusterLaunch launch(dim3((items + threads - 1) / threads, p.tokens), threads, 0, 1, stream, true);
    return cudaLaunchKernelEx(&launch.config,
                              width == 8 ? rope_kv_append_normalized_kernel<8> : rope_kv_append_normalized_kernel<4>, p);
  }
  const size_t threads_needed = static_cast<size_t>(p.tokens) * (p.q_heads + 2 * kv.kv_heads) * (half / width);
  const int blocks = static_cast<int>(std::min<size_t>((threads_needed + kThreads - 1) / kThreads, kMaxBlocks));
  const ClusterLaunch launch(blocks, kThreads, 0, 1, stream, true);
  return cudaLaunchKernelEx(&launch.config, width == 8 ? rope_kv_append_kernel<8> : rope_kv_append_kernel<4>, p);
}

}  // namespace deepfuse::kernels
