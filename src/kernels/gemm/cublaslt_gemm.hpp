// Row-major bf16 GEMM through cuBLASLt: Y[M,N] = X[M,K] · W[N,K]^T (+ bias[N]) (+ C[M,N]), fp32
// accumulate. The prefill GEMMs, the engine's attention projections, the lm_head (fp32 logits) and
// the unfused baselines use it. An algorithm is chosen once per (M, N, K, epilogue, output type)
// and cached: up to 64 rows, the fastest of cuBLASLt's first kTunedCandidates heuristic answers,
// timed on the first call's own operands (into a scratch output) unless the stream is capturing
// or DEEPFUSE_GEMM_AUTOTUNE=0; otherwise the heuristic's first. The workspace is allocated once,
// so every run after the first of its shape is graph-capturable.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <tuple>
#include <vector>

#include "deepfuse/tensor.hpp"

namespace deepfuse::kernels {

class CublasLtGemm {
 public:
  CublasLtGemm();
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // y = x·w^T + addend (addend may be null, or alias y for an in-place residual add).
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* addend, __nv_bfloat16* y, int m,
           int n, int k, cudaStream_t stream);

  // y = x·w^T + bias + addend, bias [n] broadcast over the m rows in cuBLASLt's epilogue (no
  // extra launch); bias may be null (then this is run()), addend as in run().
  void run_with_bias(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                     const __nv_bfloat16* addend, __nv_bfloat16* y, int m, int n, int k, cudaStream_t stream);

  // y = x·w^T with fp32 output (logits: no rounding of the scores to bf16 before sampling).
  void run_fp32_out(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int m, int n, int k,
                    cudaStream_t stream);

 private:
  struct Shape {
    int m = 0, n = 0, k = 0;
    bool with_addend = false;
    bool with_bias = false;
    bool fp32_out = false;
    auto key() const { return std::make_tuple(m, n, k, with_addend, with_bias, fp32_out); }
  };
  struct Plan {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, y_layout = nullptr;
    cublasLtMatmulAlgo_t algorithm{};
    std::vector<cublasLtMatmulAlgo_t> candidates;  // still to be timed; empty once chosen
  };
  Plan& plan_for(const Shape& shape);
  // Times plan.candidates on this call's operands (output into a scratch buffer) and keeps the
  // fastest as plan.algorithm.
  void choose_fastest(const Shape& shape, Plan& plan, const __nv_bfloat16* x, const __nv_bfloat16* w,
                      cudaStream_t stream);
  void matmul(const Shape& shape, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
              const void* addend, void* y, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<std::tuple<int, int, int, bool, bool, bool>, Plan> plans_;
};

}  // namespace deepfuse::kernels
