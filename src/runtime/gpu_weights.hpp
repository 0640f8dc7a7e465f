// Model weights in the device layouts the decode and prefill steps read, made from a Hugging Face
// checkpoint or from seeded random values (benchmarks of real shapes without files).
//
// Layouts (all bf16 unless noted):
//   embed_tokens [V, H]; final_norm [H]; lm_head [V, H] (absent when tied: embed_tokens is used)
//   per layer: input_norm [H]; qkv [q_size + 2 kv_size, H] = q_proj rows, then k_proj, then v_proj,
//   so one GEMM yields the q | k | v row rope_kv_append expects; qkv_bias likewise merged (Qwen2,
//   Llama attention_bias); o_proj [H, q_size]; o_bias [H]; post_attention_norm [H]; the MLP in
//   MlpLayer's layout for the chosen variant (fragment-packed for fused), plus an unfused copy
//   for large steps when MlpPlan::unfused_copy().
//   Norms folded (unless DEEPFUSE_FOLD_NORMS=0, an A/B switch): the row-major qkv holds
//   input_norm's weight in its columns and every unfused MLP (the copy, or the unfused variant)
//   post_attention_norm's in gate_up, so those paths need no norm launch (folded_norm.cuh).
//   qkv_packed, o_proj_packed: with the fused MLP variant, fragment-packed copies for the decode
//   kernels (deepfuse/kernels/qkv_rope_fused.hpp, deepfuse/kernels/gemv_residual.hpp); prefill keeps using
//   the row-major copies with cuBLASLt.
//   rope_inv_freq: fp32 [head_dim / 2], rope_inverse_frequencies (llama3 scaling included).
//
// Checkpoint tensors go straight to the device through two pinned staging buffers used in turn,
// so reading (and F16/F32 -> bf16 conversion) of one chunk overlaps the copy of the previous one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/safetensors.hpp"
#include "deepfuse/tensor.hpp"

namespace deepfuse::runtime {

// The MLP layouts the weights hold. The fused MLP is the fastest up to 8 tokens and slower than
// cuBLASLt from 16 on (it re-reads its weights once per 32 tokens; docs/runtime.md, "The MLP's
// second copy"), so with fused_max_tokens set, larger steps (prefill chunks, decode batches above
// it) run the unfused variant on a second, row-major copy of the MLP weights (3·H·I·2 bytes more
// per layer).
struct MlpPlan {
  MlpVariant variant = MlpVariant::fused;
  int max_tokens = 1;        // per call, prefill chunks included
  int fused_max_tokens = 0;  // fused variant: larger steps run the unfused copy; 0: fused serves all
  bool unfused_copy() const { return variant == MlpVariant::fused && fused_max_tokens > 0 && fused_max_tokens < max_tokens; }
};

struct GpuLayerWeights {
  DeviceBuffer input_norm;
  DeviceBuffer qkv;
  DeviceBuffer qkv_bias;  // empty when the architecture has none
  DeviceBuffer qkv_packed;  // fused decode path only (empty otherwise)
  DeviceBuffer o_proj;
  DeviceBuffer o_proj_packed;  // fused decode path only (empty otherwise)
  DeviceBuffer o_bias;    // empty when the architecture has none
  DeviceBuffer post_attention_norm;
  std::unique_ptr<MlpLayer> mlp;
  std::unique_ptr<MlpLayer> mlp_unfused;  // MlpPlan::unfused_copy(): serves steps above mlp's max_tokens
  MlpLayer& mlp_for(int tokens) const {
    return mlp_unfused && tokens > mlp->max_tokens() ? *mlp_unfused : *mlp;
  }
};

struct GpuWeights {
  DeviceBuffer embed_tokens;
  std::vector<GpuLayerWeights> layers;
  DeviceBuffer final_norm;
  DeviceBuffer lm_head;  // empty when tie_word_embeddings
  DeviceBuffer rope_inv_freq;
  bool input_norms_folded = false;  // every layer's row-major qkv holds its input_norm weight

  const __nv_bfloat16* lm_head_weights() const {
    return lm_head.empty() ? embed_tokens.as<__nv_bfloat16>() : lm_head.as<__nv_bfloat16>();
  }
};

// Bytes of every weight on the device (bf16), and the subset one decode step reads (all but the
// embedding table, of which a step gathers only a few rows, unless it doubles as the lm_head).
size_t gpu_weight_bytes(const ModelConfig& config, MlpVariant mlp_variant, bool unfused_mlp_copy = false);
size_t decode_weight_bytes(const ModelConfig& config);

// `plan` as it fits `free_bytes` of GPU memory: without the unfused copy (fused_max_tokens 0)
// unless the weights with it, their load staging and `kv_reserve_bytes` (the KV cache of one
// longest sequence) all fit, so a GPU that holds the model only without the copy still loads it.
MlpPlan fit_mlp_plan(const ModelConfig& config, MlpPlan plan, size_t free_bytes, size_t kv_reserve_bytes);

// Throws deepfuse::Error naming the bytes needed and free when the weights (plus the staging that
// loading them needs) cannot fit the current device's free memory. `what` names the model.
void check_weights_fit(const ModelConfig& config, const MlpPlan& mlp, const std::string& what);

// Whether decode steps run the fused front half (input norm + QKV + RoPE + KV append, one launch):
// with the fused MLP variant, on shapes the kernel supports.
bool uses_fused_qkv(const ModelConfig& config, MlpVariant mlp_variant);

// Up to how many tokens those decode steps also run o_proj + residual as one cluster GEMV launch
// (0: never; otherwise the weights hold a packed o_proj next to the plain one): 8 on every model
// that runs the fused front half (uses_fused_qkv); DEEPFUSE_OPROJ_GEMV=1 / 0 makes it 32 / 0.
int gemv_o_proj_max_tokens(const ModelConfig& config, MlpVariant mlp_variant);

// Validates the checkpoint against the config, then loads it. progress (may be empty) gets
// checkpoint bytes done / total.
GpuWeights load_checkpoint_weights(const Checkpoint& checkpoint, const ModelConfig& config, const MlpPlan& mlp,
                                   cudaStream_t stream, const LoadProgress& progress);

// Uniform random weights at ~1/sqrt(fan_in) scale (norm weights 1, biases small, embedding ±1),
// the statistics of trained weights closely enough that activations stay finite over 80 layers.
GpuWeights make_random_weights(const ModelConfig& config, const MlpPlan& mlp, uint64_t seed, cudaStream_t stream);

}  // namespace deepfuse::runtime
