#include "kernels/gemm/cublaslt_gemm.hpp"

#include "deepfuse/error.hpp"

namespace deepfuse::kernels {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
}

CublasLtGemm::CublasLtGemm() : workspace_(kWorkspaceBytes) { DF_CHECK_CUBLAS(cublasLtCreate(&handle_)); }

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatmulDescDestroy(plan.operation);
    cublasLtMatrixLayoutDestroy(plan.w_layout);
    cublasLtMatrixLayoutDestroy(plan.x_layout);
    cublasLtMatrixLayoutDestroy(plan.y_layout);
  }
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major Y[M,N] = X[M,K]·W[N,K]^T is column-major Y^T[N,M] = W^T... i.e. with cuBLAS's
// column-major view: A = W (K x N, ld K) transposed, B = X (K x M, ld K), D = Y (N x M, ld N).
const CublasLtGemm::Plan& CublasLtGemm::plan_for(int m, int n, int k, bool with_addend) {
  const auto key = std::make_tuple(m, n, k, with_addend);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan plan;
  DF_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.w_layout, CUDA_R_16BF, k, n, k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.x_layout, CUDA_R_16BF, k, m, k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.y_layout, CUDA_R_16BF, n, m, n));

  cublasLtMatmulPreference_t preference;
  DF_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = workspace_.bytes();
  DF_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  DF_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, plan.operation, plan.w_layout, plan.x_layout, plan.y_layout,
                                                 plan.y_layout, preference, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(preference);
  DF_CHECK(found > 0, "cuBLASLt found no algorithm for a bf16 GEMM of M=" + std::to_string(m) +
                          " N=" + std::to_string(n) + " K=" + std::to_string(k));
  plan.algorithm = result.algo;
  return plans_.emplace(key, plan).first->second;
}

void CublasLtGemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* addend,
                       __nv_bfloat16* y, int m, int n, int k, cudaStream_t stream) {
  const Plan& plan = plan_for(m, n, k, addend != nullptr);
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  DF_CHECK_CUBLAS(cublasLtMatmul(handle_, plan.operation, &alpha, w, plan.w_layout, x, plan.x_layout, &beta,
                                 addend ? addend : y, plan.y_layout, y, plan.y_layout, &plan.algorithm,
                                 workspace_.data(), workspace_.bytes(), stream));
}

}  // namespace deepfuse::kernels
