// Checkpoint tensors vs what the config implies, and their conversion to fp32.
#include <cstring>
#include <set>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "model/float16.hpp"

namespace deepfuse {

namespace {

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, inter = c.intermediate_size;
  const int64_t q = c.q_size(), kv = c.kv_size();
  std::vector<ExpectedTensor> tensors = {{"model.embed_tokens.weight", {vocab, hidden}}};
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    tensors.push_back({p + "input_layernorm.weight", {hidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    if (c.qkv_bias) {
      tensors.push_back({p + "self_attn.q_proj.bias", {q}});
      tensors.push_back({p + "self_attn.k_proj.bias", {kv}});
      tensors.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    tensors.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    if (c.o_proj_bias) tensors.push_back({p + "self_attn.o_proj.bias", {hidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {hidden}});
    tensors.push_back({p + "mlp.gate_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {inter, hidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {hidden, inter}});
  }
  tensors.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings) tensors.push_back({"lm_head.weight", {vocab, hidden}});
  return tensors;
}

void validate_checkpoint(const Checkpoint& checkpoint, const ModelConfig& config) {
  std::set<std::string> expected_names;
  for (const ExpectedTensor& expected : expected_tensors(config)) {
    expected_names.insert(expected.name);
    const Checkpoint::Entry* entry = checkpoint.find(expected.name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + expected.name + "'");
    const std::string where = entry->file->path().string() + ": tensor '" + expected.name + "'";
    DF_CHECK(entry->info->shape == expected.shape, where + " has shape " + shape_text(entry->info->shape) +
                                                       ", the config implies " + shape_text(expected.shape));
    const SafetensorsDType dtype = entry->info->dtype;
    DF_CHECK(dtype == SafetensorsDType::BF16 || dtype == SafetensorsDType::F16 || dtype == SafetensorsDType::F32,
             where + " has dtype " + dtype_name(dtype) + " (supported: BF16, F16, F32)");
  }
  for (const auto& [name, entry] : checkpoint.tensors()) {
    if (expected_names.count(name) || ends_with(name, "rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && config.tie_word_embeddings) continue;
    throw Error(entry.file->path().string() + ": unexpected tensor '" + name + "' for a " +
                architecture_name(config.architecture) + " with this config");
  }
}

std::vector<float> to_float32(std::span<const std::byte> data, SafetensorsDType dtype) {
  const size_t count = data.size() / dtype_size(dtype);
  std::vector<float> out(count);
  switch (dtype) {
    case SafetensorsDType::F32:
      std::memcpy(out.data(), data.data(), data.size());
      break;
    case SafetensorsDType::BF16:
    case SafetensorsDType::F16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data.data() + 2 * i, 2);
        out[i] = dtype == SafetensorsDType::BF16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
      }
      break;
    default:
      throw Error(std::string("cannot convert dtype ") + dtype_name(dtype) + " to fp32");
  }
  return out;
}

reference::DecoderWeights load_reference_weights(const Checkpoint& checkpoint, const ModelConfig& config) {
  validate_checkpoint(checkpoint, config);
  auto load = [&](const std::string& name) {
    const Checkpoint::Entry* entry = checkpoint.find(name);
    return to_float32(checkpoint.data(*entry), entry->info->dtype);
  };
  reference::DecoderWeights weights;
  weights.embed_tokens = load("model.embed_tokens.weight");
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    reference::LayerWeights layer;
    layer.input_norm = load(p + "input_layernorm.weight");
    layer.q_proj = load(p + "self_attn.q_proj.weight");
    layer.k_proj = load(p + "self_attn.k_proj.weight");
    layer.v_proj = load(p + "self_attn.v_proj.weight");
    layer.o_proj = load(p + "self_attn.o_proj.weight");
    if (config.qkv_bias) {
      layer.q_bias = load(p + "self_attn.q_proj.bias");
      layer.k_bias = load(p + "self_attn.k_proj.bias");
      layer.v_bias = load(p + "self_attn.v_proj.bias");
    }
    if (config.o_proj_bias) layer.o_bias = load(p + "self_attn.o_proj.bias");
    layer.post_attention_norm = load(p + "post_attention_layernorm.weight");
    layer.gate_proj = load(p + "mlp.gate_proj.weight");
    layer.up_proj = load(p + "mlp.up_proj.weight");
    layer.down_proj = load(p + "mlp.down_proj.weight");
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = load("model.norm.weight");
  if (!config.tie_word_embeddings) weights.lm_head = load("lm_head.weight");
  return weights;
}

}  // namespace deepfuse
