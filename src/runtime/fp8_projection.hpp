// A projection on FP8 tensor cores (GemmChoice::fp8, MlpGemms::fp8; docs/kernels/fp8.md): the
// bf16 input rows quantized to e4m3 per token (kernels::quantize_rows_fp8) into this scratch, then
// cuBLASLt's e4m3 GEMM with the per-token and per-channel scales. The forward pass's cuBLASLt
// projections and the unfused MLP's two GEMMs each hold one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::runtime {

class E4m3Activations {
 public:
  E4m3Activations() = default;  // empty: no FP8 GEMM
  // Room for inputs of up to max_tokens x max_columns: e4m3 bytes and one fp32 scale per token.
  E4m3Activations(size_t max_tokens, size_t max_columns);

  bool empty() const { return bytes_.empty(); }
  // y = x·w^T (+ bias) (+ addend); x bf16 [tokens, w.columns], w fp8_e4m3 with per-channel
  // scales (`who` names the projection in errors).
  void project(kernels::CublasLtGemm& gemm, const __nv_bfloat16* x, const LinearWeight& w, const __nv_bfloat16* bias,
               const __nv_bfloat16* addend, __nv_bfloat16* y, int tokens, const char* who,
               cudaStream_t stream) const;

 private:
  DeviceBuffer bytes_, scales_;
};

}  // namespace deepfuse::runtime
