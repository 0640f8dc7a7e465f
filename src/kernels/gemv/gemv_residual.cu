// Output projection + residual for decode (and, with norm_weight, any RMSNorm-then-projection of
// up to 32 tokens: the FP8 MLP's gate_up): the cluster GEMV weight stream (cluster_gemv.cuh)
// over units of 64 or 128 output rows, each cluster of C blocks (cluster_gemv::dispatch: 8, 6 or
// 4) splitting the inner dimension; every block of a cluster then finishes its 1/C of the unit's
// rows: sum of the partials, bias, residual, bf16. Bytes: rows x inner x 2 of weights (32 MB for Llama-3-8B's o_proj, 7.6 µs at
// 4.2 TB/s); the cuBLASLt path it replaces runs a split-K GEMM plus a reduction kernel.
#include "deepfuse/kernels/gemv_residual.hpp"

#include "kernels/common/residual_sum.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/common/cluster_gemv.cuh"

namespace deepfuse::kernels {
namespace {

using cluster_gemv::kThreads;

using cluster_gemv::Elements;

// The kernel's argument: the caller's params and what the host reads off their format.
struct KernelArgs {
  GemvResidualParams p;
  int scale_block;  // WeightFormatInfo::scale_block (0: per-row scales or none)
};

template <int NT, int kUnitRows, int C, int kStages, Elements E>
__global__ void __launch_bounds__(kThreads) gemv_residual_kernel(const KernelArgs args, int max_ksteps) {
  const GemvResidualParams& p = args.p;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  trace::stamp(trace::Kernel::gemv_residual, trace::Mark::start);
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  // This block's epilogue: its 1/C of the unit's rows, for every token.
  const int row_begin = split_point(kUnitRows, C, rank), rows = split_point(kUnitRows, C, rank + 1) - row_begin;
  const int items = p.tokens * rows;
  auto output_index = [&](int item) {
    return static_cast<size_t>(item / rows) * p.rows + unit * kUnitRows + row_begin + item % rows;
  };
  // bias + residual of each thread's first item. The residual is the kernel before's output, so
  // it is read after the upstream wait, but before the cluster barrier: in flight while the last
  // weights stream instead of a global round trip after it.
  auto addend = [&](int item) {
    const size_t index = output_index(item);
    const float bias = p.bias ? __bfloat162float(p.bias[index % p.rows]) : 0.0f;
    float residual = p.residual ? __bfloat162float(p.residual[index]) : 0.0f;
    const float pending = p.pending ? p.pending[index] : 0.0f;
    if (p.pending) {  // rounded as the producer's own finish would have stored it, then cleared
      residual = residual_sum(pending, residual);
      p.pending[index] = 0.0f;
    }
    return bias + residual;
  };
  // Row r of the unit is finished by the block whose slice holds it.
  auto home_of = [](int row) {
    const int owner = split_owner(kUnitRows, C, row);
    return cluster_gemv::RowHome{owner, row - split_point(kUnitRows, C, owner)};
  };
  const cluster_gemv::Inputs inputs{p.x,     p.norm_weight, p.norm_eps, p.weights,          p.tokens,
                                    p.inner, nullptr,       p.scales,   args.scale_block};
  float first_addend = 0.0f;
  const auto partials = cluster_gemv::stream_unit<NT, kUnitRows, C, kStages, E>(
      inputs, unit, rank, shared_raw, max_ksteps, home_of,
      [&] { first_addend = threadIdx.x < items ? addend(threadIdx.x) : 0.0f; });

  for (int item = threadIdx.x; item < items; item += kThreads) {
    const float value = partials.sum(item % rows, item / rows) * partials.inverse_rms[item / rows] +
                        (item == static_cast<int>(threadIdx.x) ? first_addend : addend(item));
    p.y[output_index(item)] = __float2bfloat16(value);
  }
  trace::stamp(trace::Kernel::unknown, trace::Mark::end);
}

template <int kUnitRows, Elements E>
cudaError_t launch_for_unit(const GemvResidualParams& p, cudaStream_t stream) {
  const KernelArgs args{p, format_info(p.format).scale_block};
  const int units = p.rows / kUnitRows;
  return cluster_gemv::dispatch(p.tokens, p.inner, units, [&](auto nt, auto c, bool spread, int sms) {
    constexpr int NT = decltype(nt)::value, C = decltype(c)::value;
    constexpr int kStages = cluster_gemv::ring_stages<NT, C>();
    // Two more ring stages where the packed cluster grid holds at most two blocks per SM and a
    // warp streams more k-steps than the default ring primes (Llama-3-8B's o_proj): the blocks
    // start while the attention before them finishes and have more of their weights in flight by
    // their upstream wait. No more than two: more measured slower, for a reason not established
    // (docs/kernels/qkv_rope_fused.md, "Two more ring stages for o_proj when its grid holds at most
    // two blocks per SM", re-measured at the end of "A deeper ring for the fused QKV kernel's spread
    // grids").
    constexpr int kDeepStages = kStages + 2;
    constexpr int kWarpsPerTile = cluster_gemv::kWarps / (kUnitRows / 16);
    const int warp_ksteps = cluster_gemv::max_ksteps_per_share<C * kWarpsPerTile, E>(p.inner);
    if constexpr (NT == 1 && C > 1)  // measured on the H200 only
      if (!spread && units * C <= 2 * sms && warp_ksteps >= kStages)
        return cluster_gemv::launch<NT, kUnitRows, C, kDeepStages, E>(
            gemv_residual_kernel<NT, kUnitRows, C, kDeepStages, E>, args, units, p.inner, stream, spread);
    return cluster_gemv::launch<NT, kUnitRows, C, kStages, E>(gemv_residual_kernel<NT, kUnitRows, C, kStages, E>, args,
                                                              units, p.inner, stream, spread);
  }, cluster_gemv::kColumns<E>);
}

template <Elements E>
cudaError_t launch_for_format(const GemvResidualParams& p, cudaStream_t stream) {
  // 128-row units (one tile per warp) when that still gives ~2 clusters of 8 per SM-pair on a
  // large GPU; 64-row units otherwise, so small projections still spread over every SM.
  if (p.rows % 128 == 0 && p.rows >= 4096) return launch_for_unit<128, E>(p, stream);
  return launch_for_unit<64, E>(p, stream);
}

}  // namespace

cudaError_t launch_gemv_residual(const GemvResidualParams& p, cudaStream_t stream) {
  if (!p.x || !p.weights || !p.y || !gemv_residual_unsupported(p.tokens, p.rows, p.inner, p.format).empty() ||
      static_cast<const void*>(p.x) == p.y || (p.pending && !p.residual) ||
      (format_info(p.format).scales != ScaleGranularity::none) != (p.scales != nullptr))
    return cudaErrorInvalidValue;
  trace::attach_unit();
  if (p.format == WeightFormat::bf16) return launch_for_format<Elements::bf16>(p, stream);
  return launch_for_format<Elements::e4m3>(p, stream);
}

}  // namespace deepfuse::kernels
