// Input RMSNorm + merged QKV projection + bias + RoPE + paged KV append, in ONE launch (decode).
//
// The numbers (Llama-3-8B, one token): the weights are (32 + 2*8) heads x 128 rows x 4096 x 2 B
// = 50 MB, 12 µs at 4.2 TB/s; everything else is a few KB. So the kernel is a weight stream
// with a small prologue (the norm) and a small epilogue (bias, rotation, scatter into the cache),
// and the unfused path's two extra launches and HBM round trips of qkv are what it saves.
//
// The weight stream is kernels/common/cluster_gemv.cuh's; this file is the epilogue.
//
// Work split. One thread-block cluster of C blocks per "head unit" (each q head, each k head, each
// v head: head_dim output rows); the cluster's blocks split the hidden (k) dimension into C ranges.
// C is 8 (Llama-3-8B's packed grid: 48 x 8 = 384 blocks, ~3 per SM), 6 in some spread grids, 4
// over a short hidden dimension (cluster_gemv::dispatch). Inside a block each warp
// streams one 16-row tile (two warps per tile at head_dim 64) over its k range through a
// per-thread cp.async ring (kernels/common/async_ring.cuh), mma.m16n8k16 with the weights on the
// 16-row side and up to 8 tokens per n-tile.
//
// RMSNorm folded in: norm(x)·W^T = (1/rms(x)) · ((x∘w)·W^T). Each block stages x∘w for its k
// range in shared memory (bf16, rows padded so B-fragment loads are conflict-free) and adds
// sum(x^2) over that range. Block r finishes its 1/C of the rotation pairs (i, i + d/2): every
// warp stores its partial sums of those rows into block r's shared memory (distributed shared
// memory, one slot per warp); after one cluster barrier block r adds them, scales by 1/rms, adds
// the bias, rotates q and k (Hugging Face rotate-half, angle = position * inv_freq[i] in fp32, as
// rope_kv_append) and writes q_out or the cache. The inputs of that epilogue (positions, cache
// addresses, bias, angles) are read before the weight stream. Versions tried: docs/kernels/
// qkv_rope_fused.md.
// Without clusters (pre-Hopper) C = 1: one block does the whole k range, when its x slice fits
// in shared memory.
#include "deepfuse/kernels/qkv_rope_fused.hpp"

#include "kernels/common/trace.cuh"
#include "kernels/common/cluster_gemv.cuh"

namespace deepfuse::kernels {
namespace {

using cluster_gemv::Elements;
using cluster_gemv::kThreads;

// The kernel's argument: the caller's params and what the host reads off their format.
struct KernelArgs {
  QkvRopeFusedParams p;
  int scale_block;  // WeightFormatInfo::scale_block (0: per-row scales or none)
};

// Everything one epilogue item (token, rotation pair i) needs besides the cluster's sums.
struct PairItem {
  float cosine = 1.0f, sine = 0.0f;  // identity unless the unit is q or k and the slot is real
  float bias_low = 0.0f, bias_high = 0.0f;
  __nv_bfloat16* destination = nullptr;  // q row or cache row; null: a padded slot's k or v
  bool zero = false;                     // a padded slot's q row: written as zeros
};

// Reads an item's inputs: positions and block-table entries are step inputs the host uploads
// (no kernel of the step writes them), bias and inv_freq are weights. So this runs before the
// weight stream, and the epilogue after the cluster barrier is this block's shared-memory loads
// and the stores, instead of three dependent global round trips (position, page id, then the
// cache address).
template <int HD>
__device__ PairItem prepare_item(const QkvRopeFusedParams& p, int unit, int token, int i, bool is_q, bool is_k,
                                 int head) {
  constexpr int kHalf = HD / 2;
  PairItem item;
  const int position = p.positions[token];
  if (p.bias) {
    item.bias_low = __bfloat162float(p.bias[unit * HD + i]);
    item.bias_high = __bfloat162float(p.bias[unit * HD + i + kHalf]);
  }
  if ((is_q || is_k) && position >= 0) sincosf(static_cast<float>(position) * p.inv_freq[i], &item.sine, &item.cosine);
  if (is_q) {
    item.destination = p.q_out + (static_cast<size_t>(token) * p.q_heads + head) * HD;
    item.zero = position < 0;
  } else if (position >= 0) {
    item.destination = (is_k ? p.kv.k_pages : p.kv.v_pages) + p.kv.token_offset(p.sequences[token], position, head);
  }
  return item;
}

template <int NT, int HD, int C, int kStages, Elements E>
__global__ void __launch_bounds__(kThreads) qkv_rope_fused_kernel(const KernelArgs args, int max_ksteps) {
  const QkvRopeFusedParams& p = args.p;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  trace::stamp(trace::Kernel::fused_qkv, trace::Mark::start);
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  // This block's epilogue: its 1/C of the rotation pairs (i, i + head_dim/2), for every token.
  // Units: q heads, then k heads, then v heads.
  const int kv_heads = p.kv.kv_heads;
  const bool is_q = unit < p.q_heads, is_k = !is_q && unit < p.q_heads + kv_heads;
  const int head = is_q ? unit : is_k ? unit - p.q_heads : unit - p.q_heads - kv_heads;
  constexpr int kHalf = HD / 2;
  const int pair_begin = split_point(kHalf, C, rank), pairs = split_point(kHalf, C, rank + 1) - pair_begin;
  const int items = p.tokens * pairs;
  auto item_at = [&](int index) {
    return prepare_item<HD>(p, unit, index / pairs, pair_begin + index % pairs, is_q, is_k, head);
  };
  const PairItem first = threadIdx.x < items ? item_at(threadIdx.x) : PairItem{};  // in flight during the stream

  // Rows i and i + head_dim/2 are finished by the block whose slice holds pair i: its low rows
  // first, then its high rows.
  constexpr int kHighSlots = cluster_gemv::owned_rows<HD, C>() / 2;
  auto home_of = [](int row) {
    const int pair = row % kHalf, owner = split_owner(kHalf, C, pair);
    return cluster_gemv::RowHome{owner, pair - split_point(kHalf, C, owner) + (row >= kHalf ? kHighSlots : 0)};
  };
  const cluster_gemv::Inputs inputs{p.x,      p.norm_weight, p.norm_eps, p.weights,       p.tokens,
                                    p.hidden, p.pending,     p.scales,   args.scale_block};
  const auto partials =
      cluster_gemv::stream_unit<NT, HD, C, kStages, E>(inputs, unit, rank, shared_raw, max_ksteps, home_of);

  for (int index = threadIdx.x; index < items; index += kThreads) {
    const PairItem item = index == static_cast<int>(threadIdx.x) ? first : item_at(index);
    const int token = index / pairs, local = index % pairs, i = pair_begin + local;
    const float low = partials.sum(local, token) * partials.inverse_rms[token] + item.bias_low;
    const float high = partials.sum(local + kHighSlots, token) * partials.inverse_rms[token] + item.bias_high;
    if (!item.destination) continue;
    item.destination[i] = __float2bfloat16(item.zero ? 0.0f : low * item.cosine - high * item.sine);
    item.destination[i + kHalf] = __float2bfloat16(item.zero ? 0.0f : high * item.cosine + low * item.sine);
  }
  trace::stamp(trace::Kernel::unknown, trace::Mark::end);
}

template <int HD, Elements E>
cudaError_t launch_for_head_dim(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  const KernelArgs args{p, format_info(p.format).scale_block};
  return cluster_gemv::dispatch(p.tokens, p.hidden, units, [&](auto nt, auto c, bool spread, int) {
    constexpr int NT = decltype(nt)::value, C = decltype(c)::value;
    // A spread grid at up to 8 tokens streams through a deeper ring when its layout still fits
    // the spread block's shared memory: more weights in flight before the upstream wait, while
    // the kernel before (the MLP) finishes. Faster in the decode step wherever a spread grid serves
    // (docs/kernels/qkv_rope_fused.md, "A deeper ring for the fused QKV kernel's spread grids").
    if constexpr (NT == 1 && C > 1) {
      using Layout = cluster_gemv::SharedLayout<HD, C>;
      const Layout deep(cluster_gemv::kSpreadRingStages, cluster_gemv::max_ksteps_per_block<C, E>(p.hidden), 8 * NT,
                        cluster_gemv::kColumns<E>);
      size_t spread_bytes = 0;
      if (spread && cluster_gemv::shared_bytes_for_blocks_per_sm(cluster_gemv::kSpreadBlocksPerSm, spread_bytes) ==
                        cudaSuccess && deep.total <= spread_bytes) {
        constexpr int kDeep = cluster_gemv::kSpreadRingStages;
        return cluster_gemv::launch<NT, HD, C, kDeep, E>(qkv_rope_fused_kernel<NT, HD, C, kDeep, E>, args, units,
                                                         p.hidden, stream, spread);
      }
    }
    constexpr int kStages = cluster_gemv::ring_stages<NT, C>();
    return cluster_gemv::launch<NT, HD, C, kStages, E>(qkv_rope_fused_kernel<NT, HD, C, kStages, E>, args, units,
                                                       p.hidden, stream, spread);
  }, cluster_gemv::kColumns<E>);
}

template <Elements E>
cudaError_t launch_for_format(const QkvRopeFusedParams& p, int units, cudaStream_t stream) {
  return p.kv.head_dim == 64 ? launch_for_head_dim<64, E>(p, units, stream) : launch_for_head_dim<128, E>(p, units, stream);
}

}  // namespace

cudaError_t launch_qkv_rope_fused(const QkvRopeFusedParams& p, cudaStream_t stream) {
  const int head_dim = p.kv.head_dim;
  if (!p.x || !p.norm_weight || !p.weights || !p.inv_freq || !p.positions || !p.sequences || !p.q_out ||
      !p.kv.k_pages || !p.kv.v_pages || !p.kv.block_table ||
      !qkv_rope_fused_unsupported({p.tokens, p.hidden, p.q_heads, p.kv.kv_heads, head_dim}, p.format).empty() ||
      (format_info(p.format).scales != ScaleGranularity::none) != (p.scales != nullptr))
    return cudaErrorInvalidValue;
  const int units = p.q_heads + 2 * p.kv.kv_heads;
  trace::attach_unit();
  if (p.format == WeightFormat::bf16) return launch_for_format<Elements::bf16>(p, units, stream);
  return launch_for_format<Elements::e4m3>(p, units, stream);
}

cudaError_t pack_qkv_weights(const __nv_bfloat16* weights, uint4* packed, int rows, int hidden, cudaStream_t stream) {
  return pack_rows_fragments(weights, packed, rows, hidden, stream);
}

}  // namespace deepfuse::kernels
