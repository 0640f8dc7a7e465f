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

// FP8 operands' rows must start on 16 bytes: k e4m3 bytes per row of x and w, n bf16 per row of y
// (cuBLASLt's FP8 alignment rule).
constexpr int kFp8RowAlignBytes = 16;

void check_sizes(int m, int n, int k) {
  DF_CHECK(m >= 1 && n >= 1 && k >= 1, "GEMM sizes must be positive (M=" + std::to_string(m) +
                                           " N=" + std::to_string(n) + " K=" + std::to_string(k) + ")");
}
}  // namespace

std::string fp8_gemm_unsupported(int n, int k, int major, int minor) {
  // Outer-vector (per-row) scales: cuBLASLt runs them on sm_90 and later only.
  if (major < 9)
    return "the FP8 cuBLASLt GEMM needs sm_90 or later (per-row scales on FP8 tensor cores), not sm_" +
           std::to_string(major) + std::to_string(minor);
  if (n < 1 || k < 1 || k % kFp8RowAlignBytes != 0 || (n * 2) % kFp8RowAlignBytes != 0)
    return "the FP8 cuBLASLt GEMM needs K a multiple of 16 and N of 8 (16-byte rows), not N=" + std::to_string(n) +
           " K=" + std::to_string(k);
  return "";
}

CublasLtGemm::CublasLtGemm(Fp8Scaling fp8_scaling) : workspace_(kWorkspaceBytes), fp8_scaling_(fp8_scaling) {
  DF_CHECK_CUBLAS(cublasLtCreate(&handle_));
}

void CublasLtGemm::destroy(Plan& plan) {
  if (plan.operation) cublasLtMatmulDescDestroy(plan.operation);
  if (plan.w_layout) cublasLtMatrixLayoutDestroy(plan.w_layout);
  if (plan.x_layout) cublasLtMatrixLayoutDestroy(plan.x_layout);
  if (plan.y_layout) cublasLtMatrixLayoutDestroy(plan.y_layout);
  plan = Plan{};
}

CublasLtGemm::~CublasLtGemm() {
  for (auto& [key, plan] : plans_) destroy(plan);
  if (handle_) cublasLtDestroy(handle_);
}

// Row-major Y[M,N] = X[M,K]·W[N,K]^T is column-major Y^T[N,M] = W^T... i.e. with cuBLAS's
// column-major view: A = W (K x N, ld K) transposed, B = X (K x M, ld K), D = Y (N x M, ld N).
// D's rows are Y's columns, so cuBLASLt's bias (one value per row of D) is one value per output
// feature, broadcast over the tokens: exactly a Linear layer's bias. FP8 needs exactly this "TN"
// form (A transposed, B not).
bool CublasLtGemm::make_plan(const Shape& s, bool scale_epilogue_kernel, Plan& plan) {
  plan.scale_epilogue_kernel = scale_epilogue_kernel;
  const bool outer_vector_scales = s.fp8 && !scale_epilogue_kernel;  // cuBLASLt applies the FP8 scales
  DF_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  if (s.with_bias && !scale_epilogue_kernel) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof bias_type));
  }
  if (outer_vector_scales) {
    // A = W gives the rows of D (output channels), B = X its columns (tokens): W's scales are A's
    // outer vector, X's per-token scales B's.
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof outer));
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof outer));
  }
  const cudaDataType_t operand_type = s.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const bool fp32_out = s.fp32_out || scale_epilogue_kernel;
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.w_layout, operand_type, s.k, s.n, s.k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.x_layout, operand_type, s.k, s.m, s.k));
  DF_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.y_layout, fp32_out ? CUDA_R_32F : CUDA_R_16BF, s.n, s.m, s.n));

  cublasLtMatmulPreference_t preference;
  DF_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = workspace_.bytes();
  DF_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan.operation, plan.w_layout, plan.x_layout, plan.y_layout, plan.y_layout, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  // An unsupported combination may answer "not supported" rather than zero algorithms; the
  // outer-vector scale modes on the H200's cuBLASLt 13.0 answer "invalid value" (seen there).
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (outer_vector_scales && status == CUBLAS_STATUS_INVALID_VALUE)) found = 0;
  else DF_CHECK_CUBLAS(status);
  plan.algorithm = result.algo;
  return found > 0;
}

CublasLtGemm::Plan& CublasLtGemm::plan_for(const Shape& s) {
  if (auto it = plans_.find(s.key()); it != plans_.end()) return it->second;
  Plan plan;
  bool found = make_plan(s, s.fp8 && fp8_scaling_ == Fp8Scaling::epilogue_kernel, plan);
  if (!found && s.fp8 && !plan.scale_epilogue_kernel) {
    // No outer-vector scales for this shape in this cuBLASLt: unit scales, then our epilogue.
    destroy(plan);
    found = make_plan(s, true, plan);
  }
  if (!found) {
    destroy(plan);
    throw Error(std::string("cuBLASLt found no algorithm for ") + (s.fp8 ? "an FP8 GEMM" : "a bf16 GEMM") + " of " +
                describe(s.m, s.n, s.k, s.with_bias, s.fp32_out));
  }
  if (plan.scale_epilogue_kernel) {
    const size_t bytes = static_cast<size_t>(s.m) * s.n * sizeof(float);
    if (fp8_accumulator_.bytes() < bytes) {
      if (!fp8_accumulator_.empty()) retired_accumulators_.push_back(std::move(fp8_accumulator_));
      fp8_accumulator_ = DeviceBuffer(bytes);
    }
  }
  return plans_.emplace(s.key(), plan).first->second;
}

cublasStatus_t CublasLtGemm::launch(const Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& s,
                                    const Pointers& p, cudaStream_t stream) {
  // The bias and scale pointers live in the (shared, per-shape) descriptor: set them for this
  // call. A graph capture records the values current at the call, so layers sharing a shape stay
  // distinct.
  if (s.with_bias && !plan.scale_epilogue_kernel)
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                                   sizeof p.bias));
  if (s.fp8 && !plan.scale_epilogue_kernel) {
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.w_scales,
                                                   sizeof p.w_scales));
    DF_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.x_scales,
                                                   sizeof p.x_scales));
  }
  const float alpha = 1.0f;
  if (plan.scale_epilogue_kernel) {
    const float beta = 0.0f;
    auto* accumulator = fp8_accumulator_.as<float>();
    const cublasStatus_t status =
        cublasLtMatmul(handle_, plan.operation, &alpha, p.w, plan.w_layout, p.x, plan.x_layout, &beta, accumulator,
                       plan.y_layout, accumulator, plan.y_layout, &algorithm, workspace_.data(), workspace_.bytes(), stream);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    Fp8ScaleEpilogueParams e;
    e.accumulator = accumulator;
    e.x_scales = p.x_scales;
    e.w_scales = p.w_scales;
    e.bias = p.bias;
    e.addend = static_cast<const __nv_bfloat16*>(p.addend);
    e.y = static_cast<__nv_bfloat16*>(p.y);
    e.m = s.m;
    e.n = s.n;
    DF_CHECK_CUDA(launch_fp8_scale_epilogue(e, stream));
    return CUBLAS_STATUS_SUCCESS;
  }
  const float beta = p.addend ? 1.0f : 0.0f;
  return cublasLtMatmul(handle_, plan.operation, &alpha, p.w, plan.w_layout, p.x, plan.x_layout, &beta,
                        p.addend ? p.addend : p.y, plan.y_layout, p.y, plan.y_layout, &algorithm, workspace_.data(),
                        workspace_.bytes(), stream);
}

void CublasLtGemm::matmul(const Shape& s, const Pointers& p, cudaStream_t stream) {
  check_sizes(s.m, s.n, s.k);
  DF_CHECK(p.x && p.w && p.y, "GEMM input, weight or output pointer is null");
  DF_CHECK(!s.fp8 || (p.x_scales && p.w_scales), "FP8 GEMM scale pointer is null");
  const Plan& plan = plan_for(s);
  DF_CHECK_CUBLAS(launch(plan, plan.algorithm, s, p, stream));
}

double CublasLtGemm::time_algorithm(Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& s,
                                    const Operands& o, std::span<const __nv_bfloat16* const> weights,
                                    cudaStream_t stream) {
  auto call = [&](int i) {
    Pointers p;
    p.x = o.x;
    p.w = weights[i % weights.size()];
    p.bias = o.bias;
    p.addend = o.addend;
    p.y = o.y;
    return launch(plan, algorithm, s, p, stream);
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
  matmul({m, n, k, addend != nullptr, false, false, false}, {x, w, nullptr, nullptr, nullptr, addend, y}, stream);
}

void CublasLtGemm::run_with_bias(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                 const __nv_bfloat16* addend, __nv_bfloat16* y, int m, int n, int k,
                                 cudaStream_t stream) {
  matmul({m, n, k, addend != nullptr, bias != nullptr, false, false}, {x, w, nullptr, nullptr, bias, addend, y},
         stream);
}

void CublasLtGemm::run_fp32_out(const __nv_bfloat16* x, const __nv_bfloat16* w, float* y, int m, int n, int k,
                                cudaStream_t stream) {
  matmul({m, n, k, false, false, true, false}, {x, w, nullptr, nullptr, nullptr, nullptr, y}, stream);
}

void CublasLtGemm::run_fp8(Fp8Rows x, Fp8Rows w, const __nv_bfloat16* bias, const __nv_bfloat16* addend,
                           __nv_bfloat16* y, int m, int n, int k, cudaStream_t stream) {
  DF_CHECK(k % kFp8RowAlignBytes == 0 && (n * 2) % kFp8RowAlignBytes == 0,
           "FP8 GEMM of " + describe(m, n, k, bias != nullptr, false) + ": K must be a multiple of 16 and N of 8");
  matmul({m, n, k, addend != nullptr, bias != nullptr, false, true},
         {x.data, w.data, x.scales, w.scales, bias, addend, y}, stream);
}

}  // namespace deepfuse::kernels
