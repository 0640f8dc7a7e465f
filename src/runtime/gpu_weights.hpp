// Model weights in the device layouts the decode and prefill steps read, made from a Hugging Face
// checkpoint or from seeded random values (benchmarks of real shapes without files).
//
// Which tensors there are, their shapes, slices and the matrices they merge into come from the
// model table (include/deepfuse/model_tensors.hpp); one loop (build_weights in gpu_weights.cpp)
// serves checkpoints and random weights, one GPU and tensor-parallel ranks alike.
//
// Formats: linear weights in bf16, or in an FP8 format (the checkpoint's, or fp8_e4m3 made at load
// by --quantize, WeightLayouts::load): e4m3 bytes in the same layouts, with fp32 scales beside them
// (per output channel, or per 128x128 block) that the row-major and packed copies share. Norms,
// biases and the embedding table are bf16 in every format; the lm_head stays bf16 unless the
// checkpoint quantizes it or --quantize-lm-head.
// Layouts:
//   groups: embed_tokens [V, H]; final_norm [H]; lm_head [V, H] (absent when tied: embed_tokens
//   is used); per layer: input_norm [H]; qkv [q_size + 2 kv_size, H] = q_proj rows, then k_proj,
//   then v_proj, so one GEMM yields the q | k | v row rope_kv_append expects; qkv_bias likewise
//   merged (Qwen2, Llama attention_bias); o_proj [H, q_size]; o_bias [H]; post_attention_norm
//   [H]; the MLP in the layouts of the variants the plan runs (WeightLayouts): fragment-packed
//   for the fused kernel, row-major gate_up / down for cuBLASLt.
//   Norms folded (bf16 only, WeightFormatInfo::folds_norm): the row-major qkv holds input_norm's weight in its columns and the
//   row-major MLP post_attention_norm's in gate_up, so those paths need no norm launch
//   (folded_norm.hpp; docs/design.md, "Weight formats", says why only in bf16).
//   fragments: packed copies of qkv and o_proj for the decode kernels that stream them (the fused
//   front, the o_proj GEMV), when the plan runs them; prefill reads the row-major copies.
//   rope_inv_freq: fp32 [head_dim / 2], rope_inverse_frequencies (llama3 scaling included).
//
// Checkpoint tensors go straight to the device through two pinned staging buffers used in turn,
// so reading (and F16/F32 -> bf16 conversion) of one chunk overlaps the copy of the previous one.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/model_tensors.hpp"
#include "deepfuse/safetensors.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/weight_format.hpp"
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

// The layouts the weights hold: one for each variant the decode plan runs somewhere (a bucket or
// prefill, DecodePlan::uses). Both MLP layouts mean a second copy of the MLP weights (3·H·I·2
// bytes per layer); the engine keeps it only where the memory plan leaves room (fits_with_kv).
struct WeightLayouts {
  bool mlp_fused = true;      // fragment-packed MLP, the fused kernel's
  bool mlp_unfused = false;   // row-major gate_up / down, cuBLASLt's
  bool front_packed = true;   // fragment-packed qkv, the fused front's
  bool o_proj_packed = true;  // fragment-packed o_proj, the cluster GEMV's
  int max_tokens = 1;         // per MLP call, prefill chunks included
  // The formats linear weights are made in beyond the checkpoint's own (--quantize): not a
  // layout, but what every layout's bytes depend on with it.
  WeightLoadOptions load{};
  // The batched fused kernel's fragment-packed MLP: its own copy (the same layout as mlp_fused's,
  // not yet shared with it), held only where a plan runs it.
  bool mlp_fused_batched = false;
  // The Hopper pair's row-major MLP (the unfused layout with the norm folded in): its own copy,
  // held only where a plan runs it.
  bool mlp_fused_wgmma = false;

  static WeightLayouts of(const DecodePlan& plan, int max_tokens, const WeightLoadOptions& load = {});
};

// The format of each group's linear weight, indexed by TensorGroup (bf16 for vectors and for
// groups the config leaves out).
struct GroupFormats {
  std::array<WeightFormat, kTensorGroupCount> formats{};
  WeightFormat& operator[](TensorGroup group) { return formats[static_cast<int>(group)]; }
  WeightFormat operator[](TensorGroup group) const { return formats[static_cast<int>(group)]; }
};

// One device matrix or vector per group of the model table (include/deepfuse/model_tensors.hpp),
// indexed by TensorGroup; a group the config or the layouts leave out stays empty.
struct GroupBuffers {
  std::array<DeviceBuffer, kTensorGroupCount> buffers;
  DeviceBuffer& operator[](TensorGroup group) { return buffers[static_cast<int>(group)]; }
  const DeviceBuffer& operator[](TensorGroup group) const { return buffers[static_cast<int>(group)]; }
};

struct GpuLayerWeights {
  GroupFormats formats{};  // of qkv, o_proj, gate, up and down
  WeightFormat format = WeightFormat::bf16;  // the block's: its first non-bf16 group's, else bf16
  GroupBuffers row_major;  // the block's norms, biases, qkv and o_proj; the MLP's groups are
                           // only staged while loading, then packed into mlp_fused / mlp_unfused
  GroupBuffers fragments;  // fragment-packed qkv and o_proj, when the plan runs their kernels
  GroupBuffers scales;     // fp32 scales of qkv and o_proj in a format with scales (empty in bf16):
                           // scale_shape(format, rows, columns), shared by both layouts
  std::unique_ptr<MlpLayer> mlp_fused;    // WeightLayouts::mlp_fused
  std::unique_ptr<MlpLayer> mlp_unfused;  // WeightLayouts::mlp_unfused
  std::unique_ptr<MlpLayer> mlp_fused_batched;  // WeightLayouts::mlp_fused_batched
  std::unique_ptr<MlpLayer> mlp_fused_wgmma;    // WeightLayouts::mlp_fused_wgmma
  MlpLayer& mlp(MlpChoice choice) const;  // the layout must be held

  // A projection (a group of linear weights: qkv, o_proj) in `layout`, shaped by `config` (the
  // rank's model); its data is null when the weights do not hold that layout.
  LinearWeight linear(TensorGroup group, WeightLayout layout, const ModelConfig& config) const;
  // A norm weight or bias: 16-bit in every weight format; null when the config has none.
  const __nv_bfloat16* vector(TensorGroup group) const;
};

struct GpuWeights {
  GroupFormats formats{};  // the lm_head's (bf16 unless the checkpoint or --quantize-lm-head says)
  GroupBuffers groups;     // embed_tokens, final_norm, lm_head (empty when tied on one GPU)
  GroupBuffers scales;     // the lm_head's, in a format with scales
  std::vector<GpuLayerWeights> layers;
  DeviceBuffer rope_inv_freq;

  const __nv_bfloat16* embedding() const;
  const __nv_bfloat16* vector(TensorGroup group) const;  // final_norm
  // The lm_head (its vocabulary slice under tensor parallelism: `rows` = shard.vocab_rows), or
  // the embedding table when tied on one GPU.
  LinearWeight lm_head(int rows, int hidden) const;
  // Every layer's row-major bf16 `group` (cuBLASLt's operands, for tuning over all layers).
  std::vector<const __nv_bfloat16*> layer_operands(TensorGroup group, const ModelConfig& config, const char* who) const;
};

// Bytes of every weight on the device in these layouts and formats (linear weights in theirs with
// their scales, the rest bf16), and the subset one decode step reads (all but the embedding table,
// of which a step gathers only a few rows, unless it doubles as the lm_head; each op reads one of
// its layouts): the decode roofline's weight bytes. `config` is the rank's model
// (dist::rank_config); a split one holds its lm_head slice of shard.vocab_rows rows apart from the
// replicated embedding table.
size_t gpu_weight_bytes(const ModelConfig& config, const WeightLayouts& layouts, const dist::RankShard& shard = {});
size_t decode_weight_bytes(const ModelConfig& config, const dist::RankShard& shard = {},
                           const WeightLoadOptions& load = {});

// Whether the weights in `layouts`, their load staging and `kv_reserve_bytes` fit `free_bytes`.
bool fits_with_kv(const ModelConfig& config, const WeightLayouts& layouts, size_t free_bytes, size_t kv_reserve_bytes,
                  const dist::RankShard& shard = {});

// Throws deepfuse::Error naming the bytes needed and free when the weights (plus the staging that
// loading them needs) cannot fit the current device's free memory. `what` names the model.
void check_weights_fit(const ModelConfig& config, const WeightLayouts& layouts, const std::string& what,
                       const dist::RankShard& shard = {});

// Validates the checkpoint against `model` (the whole model), then loads the slices of `shard`
// (everything for one GPU) straight from the files: a rank reads only its own rows and columns.
// Linear weights in their stored format, or made fp8_e4m3 as layouts.load asks (on the host, as
// the reference backend quantizes them). progress (may be empty) gets checkpoint bytes done / total.
GpuWeights load_checkpoint_weights(const Checkpoint& checkpoint, const ModelConfig& model, const WeightLayouts& layouts,
                                   cudaStream_t stream, const LoadProgress& progress, const dist::RankShard& shard = {});

// Uniform random weights at ~1/sqrt(fan_in) scale (norm weights 1, biases small, embedding ±1),
// the statistics of trained weights closely enough that activations stay finite over 80 layers.
// A shard holds the slices of the same model (each tensor is drawn whole, then sliced), so tensor
// parallel and one-GPU engines of one seed compute the same function. layouts.load's fp8_e4m3:
// the same bf16 numbers quantized per output row on the device.
GpuWeights make_random_weights(const ModelConfig& model, const WeightLayouts& layouts, uint64_t seed,
                               cudaStream_t stream, const dist::RankShard& shard = {});

}  // namespace deepfuse::runtime
