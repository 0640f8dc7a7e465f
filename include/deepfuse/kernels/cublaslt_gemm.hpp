// Row-major bf16 GEMM through cuBLASLt: Y[M,N] = X[M,K] · W[N,K]^T (+ bias[N]) (+ C[M,N]), fp32
// accumulate. The prefill GEMMs, the engine's attention projections, the lm_head (fp32 logits) and
// the unfused baselines use it. Algorithms are chosen by cuBLASLt's heuristic once per
// (M, N, K, epilogue, output type) and cached, unless tune() timed the candidates for that shape;
// the workspace is allocated once, so every run after the first of its shape is graph-capturable
// (the first only adds a host-side plan).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "deepfuse/gemm_tuning.hpp"
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

  // One call's operands, for tune(): the weights come separately.
  struct Operands {
    int m = 0, n = 0, k = 0;
    const __nv_bfloat16* x = nullptr;     // [m, k]
    const __nv_bfloat16* bias = nullptr;  // [n] or null
    const void* addend = nullptr;         // [m, n] or null; may alias y
    void* y = nullptr;                    // [m, n], bf16, or fp32 with fp32_out
    bool fp32_out = false;
  };
  // Times cuBLASLt's suggested algorithms for the operands' shape and keeps the fastest for every
  // later call of that shape (the heuristic's first choice unless another is at least 1% faster).
  // Each candidate runs as a CUDA graph of calls rotating over `weights` ([n, k] each; pass every
  // layer's, so each call finds its weights in HBM as a decode step does). Writes y: pass scratch
  // operands. Synchronises the stream, which must not be the legacy default stream (graphs are
  // captured on it) nor being captured. `op` names the GEMM in the returned report.
  GemmTuning tune(std::string op, const Operands& operands, std::span<const __nv_bfloat16* const> weights,
                  cudaStream_t stream);

  // The algorithms tune() times for the operands' shape (cuBLASLt's suggestions, then the split
  // ones unsplit), and one of them made the shape's algorithm: for tests that run them all.
  int candidate_count(const Operands& operands);
  void use_candidate(const Operands& operands, int index);

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
  };
  static Shape shape_of(const Operands& o) {
    return {o.m, o.n, o.k, o.addend != nullptr, o.bias != nullptr, o.fp32_out};
  }
  Plan& plan_for(const Shape& shape);
  std::vector<cublasLtMatmulAlgo_t> candidates_for(const Plan& plan);
  cublasStatus_t launch(const Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& shape,
                        const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                        const void* addend, void* y, cudaStream_t stream);
  void matmul(const Shape& shape, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
              const void* addend, void* y, cudaStream_t stream);
  // Microseconds per call of `algorithm` in a graph of calls rotating over `weights`; < 0 when
  // cuBLASLt refuses the algorithm for these operands.
  double time_algorithm(Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& shape,
                        const Operands& operands, std::span<const __nv_bfloat16* const> weights,
                        cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<std::tuple<int, int, int, bool, bool, bool>, Plan> plans_;
};

}  // namespace deepfuse::kernels
