// The fused SwiGLU MLP for batches (16 to 256 tokens): one launch, weights streamed once per pass of
// up to 128 tokens. Design and predicted speed: docs/kernels/swiglu_fused.md, "The batched kernel".
// It reads the fused MLP's fragment-packed weights (pack_swiglu_gate_up / pack_swiglu_down in
// swiglu_fused.hpp), so both kernels can serve one layer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "deepfuse/kernels/swiglu_fused.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::kernels {

struct SwigluBatchedParams {
  const __nv_bfloat16* x = nullptr;         // [tokens, hidden]
  const uint4* gate_up = nullptr;           // pack_swiglu_gate_up's layout (norm weight folded in or not)
  const uint4* down = nullptr;              // pack_swiglu_down's layout
  const __nv_bfloat16* residual = nullptr;  // [tokens, hidden] or null; y may alias it
  __nv_bfloat16* y = nullptr;               // [tokens, hidden]
  // The RMSNorm folded in as for the fused kernel (SwigluFusedParams::rms_normalize): the sums are
  // scaled by 1/rms(x) before the SiLU. x may then alias residual and y (x is read before the grid's
  // last barrier, y written after it).
  bool rms_normalize = false;
  float norm_eps = 1e-6f;
  __nv_bfloat16* activations = nullptr;  // [tokens, intermediate] scratch: silu(g)*u, through L2
  float* accumulator = nullptr;          // [tokens, hidden] fp32; zero between calls (left zero)
  unsigned* barrier = nullptr;           // kSwigluBatchedBarrierWords; zero before the first call
  int tokens = 0;
  int hidden = 0;
  int intermediate = 0;
};

inline constexpr int kSwigluBatchedMaxTokens = 256;
inline constexpr int kSwigluBatchedBarrierWords = 2;

// Why launch_swiglu_batched refuses `tokens` tokens of a hidden x intermediate MLP in `format` on
// `device` (empty: it runs them). Its limits live in src/kernels/mlp/swiglu_batched_config.cuh.
std::string swiglu_batched_unsupported(int hidden, int intermediate, int tokens, const SwigluFusedDevice& device,
                                       WeightFormat format = WeightFormat::bf16);

// Scratch sizes for up to max_tokens tokens per call (at most kSwigluBatchedMaxTokens).
size_t swiglu_batched_activation_elements(int intermediate, int max_tokens);
size_t swiglu_batched_accumulator_floats(int hidden, int max_tokens);

// One launch. The accumulator and barrier must be zero before the first call; the kernel leaves
// them so, so consecutive launches and graph replays need no memset. Calls must not overlap (the
// scratch and barrier are the call's). Returns cudaErrorInvalidValue for a shape, token count or
// pointer it refuses, cudaErrorNotSupported where this GPU cannot hold its blocks.
cudaError_t launch_swiglu_batched(const SwigluBatchedParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
