// The one definition of a model's tensors: per tensor, its role, Hugging Face name, shape (from
// the config), how it splits under tensor parallelism, whether the config asks for it, the device
// matrix it is stored in, how random weights draw it and which weight formats it may have.
// The checkpoint validation and loaders (src/model), make-model, the GPU upload, packing and
// random weights (src/runtime/gpu_weights.cpp), the reference decoder's weights and the tensor-
// parallel slices (src/dist/tensor_split) all read this table; adding a tensor is one row here
// (plus its use in the forward pass and the reference decoder). A plain data header, like
// model_config.hpp: the reference decoder may include it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse {

enum class TensorRole : uint8_t {
  embed_tokens,
  input_norm, q_proj, k_proj, v_proj, q_bias, k_bias, v_bias, o_proj, o_bias,
  post_attention_norm, gate_proj, up_proj, down_proj,
  final_norm, lm_head,
};
inline constexpr int kTensorRoleCount = 16;

// Where a tensor sits: before the blocks, in every block ("model.layers.N." + name), after them.
enum class TensorScope : uint8_t { input, layer, output };

// One axis of a shape, from the config. none: the tensor is a vector.
enum class Extent : uint8_t { none, hidden, q, kv, intermediate, vocab };

// Tensor parallelism: the axis each rank holds a slice of, by that axis's extent (q: the rank's
// query heads, kv: its key/value heads, or the one it shares; intermediate: its MLP slice; vocab:
// its ceil(V/ranks) rows, the last padded). hidden is never split (dist/tensor_split.hpp).
enum class TensorSplit : uint8_t { replicated, rows, columns };

// The device matrix a tensor is stored in; tensors of one group are one matrix, their rows
// concatenated in table order (q, k and v make the one QKV projection, their biases one vector).
enum class TensorGroup : uint8_t {
  embed_tokens, input_norm, qkv, qkv_bias, o_proj, o_bias, post_attention_norm, gate, up, down, final_norm, lm_head,
};
inline constexpr int kTensorGroupCount = 12;

// How random weights (make-model, --random-weights) draw a tensor: the statistics of trained
// weights closely enough that activations stay O(1) at any size.
enum class TensorInit : uint8_t {
  embedding,  // uniform ±1
  norm,       // around 1
  bias,       // small, ±0.1
  linear,     // std 1/sqrt(fan_in) (fan_in: the columns)
};

struct TensorSpec {
  TensorRole role;
  TensorScope scope;
  const char* name;  // Hugging Face name (in a block: after "model.layers.N.")
  Extent rows;
  Extent columns;    // none: a vector of `rows`
  TensorSplit split;
  bool (*present)(const ModelConfig&);
  TensorGroup group;
  TensorInit init;
  WeightFormats formats;  // linear weights: bf16 and the fp8 formats; vectors and the embedding: bf16 only
};

namespace tensor_presence {
inline bool always(const ModelConfig&) { return true; }
inline bool qkv_bias(const ModelConfig& c) { return c.qkv_bias; }
inline bool o_proj_bias(const ModelConfig& c) { return c.o_proj_bias; }
inline bool untied(const ModelConfig& c) { return !c.tie_word_embeddings; }
}  // namespace tensor_presence

inline constexpr WeightFormats kVectorFormats{WeightFormat::bf16};
inline constexpr WeightFormats kLinearFormats{WeightFormat::bf16, WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128};

// In checkpoint (model) order. Roles index it: kModelTensors[int(role)].role == role.
inline constexpr TensorSpec kModelTensors[kTensorRoleCount] = {
    // role, scope, name, rows, columns, split, present, group, init, formats
    {TensorRole::embed_tokens, TensorScope::input, "model.embed_tokens.weight", Extent::vocab, Extent::hidden,
     TensorSplit::replicated, tensor_presence::always, TensorGroup::embed_tokens, TensorInit::embedding, kVectorFormats},
    {TensorRole::input_norm, TensorScope::layer, "input_layernorm.weight", Extent::hidden, Extent::none,
     TensorSplit::replicated, tensor_presence::always, TensorGroup::input_norm, TensorInit::norm, kVectorFormats},
    {TensorRole::q_proj, TensorScope::layer, "self_attn.q_proj.weight", Extent::q, Extent::hidden,
     TensorSplit::rows, tensor_presence::always, TensorGroup::qkv, TensorInit::linear, kLinearFormats},
    {TensorRole::k_proj, TensorScope::layer, "self_attn.k_proj.weight", Extent::kv, Extent::hidden,
     TensorSplit::rows, tensor_presence::always, TensorGroup::qkv, TensorInit::linear, kLinearFormats},
    {TensorRole::v_proj, TensorScope::layer, "self_attn.v_proj.weight", Extent::kv, Extent::hidden,
     TensorSplit::rows, tensor_presence::always, TensorGroup::qkv, TensorInit::linear, kLinearFormats},
    {TensorRole::q_bias, TensorScope::layer, "self_attn.q_proj.bias", Extent::q, Extent::none,
     TensorSplit::rows, tensor_presence::qkv_bias, TensorGroup::qkv_bias, TensorInit::bias, kVectorFormats},
    {TensorRole::k_bias, TensorScope::layer, "self_attn.k_proj.bias", Extent::kv, Extent::none,
     TensorSplit::rows, tensor_presence::qkv_bias, TensorGroup::qkv_bias, TensorInit::bias, kVectorFormats},
    {TensorRole::v_bias, TensorScope::layer, "self_attn.v_proj.bias", Extent::kv, Extent::none,
     TensorSplit::rows, tensor_presence::qkv_bias, TensorGroup::qkv_bias, TensorInit::bias, kVectorFormats},
    {TensorRole::o_proj, TensorScope::layer, "self_attn.o_proj.weight", Extent::hidden, Extent::q,
     TensorSplit::columns, tensor_presence::always, TensorGroup::o_proj, TensorInit::linear, kLinearFormats},
    {TensorRole::o_bias, TensorScope::layer, "self_attn.o_proj.bias", Extent::hidden, Extent::none,
     TensorSplit::replicated, tensor_presence::o_proj_bias, TensorGroup::o_bias, TensorInit::bias, kVectorFormats},
    {TensorRole::post_attention_norm, TensorScope::layer, "post_attention_layernorm.weight", Extent::hidden,
     Extent::none, TensorSplit::replicated, tensor_presence::always, TensorGroup::post_attention_norm,
     TensorInit::norm, kVectorFormats},
    {TensorRole::gate_proj, TensorScope::layer, "mlp.gate_proj.weight", Extent::intermediate, Extent::hidden,
     TensorSplit::rows, tensor_presence::always, TensorGroup::gate, TensorInit::linear, kLinearFormats},
    {TensorRole::up_proj, TensorScope::layer, "mlp.up_proj.weight", Extent::intermediate, Extent::hidden,
     TensorSplit::rows, tensor_presence::always, TensorGroup::up, TensorInit::linear, kLinearFormats},
    {TensorRole::down_proj, TensorScope::layer, "mlp.down_proj.weight", Extent::hidden, Extent::intermediate,
     TensorSplit::columns, tensor_presence::always, TensorGroup::down, TensorInit::linear, kLinearFormats},
    {TensorRole::final_norm, TensorScope::output, "model.norm.weight", Extent::hidden, Extent::none,
     TensorSplit::replicated, tensor_presence::always, TensorGroup::final_norm, TensorInit::norm, kVectorFormats},
    // Tied checkpoints have none: the embedding doubles as the lm_head (a split model still holds
    // its vocabulary slice of it apart, src/runtime/gpu_weights.cpp).
    {TensorRole::lm_head, TensorScope::output, "lm_head.weight", Extent::vocab, Extent::hidden,
     TensorSplit::rows, tensor_presence::untied, TensorGroup::lm_head, TensorInit::linear, kLinearFormats},
};

constexpr bool table_is_consistent() {
  for (int i = 0; i < kTensorRoleCount; ++i) {
    if (static_cast<int>(kModelTensors[i].role) != i) return false;            // roles index the rows
    if (static_cast<int>(kModelTensors[i].group) >= kTensorGroupCount) return false;  // a group past the count
  }
  return true;
}
static_assert(table_is_consistent(),
              "kModelTensors must list the roles in TensorRole's order, and kTensorGroupCount count every group");

constexpr const TensorSpec& tensor_spec(TensorRole role) { return kModelTensors[static_cast<int>(role)]; }

// The tensors of one scope, in table order.
std::vector<const TensorSpec*> tensors_in(TensorScope scope);

// An extent's length in `config` (none: 1).
int64_t extent_size(Extent extent, const ModelConfig& config);

// [rows] or [rows, columns] in `config`.
std::vector<int64_t> tensor_shape(const TensorSpec& spec, const ModelConfig& config);

// The checkpoint name: "model.layers.<layer>.<name>" in a block, the name itself elsewhere.
std::string tensor_name(const TensorSpec& spec, int layer);

// Rows of `group` in `config`: the sum over its present tensors (the QKV projection's q + 2 kv).
int64_t group_rows(TensorGroup group, const ModelConfig& config);

// Columns of `group` in `config` (its tensors share them); 1 for a vector.
int64_t group_columns(TensorGroup group, const ModelConfig& config);

// The row `spec` starts at inside its group's matrix (k_proj: after q_proj's rows).
int64_t row_in_group(const TensorSpec& spec, const ModelConfig& config);

}  // namespace deepfuse
