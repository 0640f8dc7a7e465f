// Row-major bf16 GEMM through cuBLASLt: Y[M,N] = X[M,K] · W[N,K]^T (+ bias[N]) (+ C[M,N]), fp32
// accumulate. The prefill GEMMs, the engine's attention projections, the lm_head (fp32 logits) and
// the unfused baselines use it. Algorithms are chosen by cuBLASLt's heuristic once per
// (M, N, K, epilogue, output type) and cached, unless tune() timed the candidates for that shape;
// the workspace is allocated once, so every run after the first of its shape is graph-capturable
// (the first only adds a host-side plan).
//
// FP8 (run_fp8): the same row-major product on FP8 tensor cores, X and W as e4m3 bytes each with
// one fp32 scale per row (per token for X, dynamic: kernels::quantize_rows_fp8; per output channel
// for W, the checkpoint's), applied by cuBLASLt's outer-vector scale modes (cuBLAS 12.9+, sm_90):
// y[t, o] = (sum_i x[t, i] w[o, i]) * x_scale[t] * w_scale[o] (+ bias[o]) (+ addend[t, o]).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "deepfuse/gemm_tuning.hpp"
#include "deepfuse/tensor.hpp"

namespace deepfuse::kernels {

// A row-major e4m3 operand of run_fp8: [rows, k] bytes and one fp32 scale per row.
struct Fp8Rows {
  const uint8_t* data = nullptr;
  const float* scales = nullptr;
};

// How run_fp8 applies the two scales: cuBLASLt's outer-vector scale modes where its heuristic has
// an algorithm for the shape (automatic), else, or always with epilogue_kernel (tests), an fp32
// product with unit scales and launch_fp8_scale_epilogue after it (one more launch and an fp32
// round trip of the output).
enum class Fp8Scaling { automatic, epilogue_kernel };

// The fallback's epilogue: y[t, o] = accumulator[t, o] * x_scales[t] * w_scales[o] (+ bias[o])
// (+ addend[t, o]), rounded once to bf16; addend may alias y, bias and addend may be null.
struct Fp8ScaleEpilogueParams {
  const float* accumulator = nullptr;  // [m, n]
  const float* x_scales = nullptr;     // [m]
  const float* w_scales = nullptr;     // [n]
  const __nv_bfloat16* bias = nullptr;
  const __nv_bfloat16* addend = nullptr;
  __nv_bfloat16* y = nullptr;
  int m = 0, n = 0;
};
cudaError_t launch_fp8_scale_epilogue(const Fp8ScaleEpilogueParams& params, cudaStream_t stream);

// Why run_fp8 cannot run a GEMM of n outputs over k inputs on a GPU of compute capability
// major.minor ("" when it can): FP8 tensor cores (sm_89+; the outer-vector scales are sm_90's),
// and cuBLASLt's FP8 alignment (16-byte rows of e4m3 and of the bf16 output).
std::string fp8_gemm_unsupported(int n, int k, int major, int minor);

class CublasLtGemm {
 public:
  explicit CublasLtGemm(Fp8Scaling fp8_scaling = Fp8Scaling::automatic);
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

  // FP8 tensor cores: y = (x·w^T) * x.scales[t] * w.scales[o] + bias + addend (bias and addend as
  // in run_with_bias), the scales as Fp8Scaling says. Throws deepfuse::Error, naming the shape,
  // when cuBLASLt has no FP8 algorithm for it at all (check fp8_gemm_unsupported first).
  void run_fp8(Fp8Rows x, Fp8Rows w, const __nv_bfloat16* bias, const __nv_bfloat16* addend, __nv_bfloat16* y, int m,
               int n, int k, cudaStream_t stream);

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
    bool fp8 = false;  // e4m3 operands with per-row scales (run_fp8)
    auto key() const { return std::make_tuple(m, n, k, with_addend, with_bias, fp32_out, fp8); }
  };
  // A call's pointers: x and w bf16, or e4m3 with their scales (fp8 shapes).
  struct Pointers {
    const void* x = nullptr;
    const void* w = nullptr;
    const float* x_scales = nullptr;
    const float* w_scales = nullptr;
    const __nv_bfloat16* bias = nullptr;
    const void* addend = nullptr;
    void* y = nullptr;
  };
  struct Plan {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t w_layout = nullptr, x_layout = nullptr, y_layout = nullptr;
    cublasLtMatmulAlgo_t algorithm{};
    // fp8 shapes whose scales launch_fp8_scale_epilogue applies: cuBLASLt writes the unscaled
    // fp32 product to fp8_accumulator_ (no bias, no addend in its epilogue).
    bool scale_epilogue_kernel = false;
  };
  static Shape shape_of(const Operands& o) {
    return {o.m, o.n, o.k, o.addend != nullptr, o.bias != nullptr, o.fp32_out, false};
  }
  Plan& plan_for(const Shape& shape);
  // The operation, layouts and heuristic's algorithm of `plan` for `shape`; false when cuBLASLt
  // has none (fp8 only: the caller tries the epilogue-kernel form next).
  bool make_plan(const Shape& shape, bool scale_epilogue_kernel, Plan& plan);
  static void destroy(Plan& plan);
  std::vector<cublasLtMatmulAlgo_t> candidates_for(const Plan& plan);
  cublasStatus_t launch(const Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& shape,
                        const Pointers& p, cudaStream_t stream);
  void matmul(const Shape& shape, const Pointers& p, cudaStream_t stream);
  // Microseconds per call of `algorithm` in a graph of calls rotating over `weights`; < 0 when
  // cuBLASLt refuses the algorithm for these operands.
  double time_algorithm(Plan& plan, const cublasLtMatmulAlgo_t& algorithm, const Shape& shape,
                        const Operands& operands, std::span<const __nv_bfloat16* const> weights,
                        cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  Fp8Scaling fp8_scaling_;
  // The epilogue-kernel plans' fp32 products, as large as the largest such plan's (grown when a
  // plan is made, outside any capture); a captured graph keeps the address it saw, so a buffer
  // outgrown stays allocated in retired_accumulators_.
  DeviceBuffer fp8_accumulator_;
  std::vector<DeviceBuffer> retired_accumulators_;
  std::map<std::tuple<int, int, int, bool, bool, bool, bool>, Plan> plans_;
};

}  // namespace deepfuse::kernels
