#include "runtime/fp8_projection.hpp"

#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"

namespace deepfuse::runtime {

E4m3Activations::E4m3Activations(size_t max_tokens, size_t max_columns)
    : bytes_(max_tokens * max_columns), scales_(max_tokens * sizeof(float)) {}

void E4m3Activations::project(kernels::CublasLtGemm& gemm, const __nv_bfloat16* x, const LinearWeight& w,
                              const __nv_bfloat16* bias, const __nv_bfloat16* addend, __nv_bfloat16* y, int tokens,
                              const char* who, cudaStream_t stream) const {
  DF_CHECK(w.format == WeightFormat::fp8_e4m3 && !w.tensor_scale && w.scales,
           std::string(who) + ": the FP8 GEMM needs fp8_e4m3 weights with per-channel scales, not " +
               weight_format_name(w.format));
  DF_CHECK(bytes_.bytes() >= static_cast<size_t>(tokens) * w.columns &&
               scales_.bytes() >= static_cast<size_t>(tokens) * sizeof(float),
           std::string(who) + ": no e4m3 activation buffer for " + std::to_string(tokens) + " tokens of " +
               std::to_string(w.columns));
  auto* e4m3 = bytes_.as<uint8_t>();
  auto* scales = scales_.as<float>();
  DF_CHECK_CUDA(kernels::quantize_rows_fp8(x, e4m3, scales, tokens, w.columns, stream));
  gemm.run_fp8({e4m3, scales}, {static_cast<const uint8_t*>(w.data), w.scales}, bias, addend, y, tokens, w.rows,
               w.columns, stream);
}

}  // namespace deepfuse::runtime
