#include "deepfuse/kernels/cublaslt_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/graph_timing.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::kernels {

namespace {
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// tune(): cuBLASLt's heuristic suggests 8 algorithms for the decode shapes on the H200 (tune() adds
// the split ones unsplit); a timed choice must beat its first by 1% to replace it, so timing noise
// does not flip choices.
constexpr int kTuneCandidates = 8;
constexpr double kTuneMinGain = 0.01;

int split_k_of(const cublasLtMatmulAlgo_t& algorithm) {
  int32_t splits = 1;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algorithm, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                           &written) != CUBLAS_STATUS_SUCCESS)
    return 0;
  return splits;
}

// The heuristic's suggestions without split-K, where they split and cuBLASLt accepts the unsplit
// algorithm for this operation (cublasLtMatmulAlgoCheck). For the decode step's skinny GEMMs (a
// few tokens, N of a few thousand) it suggests splitting K with a separate reduction kernel; the
// same algorithms unsplit stream o_proj at 16-32 tokens faster. Other split factors gained nothing
// the step could tell from noise (docs/runtime.md, "cuBLASLt algorithms timed as the step runs
// them", "Unsplit suggestions").
std::vector<cublasLtMatmulAlgo_t> unsplit_variants(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                                   cublasLtMatrixLayout_t w, cublasLtMatrixLayout_t x,
                                                   cublasLtMatrixLayout_t y,
                                                   const std::vector<cublasLtMatmulAlgo_t>& suggested) {
  std::vector<cublasLtMatmulAlgo_t> variants;
  auto known = [&](const cublasLtMatmulAlgo_t& a) {
    auto same = [&](const cublasLtMatmulAlgo_t& b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    return std::any_of(suggested.begin(), suggested.end(), same) || std::any_of(variants.begin(), variants.end(), same);
  };
  for (const cublasLtMatmulAlgo_t& algorithm : suggested) {
    if (split_k_of(algorithm) <= 1) continue;
    cublasLtMatmulAlgo_t variant = algorithm;
    const int32_t one = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoConfigSetAttribute(&variant, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&variant, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(handle, operation, w, x, y, y, &variant, &check) != CUBLAS_STATUS_SUCCESS ||
        known(variant))
      continue;
    variants.push_back(variant);
  }
  return variants;
}

std::string describe(int m, int n, int k, bool with_bias, bool fp32_out) {
  return "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
         (with_bias ? " with bias" : "") + (fp32_out ? " with fp32 output" : "");
}

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
CublasLtGemm::Plan& CublasLtGemm::plan_for(const Shape& s) {
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
  DF_CHECK(found > 0,
           "cuBLASLt found no algorithm for a bf16 GEMM of " + describe(s.m, s.n, s.k, s.with_bias, s.fp32_out));
  plan.algorithm = result.algo;
  return plans_.emplace(s.key(), plan).first->second;
}

cublasStatus_t CublasLtGemm::launch(const Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& s,
                                    const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                    const void* addend, void* y, cudaStream_t stream) {
  // The bias pointer lives in the (shared, per-shape) descriptor: set it for this call. A graph
  // capture records the value current at the call, so layers sharing a shape stay distinct.
  if (s.with_bias)
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.0f, beta = addend ? 1.0f : 0.0f;
  return cublasLtMatmul(handle_, plan.operation, &alpha, w, plan.w_layout, x, plan.x_layout, &beta,
                        addend ? addend : y, plan.y_layout, y, plan.y_layout, &algorithm, workspace_.data(),
                        workspace_.bytes(), stream);
}

void CublasLtGemm::matmul(const Shape& s, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                          const void* addend, void* y, cudaStream_t stream) {
  check_sizes(s.m, s.n, s.k);
  DF_CHECK(x && w && y, "GEMM input, weight or output pointer is null");
  const Plan& plan = plan_for(s);
  DF_CHECK_CUBLAS(launch(plan, plan.algorithm, s, x, w, bias, addend, y, stream));
}

double CublasLtGemm::time_algorithm(Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& s,
                                    const Operands& o, std::span<const __nv_bfloat16* const> weights,
                                    cudaStream_t stream) {
  auto call = [&](int i) {
    return launch(plan, algorithm, s, o.x, weights[i % weights.size()], o.bias, o.addend, o.y, stream);
  };
  // An eager call first: cuBLASLt may refuse a suggested algorithm for these pointers.
  if (call(0) != CUBLAS_STATUS_SUCCESS) return -1.0;
  DF_CHECK_CUDA(cudaGetLastError());
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  // Enough calls that the graph's own launch is small next to them.
  const int calls = std::clamp(static_cast<int>(weights.size()), 8, 32);
  const GraphExec graph = capture_graph(stream, [&] {
    for (int i = 0; i < calls; ++i)
      if (call(i) != CUBLAS_STATUS_SUCCESS) return false;
    return true;
  });
  return graph ? median_replay_us_per_call(graph, calls, 3, stream) : -1.0;
}

std::vector<cublasLtMatmulAlgo_t> CublasLtGemm::candidates_for(const Plan& plan) {
  cublasLtMatmulPreference_t preference;
  DF_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = workspace_.bytes();
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof workspace_bytes);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.operation, plan.w_layout, plan.x_layout, plan.y_layout,
                                            plan.y_layout, preference, kTuneCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  DF_CHECK_CUBLAS(status);
  std::vector<cublasLtMatmulAlgo_t> suggested;
  for (int i = 0; i < found; ++i) suggested.push_back(results[i].algo);
  std::vector<cublasLtMatmulAlgo_t> candidates = suggested;
  for (const cublasLtMatmulAlgo_t& variant :
       unsplit_variants(handle_, plan.operation, plan.w_layout, plan.x_layout, plan.y_layout, suggested))
    candidates.push_back(variant);
  return candidates;
}

GemmTuning CublasLtGemm::tune(std::string op, const Operands& o, std::span<const __nv_bfloat16* const> weights,
                              cudaStream_t stream) {
  check_sizes(o.m, o.n, o.k);
  DF_CHECK(o.x && o.y && !weights.empty(), "GEMM tuning needs an input, an output and at least one weight matrix");
  for (const __nv_bfloat16* w : weights) DF_CHECK(w, "GEMM tuning weight pointer is null");
  DF_CHECK(stream != nullptr, "GEMM tuning captures CUDA graphs: give it a stream other than the legacy default");
  const Shape s = shape_of(o);
  Plan& plan = plan_for(s);
  const std::vector<cublasLtMatmulAlgo_t> candidates = candidates_for(plan);
  const int count = static_cast<int>(candidates.size());

  // Two rounds, each candidate keeping its faster time: tuning often starts on a GPU left idle
  // while the engine packed its weights, whose clocks take ~100 ms of work to come up, so the
  // first candidates timed (the heuristic's own choice first) would read slow
  // (docs/kernels/swiglu_fused.md, "`bench mlp` timing").
  std::vector<double> us(count, -1.0);
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < count; ++i) {
      if (round > 0 && us[i] < 0.0) continue;  // refused in the first round
      const double t = time_algorithm(plan, candidates[i], s, o, weights, stream);
      if (t >= 0.0 && (us[i] < 0.0 || t < us[i])) us[i] = t;
    }
  GemmTuning report{std::move(op), o.m, o.n, o.k};
  report.heuristic_us = us.empty() ? -1.0 : us[0];  // candidates[0] is plan_for's choice, if it runs
  int best = -1;
  for (int i = 0; i < count; ++i) {
    if (us[i] < 0.0) continue;
    ++report.candidates;
    if (report.heuristic_us >= 0.0 && us[i] >= report.heuristic_us * (1.0 - kTuneMinGain)) continue;
    if (best < 0 || us[i] < us[best]) best = i;
  }
  DF_CHECK(report.candidates > 0, "cuBLASLt ran none of its suggested algorithms for a bf16 GEMM of " +
                                      describe(s.m, s.n, s.k, s.with_bias, s.fp32_out));
  report.chosen_us = report.heuristic_us;
  if (best >= 0) {
    plan.algorithm = candidates[best];
    report.chosen = best;
    report.chosen_us = us[best];
  }
  report.chosen_splits = split_k_of(plan.algorithm);
  return report;
}

int CublasLtGemm::candidate_count(const Operands& o) {
  check_sizes(o.m, o.n, o.k);
  return static_cast<int>(candidates_for(plan_for(shape_of(o))).size());
}

void CublasLtGemm::use_candidate(const Operands& o, int index) {
  check_sizes(o.m, o.n, o.k);
  Plan& plan = plan_for(shape_of(o));
  const std::vector<cublasLtMatmulAlgo_t> candidates = candidates_for(plan);
  DF_CHECK(index >= 0 && index < static_cast<int>(candidates.size()),
           "GEMM candidate " + std::to_string(index) + " of " + std::to_string(candidates.size()));
  plan.algorithm = candidates[index];
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
