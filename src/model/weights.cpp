// Checkpoint tensors vs what the config implies, and their conversion to fp32.
#include <cstring>
#include <optional>
#include <set>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "core/float16.hpp"
#include "core/float8.hpp"
#include "model/fp8_weights.hpp"

namespace deepfuse {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

WeightFormat stored_weight_format(const ModelConfig& config, const ExpectedTensor& tensor) {
  const WeightQuantization& q = config.quantization;
  const std::string module = tensor.name.substr(0, tensor.name.size() - std::string(".weight").size());
  if (!tensor.spec->formats.has(q.format) || !quantizes_module(q, module)) return WeightFormat::bf16;
  return q.format;
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
    check_stored_weight(checkpoint, config, expected);
    if (const std::optional<ExpectedScale> scale = expected_scale(config, expected)) expected_names.insert(scale->name);
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
    case SafetensorsDType::F8_E4M3:
    case SafetensorsDType::F8_E5M2:
      for (size_t i = 0; i < count; ++i) {
        const uint8_t bits = std::to_integer<uint8_t>(data[i]);
        out[i] = dtype == SafetensorsDType::F8_E4M3 ? float8_e4m3_to_float(bits) : float8_e5m2_to_float(bits);
      }
      break;
    default:
      throw Error(std::string("cannot convert dtype ") + dtype_name(dtype) + " to fp32");
  }
  return out;
}

WeightFormat loaded_weight_format(const ModelConfig& config, const ExpectedTensor& tensor,
                                  const WeightLoadOptions& options) {
  const WeightFormat stored = stored_weight_format(config, tensor);
  if (stored != WeightFormat::bf16 || !tensor.spec->formats.has(options.quantize)) return stored;
  return tensor.spec->role == TensorRole::lm_head && !options.quantize_lm_head ? stored : options.quantize;
}

void check_weight_load_options(const ModelConfig& config, const WeightLoadOptions& options) {
  if (options.quantize == WeightFormat::bf16) {
    DF_CHECK(!options.quantize_lm_head, "--quantize-lm-head needs --quantize fp8");
    return;
  }
  DF_CHECK(!config.quantization.quantized(), std::string("--quantize fp8: the checkpoint is already quantized (") +
                                                 quantization_method_name(config.quantization.method) + ")");
  DF_CHECK(!options.quantize_lm_head || !config.tie_word_embeddings,
           "--quantize-lm-head: this model ties its lm_head to the embedding, which stays 16-bit");
  // Block scales need whole blocks (as a stored block checkpoint does).
  const int side = format_info(options.quantize).scale_block;
  if (side == 0) return;
  for (const ExpectedTensor& tensor : expected_tensors(config))
    DF_CHECK(loaded_weight_format(config, tensor, options) == WeightFormat::bf16 ||
                 (tensor.shape[0] % side == 0 && tensor.shape[1] % side == 0),
             std::string("--quantize ") + weight_format_name(options.quantize) + ": " + tensor.name + " is " +
                 shape_text(tensor.shape) + ", not whole " + std::to_string(side) + "x" + std::to_string(side) +
                 " blocks");
}

WeightFormat block_weight_format(const ModelConfig& config, const WeightLoadOptions& options) {
  // Every block has the same tensors; formats differ between blocks only through an ignore list.
  for (const ExpectedTensor& tensor : expected_tensors(config)) {
    if (tensor.spec->scope != TensorScope::layer) continue;
    const WeightFormat format = loaded_weight_format(config, tensor, options);
    if (format != WeightFormat::bf16) return format;
  }
  return WeightFormat::bf16;
}

reference::DecoderWeights load_reference_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                                 const WeightLoadOptions& options) {
  validate_checkpoint(checkpoint, config);
  check_weight_load_options(config, options);
  reference::DecoderWeights weights;
  weights.layers.resize(config.num_hidden_layers);
  for (const ExpectedTensor& tensor : expected_tensors(config)) {
    const Checkpoint::Entry* entry = checkpoint.find(tensor.name);
    reference::TensorSet& set = tensor.spec->scope == TensorScope::layer ? weights.layers[tensor.layer] : weights.model;
    std::vector<float>& values = set[tensor.spec->role];
    if (stored_weight_format(config, tensor) != WeightFormat::bf16) {
      values = dequantize_fp8(checkpoint, config, tensor);
      continue;
    }
    values = to_float32(checkpoint.data(*entry), entry->info->dtype);
    if (const WeightFormat made = loaded_weight_format(config, tensor, options); made != WeightFormat::bf16)
      round_through_fp8(values, tensor.shape[0], tensor.shape[1], made);
  }
  return weights;
}

}  // namespace deepfuse
