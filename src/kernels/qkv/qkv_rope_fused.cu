// Input RMSNorm + merged QKV projection + bias + RoPE + paged KV append, in ONE launch (decode).
//
// The numbers (Llama-3-8B, one token): the weights are (32 + 2*8) heads x 128 rows x 4096 x 2 B
// = 50 MB, 12 µs at 4.2 TB/s; everything else is a few KB. So the kernel is a weight stream
// with a small prologue (the norm) and a small epilogue (bias, rotation, scatter into the cache),
// and the unfused path's two extra launches and HBM round trips of qkv are what it saves.
//
// The weight stream is kernels/gemv/cluster_gemv.cuh's; this file is the epilogue.
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
// cache. (v1 sent every partial to the leader with remote atomics: 30-110 µs, growing with M.)
// Without clusters (pre-Hopper) C = 1: one block does the whole k range, when its x slice fits
// in shared memory.
#include "kernels/qkv/qkv_rope_fused.cuh"

#include "kernels/gemv/cluster_gemv.cuh"

namespace deepfuse::kernels {
namespace {

using cluster_gemv::kThreads;

template <int NT, int HD, int C>
__global__ void __launch_bounds__(kThreads) qkv_rope_fused_kernel(const QkvRopeFusedParams p, int max_ksteps) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  const cluster_gemv::Inputs inputs{p.x, p.norm_weight, p.norm_eps, p.weights, p.tokens, p.hidden};
  const auto partials = cluster_gemv::stream_unit<NT, HD, C>(inputs, unit, rank, shared_raw, max_ksteps);

  // Epilogue over this block's slice of rotation pairs (i, i + head_dim/2): scale, bias, rotate,
  // scatter. Units: q heads, then k heads, then v heads.
  const int kv_heads = p.kv.kv_heads;
  const bool is_q = unit < p.q_heads, is_k = !is_q && unit < p.q_heads + kv_heads;
  const int head = is_q ? unit : is_k ? unit - p.q_heads : unit - p.q_heads - kv_heads;
  constexpr int kHalf = HD / 2;
  const int pair_begin = split_point(kHalf, C, rank), pairs = split_point(kHalf, C, rank + 1) - pair_begin;
  for (int item = threadIdx.x; item < p.tokens * pairs; item += kThreads) {
    const int token = item / pairs, i = pair_begin + item % pairs;
    const int position = p.positions[token];
    float low = partials.sum(i, token) * partials.inverse_rms[token];
    float high = partials.sum(i + kHalf, token) * partials.inverse_rms[token];
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

template <int HD>
cudaError_t launch_for_head_dim(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  return cluster_gemv::dispatch(p.tokens, p.hidden, [&](auto nt, auto c) {
    constexpr int NT = decltype(nt)::value, C = decltype(c)::value;
    return cluster_gemv::launch<NT, HD, C>(qkv_rope_fused_kernel<NT, HD, C>, p, units, p.hidden, stream);
  });
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
  return head_dim == 64 ? launch_for_head_dim<64>(p, units, stream) : launch_for_head_dim<128>(p, units, stream);
}

cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, uint4* packed, int rows, int hidden, cudaStream_t stream) {
  return pack_rows_fragments(weights, packed, rows, hidden, stream);
}

}  // namespace deepfuse::kernels
