// Output projection + residual for decode: the cluster GEMV weight stream (cluster_gemv.cuh)
// over units of 64 or 128 output rows, each cluster of 8 blocks splitting the inner dimension;
// every block of a cluster then finishes its 1/8 of the unit's rows: sum of the partials, bias,
// residual, bf16. Bytes: rows x inner x 2 of weights (32 MB for Llama-3-8B's o_proj, 7.6 µs at
// 4.2 TB/s); the cuBLASLt path it replaces runs a split-K GEMM plus a reduction kernel.
#include "kernels/gemv/gemv_residual.cuh"

#include "kernels/gemv/cluster_gemv.cuh"

namespace deepfuse::kernels {
namespace {

using cluster_gemv::kThreads;

template <int NT, int kUnitRows, int C>
__global__ void __launch_bounds__(kThreads) gemv_residual_kernel(const GemvResidualParams p, int max_ksteps) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  const int unit = blockIdx.x / C, rank = blockIdx.x % C;
  const cluster_gemv::Inputs inputs{p.x, nullptr, 0.0f, p.weights, p.tokens, p.inner};
  const auto partials = cluster_gemv::stream_unit<NT, kUnitRows, C>(inputs, unit, rank, shared_raw, max_ksteps);

  const int row_begin = split_point(kUnitRows, C, rank), rows = split_point(kUnitRows, C, rank + 1) - row_begin;
  for (int item = threadIdx.x; item < p.tokens * rows; item += kThreads) {
    const int token = item / rows, local = row_begin + item % rows;
    const int row = unit * kUnitRows + local;
    float value = partials.sum(local, token);
    if (p.bias) value += __bfloat162float(p.bias[row]);
    const size_t index = static_cast<size_t>(token) * p.rows + row;
    if (p.residual) value += __bfloat162float(p.residual[index]);
    p.y[index] = __float2bfloat16(value);
  }
  cluster_barrier<C>();  // no block leaves while another still reads its partial sums
}

template <int kUnitRows>
cudaError_t launch_for_unit(const GemvResidualParams& p, cudaStream_t stream) {
  return cluster_gemv::dispatch(p.tokens, p.inner, [&](auto nt, auto c) {
    constexpr int NT = decltype(nt)::value, C = decltype(c)::value;
    return cluster_gemv::launch<NT, kUnitRows, C>(gemv_residual_kernel<NT, kUnitRows, C>, p, p.rows / kUnitRows,
                                                  p.inner, stream);
  });
}

}  // namespace

cudaError_t launch_gemv_residual(const GemvResidualParams& p, cudaStream_t stream) {
  if (!p.x || !p.weights || !p.y || p.tokens < 1 || p.tokens > kGemvResidualMaxTokens || p.rows < 64 ||
      p.rows % 64 != 0 || p.inner < 64 || p.inner % 64 != 0 || static_cast<const void*>(p.x) == p.y)
    return cudaErrorInvalidValue;
  // 128-row units (one tile per warp) when that still gives ~2 clusters of 8 per SM-pair on a
  // large GPU; 64-row units otherwise, so small projections still spread over every SM.
  if (p.rows % 128 == 0 && p.rows >= 4096) return launch_for_unit<128>(p, stream);
  return launch_for_unit<64>(p, stream);
}

}  // namespace deepfuse::kernels
