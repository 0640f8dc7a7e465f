// Row-major bf16 GEMM through cuBLASLt: Y[M,N] = X[M,K] · W[N,K]^T (+ C[M,N]), fp32 accumulate.
// The prefill GEMMs and the unfused baselines use it. Algorithms are chosen by cuBLASLt's
// heuristic once per (M, N, K, with-C) and cached; the workspace is allocated once, so run() is
// graph-capturable.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <tuple>

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

 private:
  struct Plan {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, y_layout = nullptr;
    cublasLtMatmulAlgo_t algorithm{};
  };
  const Plan& plan_for(int m, int n, int k, bool with_addend);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<std::tuple<int, int, int, bool>, Plan> plans_;
};

}  // namespace deepfuse::kernels
