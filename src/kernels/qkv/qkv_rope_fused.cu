// Input RMSNorm + merged QKV projection + bias + RoPE + paged KV append, in ONE launch (decode).
//
// The numbers (Llama-3-8B, one token): the weights are (32 + 2*8) heads x 128 rows x 4096 x 2 B
// = 50 MB, 12 µs at 4.2 TB/s; everything else is a few KB. So the kernel is a weight stream
// with a small prologue (the norm) and a small epilogue (bias, rotation, scatter into the cache),
// and the unfused path's two extra launches and HBM round trips of qkv are what it saves.
//
// The weight stream is kernels/gemv/streamk_gemv.cuh's (every warp streams an equal share of
// the weights; the warp that completes a 16-row tile runs the epilogue); this file is the
// prologue and the epilogue.
//
// RMSNorm folded in: norm(x)·W^T = (1/rms(x)) · (x·(W∘w)^T). The norm weight w is multiplied
// into the packed columns once, at load (pack_qkv_weights); each block computes 1/rms of the
// step's tokens from x (a few KB, L2) after the upstream wait and scales the finished sums.
//
// RoPE in the epilogue: the packing puts the rotate-half pairs (i, i + head_dim/2) of a head into
// the top and bottom 8 rows of one tile (pack_rotary_rows_fragments), so the warp finishing a
// tile holds both halves of 8 pairs: scale by 1/rms, add the bias, rotate q and k (Hugging Face
// rotate-half, angle = position * inv_freq[i] in fp32, as rope_kv_append) and write q_out or the
// cache.
#include "kernels/qkv/qkv_rope_fused.cuh"

#include "kernels/gemv/packing.cuh"
#include "kernels/gemv/streamk_gemv.cuh"

namespace deepfuse::kernels {
namespace {

namespace sk = streamk_gemv;

template <int NT, int RING, int HD>
__global__ void __launch_bounds__(sk::kThreads, (sk::Ring<NT, RING>::kBlocksPerSm))
    qkv_rope_fused_kernel(const QkvRopeFusedParams p, const sk::Problem problem) {
  extern __shared__ __align__(16) unsigned char shared[];
  __shared__ float inverse_rms[sk::kMaxTokens];
  sk::WarpStream<NT, RING> stream(problem, shared);
  stream.request_weights();
  wait_for_upstream_grids();
  allow_downstream_launch();

  // 1/rms(x) per token, one warp per token row.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int token = warp; token < p.tokens; token += sk::kWarps) {
    const uint4* row = reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(token) * p.hidden);
    float squares = 0.0f;
    for (int v = lane; v < p.hidden / 8; v += 32) {
      const uint4 bits = row[v];
      const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[j]));
        squares += f.x * f.x + f.y * f.y;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    if (lane == 0) inverse_rms[token] = rsqrtf(squares / p.hidden + p.norm_eps);
  }
  __syncthreads();

  // Epilogue of a finished tile: head unit (q heads, then k, then v) and its pairs 8j .. 8j + 7.
  constexpr int kHalf = HD / 2, kTilesPerHead = HD / 16;
  const int kv_heads = p.kv.kv_heads;
  stream.run([&](long long tile, const sk::TileSums& sums) {
    const int unit = static_cast<int>(tile / kTilesPerHead), j = static_cast<int>(tile % kTilesPerHead);
    const bool is_q = unit < p.q_heads, is_k = !is_q && unit < p.q_heads + kv_heads;
    const int head = is_q ? unit : is_k ? unit - p.q_heads : unit - p.q_heads - kv_heads;
    for (int item = lane; item < 8 * p.tokens; item += 32) {
      const int r = item % 8, token = item / 8, i = 8 * j + r;
      float low = sums.take(r, token) * inverse_rms[token];  // taken first: every slot is reset
      float high = sums.take(r + 8, token) * inverse_rms[token];
      const int position = p.positions[token];
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
  });
}

template <int HD>
cudaError_t launch_for_head_dim(const QkvRopeFusedParams& p, const sk::Problem& problem, cudaStream_t stream) {
  return sk::dispatch(p.tokens, [&](auto nt, auto ring) {
    constexpr int NT = decltype(nt)::value, RING = decltype(ring)::value;
    return sk::launch<sk::Ring<NT, RING>>(qkv_rope_fused_kernel<NT, RING, HD>, p, problem, stream);
  });
}

int qkv_rows(int q_heads, int kv_heads, int head_dim) { return (q_heads + 2 * kv_heads) * head_dim; }

}  // namespace

size_t qkv_rope_fused_workspace_bytes(int q_heads, int kv_heads, int head_dim) {
  return sk::workspace_bytes(qkv_rows(q_heads, kv_heads, head_dim));
}

cudaError_t launch_qkv_rope_fused(const QkvRopeFusedParams& p, cudaStream_t stream) {
  const int head_dim = p.kv.head_dim;
  if (!p.x || !p.weights || !p.workspace || !p.inv_freq || !p.positions || !p.sequences || !p.q_out ||
      !p.kv.k_pages || !p.kv.v_pages || !p.kv.block_table || p.tokens < 1 || p.tokens > kQkvFusedMaxTokens ||
      p.hidden < 64 || p.hidden % 64 != 0 || p.q_heads < 1 || p.kv.kv_heads < 1 || p.q_heads % p.kv.kv_heads != 0 ||
      (head_dim != 64 && head_dim != 128))
    return cudaErrorInvalidValue;
  sk::Problem problem;
  problem.weights = p.weights;
  problem.x = p.x;
  problem.workspace = p.workspace;
  problem.tokens = p.tokens;
  problem.inner = p.hidden;
  problem.tiles = qkv_rows(p.q_heads, p.kv.kv_heads, head_dim) / sk::kTileRows;
  return head_dim == 64 ? launch_for_head_dim<64>(p, problem, stream) : launch_for_head_dim<128>(p, problem, stream);
}

cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, const __nv_bfloat16* norm_weight, uint4* packed, int rows,
                             int hidden, int head_dim, cudaStream_t stream) {
  return pack_rotary_rows_fragments(weights, norm_weight, packed, rows, hidden, head_dim, stream);
}

}  // namespace deepfuse::kernels
