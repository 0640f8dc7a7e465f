// FP8 checkpoint weights: format per tensor from quantization_config, scale checks, dequantization.
#include "model/fp8_weights.hpp"

#include <algorithm>
#include <cmath>

#include "deepfuse/error.hpp"
#include "core/float8.hpp"

namespace deepfuse {

namespace {

// "model.layers.0.mlp.down_proj.weight" -> "model.layers.0.mlp.down_proj".
std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  return weight_name.substr(0, weight_name.size() - suffix.size());
}

bool is_16_or_32_bit(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::BF16 || dtype == SafetensorsDType::F16 || dtype == SafetensorsDType::F32;
}

std::string where_is(const Checkpoint::Entry& entry, const std::string& name) {
  return entry.file->path().string() + ": tensor '" + name + "'";
}

// A 16-bit dtype where FP8 is expected, or the reverse: why, in words.
std::string format_mismatch(const ModelConfig& config, const ExpectedTensor& tensor, SafetensorsDType dtype,
                            WeightFormat format) {
  const WeightQuantization& q = config.quantization;
  const std::string has = " has dtype " + std::string(dtype_name(dtype));
  if (format != WeightFormat::bf16)
    return has + ", but quantization_config (" + quantization_method_name(q.method) + ") stores it as " +
           weight_format_name(format) + " (F8_E4M3; list the module in its ignore list to keep it 16-bit)";
  if (!q.quantized()) return has + ", but config.json has no quantization_config saying how it is scaled";
  if (!tensor.spec->formats.has(q.format)) return has + ", which this tensor cannot have (it stays 16-bit)";
  return has + ", but quantization_config's ignore list keeps this module 16-bit";
}

// Throws unless the scale tensor is present, shaped as `scale.shapes` allows, 16/32-bit, finite.
void check_scale(const Checkpoint& checkpoint, const ExpectedScale& scale, const std::string& weight_name) {
  const Checkpoint::Entry* entry = checkpoint.find(scale.name);
  DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + scale.name + "' (the scales of '" + weight_name + "')");
  const std::string where = where_is(*entry, scale.name);
  std::string allowed;
  for (const auto& shape : scale.shapes) allowed += (allowed.empty() ? "" : " or ") + shape_text(shape);
  DF_CHECK(std::find(scale.shapes.begin(), scale.shapes.end(), entry->info->shape) != scale.shapes.end(),
           where + " has shape " + shape_text(entry->info->shape) + ", the weight's scales need " + allowed);
  DF_CHECK(is_16_or_32_bit(entry->info->dtype),
           where + " has dtype " + dtype_name(entry->info->dtype) + " (scales must be BF16, F16 or F32)");
  const std::vector<float> values = to_float32(checkpoint.data(*entry), entry->info->dtype);
  for (size_t i = 0; i < values.size(); ++i)
    DF_CHECK(std::isfinite(values[i]), where + " holds a non-finite scale (" + std::to_string(values[i]) +
                                           ") at element " + std::to_string(i));
}

}  // namespace

std::optional<ExpectedScale> expected_scale(const ModelConfig& config, const ExpectedTensor& tensor) {
  const WeightFormat format = stored_weight_format(config, tensor);
  if (format == WeightFormat::bf16) return std::nullopt;
  const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
  ExpectedScale scale{module_of(tensor.name) + "." + config.quantization.scale_name, {}};
  switch (config.quantization.scale_scope) {
    case ScaleScope::channel: scale.shapes = {{rows, 1}}; break;
    case ScaleScope::tensor: scale.shapes = {{}, {1}}; break;
    case ScaleScope::block: {
      const ScaleShape blocks = scale_shape(format, static_cast<size_t>(rows), static_cast<size_t>(columns));
      scale.shapes = {{static_cast<int64_t>(blocks.rows), static_cast<int64_t>(blocks.columns)}};
      break;
    }
  }
  return scale;
}

void check_stored_weight(const Checkpoint& checkpoint, const ModelConfig& config, const ExpectedTensor& tensor) {
  const Checkpoint::Entry& entry = *checkpoint.find(tensor.name);
  const SafetensorsDType dtype = entry.info->dtype;
  const WeightFormat format = stored_weight_format(config, tensor);
  const bool dtype_fits = format == WeightFormat::bf16 ? is_16_or_32_bit(dtype) : dtype == SafetensorsDType::F8_E4M3;
  if (!dtype_fits) {
    DF_CHECK(is_16_or_32_bit(dtype) || dtype == SafetensorsDType::F8_E4M3 || dtype == SafetensorsDType::F8_E5M2,
             where_is(entry, tensor.name) + " has dtype " + dtype_name(dtype) +
                 " (weights are BF16, F16, F32, or F8_E4M3 with a quantization_config)");
    throw Error(where_is(entry, tensor.name) + format_mismatch(config, tensor, dtype, format));
  }
  const std::optional<ExpectedScale> scale = expected_scale(config, tensor);
  if (!scale) return;
  const int side = format_info(format).scale_block;
  if (side > 0)
    DF_CHECK(tensor.shape[0] % side == 0 && tensor.shape[1] % side == 0,
             where_is(entry, tensor.name) + " has shape " + shape_text(tensor.shape) + ", not a whole number of the " +
                 std::to_string(side) + "x" + std::to_string(side) + " blocks of weight_block_size");
  check_scale(checkpoint, *scale, tensor.name);
}

std::vector<float> stored_fp8_scales(const Checkpoint& checkpoint, const ModelConfig& config,
                                     const ExpectedTensor& tensor) {
  const Checkpoint::Entry& entry = *checkpoint.find(expected_scale(config, tensor)->name);
  std::vector<float> scales = to_float32(checkpoint.data(entry), entry.info->dtype);
  if (config.quantization.scale_scope == ScaleScope::tensor)
    scales.assign(static_cast<size_t>(tensor.shape[0]), scales[0]);
  return scales;
}

std::vector<float> dequantize_fp8(const Checkpoint& checkpoint, const ModelConfig& config,
                                  const ExpectedTensor& tensor) {
  const Checkpoint::Entry& weight = *checkpoint.find(tensor.name);
  const std::vector<float> scales = stored_fp8_scales(checkpoint, config, tensor);
  const std::span<const std::byte> bytes = checkpoint.data(weight);
  const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
  const int side = format_info(stored_weight_format(config, tensor)).scale_block;
  std::vector<float> out(static_cast<size_t>(rows * columns));
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < columns; ++i) {
      const float s = side > 0 ? scales[(o / side) * (columns / side) + i / side] : scales[o];
      const size_t k = static_cast<size_t>(o * columns + i);
      out[k] = float8_e4m3_to_float(std::to_integer<uint8_t>(bytes[k])) * s;
    }
  }
  return out;
}

std::vector<float> quantize_blocks_fp8(std::span<const float> weight, int64_t rows, int64_t columns, int side,
                                       std::span<uint8_t> out) {
  DF_CHECK(side > 0 && rows % side == 0 && columns % side == 0,
           "internal: a " + std::to_string(rows) + "x" + std::to_string(columns) + " weight is not whole " +
               std::to_string(side) + "-wide blocks");
  const int64_t block_columns = columns / side;
  std::vector<float> scales(static_cast<size_t>(rows / side * block_columns), 0.0f);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < columns; ++i) {
      float& absmax = scales[static_cast<size_t>(o / side * block_columns + i / side)];
      absmax = std::max(absmax, std::fabs(weight[static_cast<size_t>(o * columns + i)]));
    }
  for (float& s : scales) s = s > 0.0f ? s / kFloat8E4m3Max : 1.0f;
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < columns; ++i) {
      const size_t k = static_cast<size_t>(o * columns + i);
      out[k] = float_to_float8_e4m3(weight[k] / scales[static_cast<size_t>(o / side * block_columns + i / side)]);
    }
  return scales;
}

void round_through_fp8(std::span<float> weight, int64_t rows, int64_t columns, WeightFormat format) {
  const int side = format_info(format).scale_block;
  if (side == 0) {
    quantize_rows_fp8(weight, rows, columns);
    return;
  }
  std::vector<uint8_t> bytes(weight.size());
  const std::vector<float> scales = quantize_blocks_fp8(weight, rows, columns, side, bytes);
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t i = 0; i < columns; ++i) {
      const size_t k = static_cast<size_t>(o * columns + i);
      weight[k] = float8_e4m3_to_float(bytes[k]) * scales[static_cast<size_t>(o / side * (columns / side) + i / side)];
    }
}

}  // namespace deepfuse
