// DeepFusion SwiGLU MLP: the whole MLP in one launch. Design notes: docs/kernels/swiglu_fused.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "deepfuse/kernels/line_exchange.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse {

// Launch tuning of the fused variant; 0 means the device default. The engine sets
// programmatic_launch for its layers; `bench mlp --fused-tunings` sets the rest.
struct FusedMlpTuning {
  int blocks_per_sm = 0;  // resident blocks per SM (at most 1 where blocks have 16 warps: clusters of 2, or 9-16 tokens)
  int cluster_size = 0;   // blocks sharing activations through distributed shared memory: 1, 2, 4, 8
  // The decode engine's layers: launch as a programmatic dependent of the kernel before (blocks
  // start early and wait for it first thing) where that measured faster: calls of up to 8 tokens
  // on the grids that cover every SM (clusters of 2 or 4). Back-to-back MLP calls measured
  // slower that way, so it is off unless asked for.
  bool programmatic_launch = false;
};

}  // namespace deepfuse

namespace deepfuse::kernels {

struct SwigluFusedParams {
  const __nv_bfloat16* x = nullptr;         // [tokens, hidden]
  const uint4* gate_up = nullptr;           // fragment-packed gate/up (see mlp.hpp)
  const uint4* down = nullptr;              // fragment-packed down
  const __nv_bfloat16* residual = nullptr;  // [tokens, hidden] or null
  __nv_bfloat16* y = nullptr;               // [tokens, hidden]; may alias residual
  // Optional RMSNorm of x folded in (the pre-MLP norm of a transformer block): the MLP then
  // runs on x / rms(x) * norm_weight, the weight multiplied into gate_up when it was packed
  // (pack_swiglu_gate_up's norm_weight). x may then alias residual and y: every block has read x
  // before the finishers write y.
  bool rms_normalize = false;
  float norm_eps = 1e-6f;
  float* accumulator = nullptr;             // [tokens, hidden] fp32 partial sums; zero between calls
  // Leave mlp(x) in the accumulator and write nothing else (residual and y are ignored): a later
  // kernel adds it to the residual stream and zeroes the accumulator (the decode step: the next
  // layer's fused QKV and o_proj, see cluster_gemv::Inputs::pending). Saves the finish: the
  // ticket, the wait for the last block and the conversion (docs/kernels/swiglu_fused.md, "The sum
  // left for the next block at batch 1").
  bool defer_sum = false;
  unsigned* counters = nullptr;             // kSwigluFusedCounters; zero between calls
  // Tensor parallel (active: ranks > 1): y receives the sum over the ranks of every rank's
  // mlp(x) (+ residual), each rank's rounded to bf16 first, exchanged by the finishing blocks
  // (line_exchange.hpp) instead of an all-reduce launch. Not with defer_sum.
  LineExchange exchange;
  // Tensor parallel, the input's sum too (active: ranks > 1; needs `exchange` active, its buffers'
  // other slot): x is not read as given but first written with the sum over the ranks of every
  // rank's x_partial ([tokens, hidden], this rank's o_proj output, rank 0's with the residual),
  // rank order, rounded once: what the one-shot all-reduce would write, without its launch. Each
  // rank's blocks push a share of its partial to the peers; each cluster sums every value and
  // writes x (the clusters write the same bits), so x must be writable memory.
  LineExchange x_exchange;
  const __nv_bfloat16* x_partial = nullptr;
  // FP8 weights (fp8_e4m3, per-row scales; packed by pack_swiglu_gate_up_fp8 / pack_swiglu_down_fp8;
  // at most kSwigluFusedFp8MaxTokens tokens): the scales multiply the sums, and the norm weight,
  // which FP8 does not fold into the packed columns, multiplies x once per call: x times it,
  // rounded to f16, is written into x_fragments in the MMAs' operand order, and phase 1 streams
  // it from there (L2) beside the weights.
  WeightFormat format = WeightFormat::bf16;
  const float* gate_up_scales = nullptr;     // [2I]: gate rows, then up rows
  const float* down_scales = nullptr;        // [H]
  const __nv_bfloat16* norm_weight = nullptr;  // [H], with rms_normalize
  uint4* x_fragments = nullptr;              // FP8: swiglu_fused_x_fragments_bytes(hidden) of scratch
  int tokens = 0;
  int hidden = 0;
  int intermediate = 0;
};

inline constexpr int kSwigluFusedCounters = 2;
inline constexpr int kSwigluFusedFp8MaxTokens = 16;  // FP8 instances: passes of 8 and 16 tokens

// The GPU facts the fused MLP's grid depends on, for a planner without the GPU at hand.
struct SwigluFusedDevice {
  int sms = 0;                   // 0: unknown (the residency rule is not checked)
  bool clusters = false;         // thread-block clusters (sm_90)
  int shared_bytes_per_sm = 0;
};

// Why launch_swiglu_fused refuses (or cannot place) `tokens` tokens of a hidden x intermediate MLP
// on `device` (empty: it runs them): the shape its launcher takes, and the rows of the
// intermediate dimension its resident blocks hold, from its own block configuration and shared
// memory, and its weights' format (bf16; fp8_e4m3 with per-row scales up to kSwigluFusedFp8MaxTokens
// tokens). The scheduler plans by it.
std::string swiglu_fused_unsupported(int hidden, int intermediate, int tokens, const SwigluFusedDevice& device,
                                     WeightFormat format = WeightFormat::bf16);

// fp32 partial-sum buffer size in floats.
size_t swiglu_fused_accumulator_floats(int hidden, int max_tokens);
// FP8 calls' x_fragments scratch in bytes (any token count up to kSwigluFusedFp8MaxTokens; its
// contents need no initialization and are rewritten by every call).
size_t swiglu_fused_x_fragments_bytes(int hidden);

// One launch, tuned by deepfuse::FusedMlpTuning (above; 0: the device's default).
// The accumulator and counters must be zero on entry; they are zero again when the kernel
// completes (with defer_sum, the accumulator once its consumer has cleared it), so consecutive
// launches (and graph replays) need no memset.
cudaError_t launch_swiglu_fused(const SwigluFusedParams& params, const FusedMlpTuning& tuning,
                                cudaStream_t stream);

// Hugging Face layout (device) -> fragment-packed layout (device). gate/up: [I, H]; down: [H, I].
// gate_up_packed holds 2*I*H bf16, down_packed H*I. norm_weight ([H] or null): an RMSNorm weight
// multiplied into the gate and up columns (fp32 product, rounded once to bf16).
cudaError_t pack_swiglu_gate_up(const __nv_bfloat16* gate, const __nv_bfloat16* up, const __nv_bfloat16* norm_weight,
                                uint4* gate_up_packed, int hidden, int intermediate, cudaStream_t stream);
cudaError_t pack_swiglu_down(const __nv_bfloat16* down, uint4* down_packed, int hidden, int intermediate,
                             cudaStream_t stream);

// Row-major e4m3 bytes -> the FP8 layouts: gate_up: for each 16-row I tile, for each 16-wide H step,
// 32 lanes x (8 bytes of gate, 8 of up); down: for each pair of 16-wide I tiles, for each 16-row H
// tile, 32 lanes x (8 bytes of the first I tile, 8 of the second). I a multiple of 32.
cudaError_t pack_swiglu_gate_up_fp8(const uint8_t* gate, const uint8_t* up, uint4* gate_up_packed, int hidden,
                                    int intermediate, cudaStream_t stream);
cudaError_t pack_swiglu_down_fp8(const uint8_t* down, uint4* down_packed, int hidden, int intermediate,
                                 cudaStream_t stream);

}  // namespace deepfuse::kernels
