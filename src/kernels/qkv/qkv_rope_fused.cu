// Input RMSNorm + merged QKV projection + bias + RoPE + paged KV append, in ONE launch (decode).
//
// The numbers (Llama-3-8B, one token): the weights are (32 + 2*8) heads x 128 rows x 4096 x 2 B
// = 50 MB, 12 µs at 4.2 TB/s; everything else is a few KB. So the kernel is a weight stream
// with a small prologue (the norm) and a small epilogue (bias, rotation, scatter into the cache),
// and the unfused path's two extra launches and HBM round trips of qkv are what it saves.
//
// Work split. One thread-block cluster of C = 8 blocks per "head unit" (each q head, each k
// head, each v head: head_dim output rows); the cluster's blocks split the hidden (k) dimension
// into 8 ranges, so Llama-3-8B runs 48 x 8 = 384 blocks, ~3 per SM. Inside a block each warp
// streams one 16-row tile (two warps per tile at head_dim 64) over its k range through a
// per-thread cp.async ring (kernels/common/async_ring.cuh), mma.m16n8k16 with the weights on the
// 16-row side and up to 8 tokens per n-tile.
//
// RMSNorm folded in: norm(x)·W^T = (1/rms(x)) · ((x∘w)·W^T). Each block stages x∘w for its k
// range in shared memory (bf16, rows padded so B-fragment loads are conflict-free) and adds
// sum(x^2) over that range. Partial sums stay in each block's shared memory; after one cluster
// barrier, block r reads the C partials of its 1/C of the rotation pairs (i, i + d/2) through
// distributed shared memory, scales by 1/rms, adds the bias, rotates q and k (Hugging Face
// rotate-half, angle = position * inv_freq[i] in fp32, as rope_kv_append) and writes q_out or the
// cache. (v1 sent every partial to the leader with remote atomics: 30-110 µs, growing with M.) Without clusters (pre-Hopper) C = 1: one block
// does the whole k range, when its x slice fits in shared memory.
#include "kernels/qkv/qkv_rope_fused.cuh"

#include <algorithm>

#include "kernels/common/async_ring.cuh"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/mlp/fragment.cuh"

namespace deepfuse::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// cp.async ring depth per thread (16 B per stage): ~130 KB in flight per SM with 3 blocks each;
// 32-token launches stage 4x the x rows, so their ring is shorter to keep 3 blocks per SM.
template <int NT>
constexpr int ring_stages() {
  return NT == 4 ? 6 : 12;
}
constexpr int kMaxCluster = 8;
constexpr int kMaxSharedBytes = 200 * 1024;

// Shared memory, carved from one dynamic allocation (sizes depend on the launch).
struct SharedLayout {
  int x_stride = 0;  // bf16 per staged x row: k range + 8 (padding: conflict-free B fragments)
  size_t ring = 0, sums = 0, squares = 0, x = 0, total = 0;

  __host__ __device__ SharedLayout(int stages, int max_ksteps, int token_rows, int head_dim) {
    x_stride = max_ksteps * 16 + 8;
    ring = 0;
    sums = ring + sizeof(uint4) * stages * kThreads;
    squares = sums + sizeof(float) * head_dim * token_rows;
    x = squares + sizeof(float) * 2 * kQkvFusedMaxTokens;
    total = x + sizeof(__nv_bfloat16) * static_cast<size_t>(token_rows) * x_stride;
  }
};

template <int NT, int HD, int C>
__global__ void __launch_bounds__(kThreads) qkv_rope_fused_kernel(const QkvRopeFusedParams p, int max_ksteps) {
  constexpr int kRows = 8 * NT;            // token rows of the MMA (tokens padded with zeros)
  constexpr int kTiles = HD / 16;          // 16-row tiles per head unit
  constexpr int kWarpsPerTile = kWarps / kTiles;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  constexpr int kStages = ring_stages<NT>();
  const SharedLayout layout(kStages, max_ksteps, kRows, HD);
  auto* ring = reinterpret_cast<uint4(*)[kThreads]>(shared_raw + layout.ring);
  float* sums = reinterpret_cast<float*>(shared_raw + layout.sums);        // [HD rows][kRows tokens]
  float* squares = reinterpret_cast<float*>(shared_raw + layout.squares);  // [tokens] this block's sum of x^2
  float* inverse_rms = squares + kQkvFusedMaxTokens;                        // [tokens] 1/rms over the cluster
  auto* xs = reinterpret_cast<__nv_bfloat16*>(shared_raw + layout.x);      // [kRows][x_stride] x∘w

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  const int ksteps = p.hidden / 16;
  const int k_begin = split_point(ksteps, C, rank), k_count = split_point(ksteps, C, rank + 1) - k_begin;
  const int tile = warp % kTiles, part = warp / kTiles;
  const int warp_begin = k_begin + split_point(k_count, kWarpsPerTile, part);
  const int warp_end = k_begin + split_point(k_count, kWarpsPerTile, part + 1);
  const uint4* tile_weights = p.weights + static_cast<size_t>(unit * kTiles + tile) * ksteps * 32 + lane;

  for (int i = tid; i < HD * kRows; i += kThreads) sums[i] = 0.0f;

  auto issue = [&](int k, int stage, int) { copy16_async(&ring[stage][tid], tile_weights + static_cast<size_t>(k) * 32); };
  ring_prime<kStages, 1>(warp_begin, warp_end, issue);

  // Stage x∘w for this block's k range (one warp per token row) while the first weights fly.
  const int vectors = k_count * 2;  // 8-column vectors
  for (int row = warp; row < kRows; row += kWarps) {
    float row_squares = 0.0f;
    for (int v = lane; v < vectors; v += 32) {
      const int column = k_begin * 16 + v * 8;
      uint4 bits = make_uint4(0, 0, 0, 0);
      if (row < p.tokens) bits = *reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(row) * p.hidden + column);
      const uint4 weight = __ldg(reinterpret_cast<const uint4*>(p.norm_weight + column));
      uint32_t in[4] = {bits.x, bits.y, bits.z, bits.w}, w[4] = {weight.x, weight.y, weight.z, weight.w}, out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&in[j]);
        const float2 f = __bfloat1622float2(pair);
        row_squares += f.x * f.x + f.y * f.y;
        const __nv_bfloat162 scaled = __hmul2(pair, *reinterpret_cast<const __nv_bfloat162*>(&w[j]));
        out[j] = *reinterpret_cast<const uint32_t*>(&scaled);
      }
      *reinterpret_cast<uint4*>(xs + row * layout.x_stride + v * 8) = make_uint4(out[0], out[1], out[2], out[3]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) row_squares += __shfl_xor_sync(0xffffffffu, row_squares, offset);
    if (lane == 0 && row < kQkvFusedMaxTokens) squares[row] = row_squares;
  }
  __syncthreads();  // xs complete, sums zeroed

  float acc[NT][4] = {};
  ring_run<kStages, 1>(warp_begin, warp_end, issue, [&](int k, int stage, int) {
    const uint4 a = ring[stage][tid];
    const int column = (k - k_begin) * 16 + 2 * t;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const __nv_bfloat16* b = xs + (nt * 8 + g) * layout.x_stride + column;
      mma_bf16_m16n8k16(acc[nt], a, *reinterpret_cast<const uint32_t*>(b), *reinterpret_cast<const uint32_t*>(b + 8));
    }
  });
  // Partial sums stay in this block (two warps share a tile at head_dim 64: shared atomics).
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = tile * 16 + g + (c >= 2 ? 8 : 0), token = nt * 8 + 2 * t + (c & 1);
      if (token < p.tokens) atomicAdd(&sums[row * kRows + token], acc[nt][c]);
    }
  cluster_barrier<C>();  // every block's partial sums and squares are complete

  // Each block reduces the C partials of its own slice of rotation pairs (i, i + head_dim/2)
  // through distributed shared memory, and finishes them: the epilogue runs on all C blocks.
  if (tid < p.tokens) {
    float total = 0.0f;
#pragma unroll
    for (int b = 0; b < C; ++b) total += in_block<C>(squares, b)[tid];
    inverse_rms[tid] = rsqrtf(total / p.hidden + p.norm_eps);
  }
  __syncthreads();
  // Epilogue: scale, bias, rotate, scatter. Units: q heads, then k heads, then v heads.
  const int kv_heads = p.kv.kv_heads;
  const bool is_q = unit < p.q_heads, is_k = !is_q && unit < p.q_heads + kv_heads;
  const int head = is_q ? unit : is_k ? unit - p.q_heads : unit - p.q_heads - kv_heads;
  constexpr int kHalf = HD / 2;
  const int pair_begin = split_point(kHalf, C, rank), pairs = split_point(kHalf, C, rank + 1) - pair_begin;
  for (int item = tid; item < p.tokens * pairs; item += kThreads) {
    const int token = item / pairs, i = pair_begin + item % pairs;
    const int position = p.positions[token];
    float low = 0.0f, high = 0.0f;
#pragma unroll
    for (int b = 0; b < C; ++b) {
      const float* partial = in_block<C>(sums, b);
      low += partial[i * kRows + token];
      high += partial[(i + kHalf) * kRows + token];
    }
    low *= inverse_rms[token];
    high *= inverse_rms[token];
    if (p.bias) {
      low += __bfloat162float(p.bias[unit * HD + i]);
      high += __bfloat162float(p.bias[unit * HD + i + kHalf]);
    }
    if ((is_q || is_k) && position >= 0) {  // v is not rotated
      float sine, cosine;
      sincosf(static_cast<float>(position) * p.inv_freq[i], &sine, &cosine);
      const float rotated_low = low * cosine - high * sine;
      high = high * cosine + low * sine;
      low = rotated_low;
    }
    __nv_bfloat16* destination;
    if (is_q) {
      destination = p.q_out + (static_cast<size_t>(token) * p.q_heads + head) * HD;
      if (position < 0) low = high = 0.0f;
    } else {
      if (position < 0) continue;
      destination = (is_k ? p.kv.k_pages : p.kv.v_pages) + p.kv.token_offset(p.sequences[token], position, head);
    }
    destination[i] = __float2bfloat16(low);
    destination[i + kHalf] = __float2bfloat16(high);
  }
  cluster_barrier<C>();  // no block leaves while another still reads its partial sums
}

__global__ void pack_rows_kernel(const __nv_bfloat16* weights, uint4* packed, int rows, int hidden) {
  const size_t ksteps = hidden / 16;
  const size_t total = static_cast<size_t>(rows / 16) * ksteps * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int k = static_cast<int>((index / 32) % ksteps);
    const int tile = static_cast<int>(index / 32 / ksteps);
    packed[index] = gather_a_fragment(weights, hidden, tile * 16, k * 16, lane);
  }
}

template <int NT, int HD, int C>
cudaError_t launch_instance(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  const int max_ksteps = (p.hidden / 16 + C - 1) / C;
  const SharedLayout layout(ring_stages<NT>(), max_ksteps, 8 * NT, HD);
  if (layout.total > static_cast<size_t>(kMaxSharedBytes)) return cudaErrorNotSupported;
  auto kernel = qkv_rope_fused_kernel<NT, HD, C>;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSharedBytes);
  if (attribute != cudaSuccess) return attribute;
  const ClusterLaunch launch(static_cast<unsigned>(units * C), kThreads, layout.total, C, stream);
  return cudaLaunchKernelEx(&launch.config, kernel, p, max_ksteps);
}

template <int NT, int HD>
cudaError_t launch_for_head_dim(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  int device = 0, major = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); e != cudaSuccess) return e;
  if (major >= 9 && p.hidden / 16 >= kMaxCluster) return launch_instance<NT, HD, kMaxCluster>(p, units, stream);
  return launch_instance<NT, HD, 1>(p, units, stream);
}

template <int HD>
cudaError_t launch_for_tokens(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  if (p.tokens <= 8) return launch_for_head_dim<1, HD>(p, units, stream);
  if (p.tokens <= 16) return launch_for_head_dim<2, HD>(p, units, stream);
  return launch_for_head_dim<4, HD>(p, units, stream);
}

}  // namespace

cudaError_t launch_qkv_rope_fused(const QkvRopeFusedParams& p, cudaStream_t stream) {
  const int head_dim = p.kv.head_dim;
  if (!p.x || !p.norm_weight || !p.weights || !p.inv_freq || !p.positions || !p.sequences || !p.q_out ||
      !p.kv.k_pages || !p.kv.v_pages || !p.kv.block_table || p.tokens < 1 || p.tokens > kQkvFusedMaxTokens ||
      p.hidden < 64 || p.hidden % 64 != 0 || p.q_heads < 1 || p.kv.kv_heads < 1 || p.q_heads % p.kv.kv_heads != 0 ||
      (head_dim != 64 && head_dim != 128))
    return cudaErrorInvalidValue;
  const int units = p.q_heads + 2 * p.kv.kv_heads;
  return head_dim == 64 ? launch_for_tokens<64>(p, units, stream) : launch_for_tokens<128>(p, units, stream);
}

cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, uint4* packed, int rows, int hidden, cudaStream_t stream) {
  if (!weights || !packed || rows < 16 || rows % 16 != 0 || hidden < 16 || hidden % 16 != 0)
    return cudaErrorInvalidValue;
  pack_rows_kernel<<<1024, 256, 0, stream>>>(weights, packed, rows, hidden);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
