// The Hopper MLP pair (sm_90a) for 16 to 256 tokens with bf16 weights: warpgroup MMA (wgmma) fed
// by TMA from a multi-stage shared-memory ring, weights as wgmma's M ("swap AB": 64 weight rows per
// instruction, the tokens as N). Two launches:
//   gate_up  act[M, I] = bf16(silu(x·Wg^T / rms) * (x·Wu^T / rms)), one block per 64 rows of I
//            holding gate and up accumulators for all the call's tokens; act stays in L2.
//   down     y[M, H] = act·Wd^T (+ residual): (64 rows of H) x (a split of I) per block, fp32
//            partial sums added in L2, the last block of each row tile writes y.
// Design, predicted speed and status: docs/kernels/swiglu_fused.md, "The Hopper pair".
// Weights: row-major bf16, gate_up [2I, H] (gate rows then up rows, the RMSNorm weight folded in
// or not) and down [H, I], read through TMA tensor maps made once (make_swiglu_wgmma_weights).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "deepfuse/kernels/tensor_map.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::kernels {

inline constexpr int kSwigluWgmmaMaxTokens = 256;

// The weights' tensor maps, made once per layer; the device pointers they name must outlive them.
struct SwigluWgmmaWeights {
  TensorMapBytes gate_up;  // [2I, H], boxes of 64 rows
  TensorMapBytes down;     // [H, I], boxes of 64 rows
};
cudaError_t make_swiglu_wgmma_weights(const __nv_bfloat16* gate_up, const __nv_bfloat16* down, int hidden,
                                      int intermediate, SwigluWgmmaWeights& out);

struct SwigluWgmmaParams {
  const __nv_bfloat16* x = nullptr;  // [tokens, hidden], 16-byte aligned
  const SwigluWgmmaWeights* weights = nullptr;
  const __nv_bfloat16* residual = nullptr;  // [tokens, hidden] or null; y may alias it
  __nv_bfloat16* y = nullptr;               // [tokens, hidden]
  // The RMSNorm with its weight folded into gate_up (as SwigluBatchedParams::rms_normalize): the
  // sums are scaled by 1/rms(x). x may then alias residual and y (x is read by the first launch,
  // y written by the second).
  bool rms_normalize = false;
  float norm_eps = 1e-6f;
  __nv_bfloat16* activations = nullptr;  // [tokens, intermediate] scratch, 16-byte aligned
  float* accumulator = nullptr;          // [tokens, hidden] fp32; zero before the first call (left zero)
  unsigned* tile_counters = nullptr;     // swiglu_wgmma_counter_words(hidden); zero before the first call (left zero)
  int tokens = 0;
  int hidden = 0;
  int intermediate = 0;
};

// The GPU facts the pair's limits depend on; major 0: unknown (only the shape and tokens are checked).
struct SwigluWgmmaDevice {
  int major = 0;
  int sms = 0;
};

// Why launch_swiglu_wgmma refuses `tokens` tokens of a hidden x intermediate MLP in `format` on
// `device` (empty: it runs them). Its limits live in src/kernels/mlp/swiglu_wgmma_config.hpp.
std::string swiglu_wgmma_unsupported(int hidden, int intermediate, int tokens, const SwigluWgmmaDevice& device,
                                     WeightFormat format = WeightFormat::bf16);

// Scratch sizes for up to max_tokens tokens per call (at most kSwigluWgmmaMaxTokens).
size_t swiglu_wgmma_activation_elements(int intermediate, int max_tokens);
size_t swiglu_wgmma_accumulator_floats(int hidden, int max_tokens);
size_t swiglu_wgmma_counter_words(int hidden);

// How a call is tiled (host arithmetic, tested on the CPU): the token tile (wgmma N of a block),
// each kernel's ring depth, grid and dynamic shared memory, and phase 2's K split.
struct SwigluWgmmaPlan {
  int token_tile = 0;
  int gate_up_stages = 0, gate_up_blocks = 0;
  size_t gate_up_shared_bytes = 0;
  int down_stages = 0, down_splits = 0, down_blocks = 0;
  size_t down_shared_bytes = 0;
};
// sms: the GPU's SM count (phase 2 splits I so that its blocks fill every SM's slots once).
SwigluWgmmaPlan plan_swiglu_wgmma(int hidden, int intermediate, int tokens, int sms);

// Two launches on `stream` (the second a programmatic dependent of the first); the x and act tensor
// maps ([tokens, ...], boxes of min(tokens, tile) rows) are encoded on the host per call. Calls must
// not overlap (the scratch is the call's). cudaErrorInvalidValue for a shape, token count, pointer
// or alignment it refuses, cudaErrorNotSupported on a GPU other than sm_90.
cudaError_t launch_swiglu_wgmma(const SwigluWgmmaParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
