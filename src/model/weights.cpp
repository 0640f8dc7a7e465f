// Checkpoint tensors vs what the config implies, and their conversion to fp32.
#include <cstring>
#include <optional>
#include <set>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "model/float16.hpp"

namespace deepfuse {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::optional<WeightFormat> checkpoint_weight_format(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::BF16:
    case SafetensorsDType::F16:
    case SafetensorsDType::F32: return WeightFormat::bf16;  // 16-bit on the device
    case SafetensorsDType::F8_E4M3: return WeightFormat::fp8_e4m3;
    default: return std::nullopt;
  }
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config) {
  std::vector<ExpectedTensor> tensors;
  auto add = [&](TensorScope scope, int layer) {
    for (const TensorSpec* spec : tensors_in(scope))
      if (spec->present(config)) tensors.push_back({tensor_name(*spec, layer), tensor_shape(*spec, config), spec, layer});
  };
  add(TensorScope::input, 0);
  for (int l = 0; l < config.num_hidden_layers; ++l) add(TensorScope::layer, l);
  add(TensorScope::output, 0);
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
    const std::optional<WeightFormat> format = checkpoint_weight_format(dtype);
    DF_CHECK(format.has_value(), where + " has dtype " + dtype_name(dtype) + " (supported: BF16, F16, F32)");
    DF_CHECK(expected.spec->formats.has(*format),
             where + " has dtype " + dtype_name(dtype) + ", which this tensor cannot have (" + weight_format_name(*format) + ")");
    require_implemented(*format, where);
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
  reference::DecoderWeights weights;
  weights.layers.resize(config.num_hidden_layers);
  for (const ExpectedTensor& tensor : expected_tensors(config)) {
    const Checkpoint::Entry* entry = checkpoint.find(tensor.name);
    reference::TensorSet& set = tensor.spec->scope == TensorScope::layer ? weights.layers[tensor.layer] : weights.model;
    set[tensor.spec->role] = to_float32(checkpoint.data(*entry), entry->info->dtype);
  }
  return weights;
}

}  // namespace deepfuse
