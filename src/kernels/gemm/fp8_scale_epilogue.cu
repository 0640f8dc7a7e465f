// The FP8 GEMM's scales applied after cuBLASLt (kernels::launch_fp8_scale_epilogue): the fallback
// for a cuBLASLt without outer-vector scale modes for a shape (CublasLtGemm::run_fp8).
#include <algorithm>

#include "deepfuse/kernels/cublaslt_gemm.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;

// One thread per output element: y = acc * x_scale[t] * w_scale[o] (+ bias[o]) (+ addend[t, o]),
// rounded once to bf16. addend may alias y (each element read before it is written, by its own
// thread).
__global__ void __launch_bounds__(kThreads) fp8_scale_epilogue_kernel(Fp8ScaleEpilogueParams p) {
  const size_t count = static_cast<size_t>(p.m) * p.n;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * kThreads) {
    const int t = static_cast<int>(i / p.n), o = static_cast<int>(i % p.n);
    float v = p.accumulator[i] * p.x_scales[t] * p.w_scales[o];
    if (p.bias) v += __bfloat162float(p.bias[o]);
    if (p.addend) v += __bfloat162float(p.addend[i]);
    p.y[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

cudaError_t launch_fp8_scale_epilogue(const Fp8ScaleEpilogueParams& p, cudaStream_t stream) {
  if (!p.accumulator || !p.x_scales || !p.w_scales || !p.y || p.m < 1 || p.n < 1) return cudaErrorInvalidValue;
  const size_t count = static_cast<size_t>(p.m) * p.n;
  const int blocks = static_cast<int>(std::min<size_t>((count + kThreads - 1) / kThreads, 65535 * 8));
  fp8_scale_epilogue_kernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
