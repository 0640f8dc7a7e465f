#include "kernels/gemm/cublaslt_gemm.hpp"

#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse::kernels {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void check_sizes(int m, int n, int k) {
  DF_CHECK(m >= 1 && n >= 1 && k >= 1, "GEMM sizes must be positive (M=" + std::to_string(m) +
                                           " N=" + std::to_string(n) + " K=" + std::to_string(k) + ")");
}
}  // namespace

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
// D's rows are Y's columns, so cuBLASLt's bias (one value per row of D) is one value per output
// feature, broadcast over the tokens: exactly a Linear layer's bias.
const CublasLtGemm::Plan& CublasLtGemm::plan_for(const Shape& s) {
  if (auto it = plans_.find(s.key()); it != plans_.end()) return it->second;
  Plan plan;
  DF_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  if (s.with_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof bias_type));
  }
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.w_layout, CUDA_R_16BF, s.k, s.n, s.k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.x_layout, CUDA_R_16BF, s.k, s.m, s.k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.y_layout, s.fp32_out ? CUDA_R_32F : CUDA_R_16BF, s.n, s.m, s.n));

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
  DF_CHECK(found > 0, "cuBLASLt found no algorithm for a bf16 GEMM of M=" + std::to_string(s.m) +
                          " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                          (s.with_bias ? " with bias" : "") + (s.fp32_out ? " with fp32 output" : ""));
  plan.algorithm = result.algo;
  return plans_.emplace(s.key(), plan).first->second;
}

void CublasLtGemm::matmul(const Shape& s, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                          const void* addend, void* y, cudaStream_t stream) {
  check_sizes(s.m, s.n, s.k);
  DF_CHECK(x && w && y, "GEMM input, weight or output pointer is null");
  const Plan& plan = plan_for(s);
  // The bias pointer lives in the (shared, per-shape) descriptor: set it for this call. A graph
  // capture records the value current at the call, so layers sharing a shape stay distinct.
  if (s.with_bias)
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  DF_CHECK_CUBLAS(cublasLtMatmul(handle_, plan.operation, &alpha, w, plan.w_layout, x, plan.x_layout, &beta,
                                 addend ? addend : y, plan.y_layout, y, plan.y_layout, &plan.algorithm,
                                 workspace_.data(), workspace_.bytes(), stream));
}

void CublasLtGemm::run(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* addend,
                       __nv_bfloat16* y, int m, int n, int k, cudaStream_t stream) {
  matmul({m, n, k, addend != nullptr, false, false}, x, w, nullptr, addend, y, stream);
}

void CublasLtGemm::run_with_bias(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                 const __nv_bfloat16* addend, __nv_bfloat16* y, int m, int n, int k,
                                 cudaStream_t stream) {
  matmul({m, n, k, addend != nullptr, bias != nullptr, false}, x, w, bias, addend, y, stream);
}

void CublasLtGemm::run_fp32_out(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int m, int n, int k,
                                cudaStream_t stream) {
  matmul({m, n, k, false, false, true}, x, w, nullptr, nullptr, y, stream);
}

}  // namespace deepfuse::kernels
