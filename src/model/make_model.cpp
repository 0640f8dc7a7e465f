// Presets, config.json writing and seeded random checkpoints (single file or sharded).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "core/float16.hpp"
#include "core/float8.hpp"
#include "model/fp8_weights.hpp"

namespace deepfuse {

namespace {

struct PresetDims {
  Architecture architecture;
  int vocab, hidden, intermediate, layers, heads, kv_heads, max_position;
  double rope_theta, rms_norm_eps;
  bool tied;
  int bos, eos;
};

ModelConfig config_from(const PresetDims& d) {
  ModelConfig c;
  c.architecture = d.architecture;
  c.vocab_size = d.vocab;
  c.hidden_size = d.hidden;
  c.intermediate_size = d.intermediate;
  c.num_hidden_layers = d.layers;
  c.num_attention_heads = d.heads;
  c.num_key_value_heads = d.kv_heads;
  c.head_dim = d.hidden / d.heads;
  c.max_position_embeddings = d.max_position;
  c.rms_norm_eps = d.rms_norm_eps;
  c.rope.head_dim = c.head_dim;
  c.rope.theta = d.rope_theta;
  c.tie_word_embeddings = d.tied;
  c.qkv_bias = d.architecture == Architecture::qwen2;
  c.bos_token_id = d.bos;
  c.eos_token_ids = {d.eos};
  return c;
}

// Values with roughly the statistics of trained weights (the table's TensorInit), so activations
// stay O(1) at any size.
float random_scale(const ExpectedTensor& tensor) {
  switch (tensor.spec->init) {
    case TensorInit::embedding: return 1.0f;
    case TensorInit::norm:                                  // around 1
    case TensorInit::bias: return 0.1f;
    case TensorInit::linear: return std::sqrt(3.0f / static_cast<float>(tensor.shape[1]));  // std 1/sqrt(fan_in)
  }
  return 0.0f;
}

// One tensor of a file: a table tensor's values, or for an FP8 projection its e4m3 codes or
// their scales (both from the same draw).
enum class Part { values, fp8_codes, fp8_scales };

struct PlannedTensor {
  const ExpectedTensor* tensor;
  size_t index;  // the table tensor's position: its random stream
  Part part;
  std::string name;
  SafetensorsDType dtype;
  std::vector<int64_t> shape;
  WeightFormat format = WeightFormat::bf16;              // an FP8 part's
  SafetensorsDType scale_dtype = SafetensorsDType::BF16;  // an FP8 part's scales, as stored
};

uint64_t byte_size(const PlannedTensor& planned) {
  uint64_t bytes = dtype_size(planned.dtype);
  for (int64_t extent : planned.shape) bytes *= static_cast<uint64_t>(extent);
  return bytes;
}

// compressed-tensors stores its scales in the weights' 16-bit dtype (BF16 here); fp8's
// weight_scale_inv is F32, as transformers and DeepSeek write it.
SafetensorsDType scale_dtype_of(const WeightQuantization& q) {
  return q.method == QuantizationMethod::fp8 ? SafetensorsDType::F32 : SafetensorsDType::BF16;
}

// The files' tensors in model order, each FP8 projection followed by its scales. Throws naming
// the first projection that is not whole scale blocks.
std::vector<PlannedTensor> plan_tensors(const ModelConfig& config, const std::vector<ExpectedTensor>& tensors,
                                        SafetensorsDType dtype) {
  std::vector<PlannedTensor> planned;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::optional<ExpectedScale> scale = expected_scale(config, tensors[i]);
    if (!scale) {
      planned.push_back({&tensors[i], i, Part::values, tensors[i].name, dtype, tensors[i].shape});
      continue;
    }
    const WeightFormat format = stored_weight_format(config, tensors[i]);
    const int64_t side = format_info(format).scale_block;
    DF_CHECK(side == 0 || (tensors[i].shape[0] % side == 0 && tensors[i].shape[1] % side == 0),
             "make-model: " + tensors[i].name + " is " + shape_text(tensors[i].shape) + ", not whole " +
                 std::to_string(side) + "x" + std::to_string(side) + " blocks (" + weight_format_name(format) +
                 " needs hidden, intermediate, heads x head_dim and kv-heads x head_dim in multiples of " +
                 std::to_string(side) + ")");
    const SafetensorsDType scales = scale_dtype_of(config.quantization);
    planned.push_back({&tensors[i], i, Part::fp8_codes, tensors[i].name, SafetensorsDType::F8_E4M3, tensors[i].shape,
                       format, scales});
    planned.push_back({&tensors[i], i, Part::fp8_scales, scale->name, scales, scale->shapes.front(), format, scales});
  }
  return planned;
}

void append_value(std::vector<char>& chunk, float value, SafetensorsDType dtype) {
  const size_t at = chunk.size();
  chunk.resize(at + dtype_size(dtype));
  if (dtype == SafetensorsDType::F32) {
    std::memcpy(chunk.data() + at, &value, 4);
  } else {
    const uint16_t bits = dtype == SafetensorsDType::BF16 ? float_to_bf16_bits(value) : float_to_half_bits(value);
    std::memcpy(chunk.data() + at, &bits, 2);
  }
}

float stored_as(float value, SafetensorsDType dtype) {
  return dtype == SafetensorsDType::BF16 ? bf16_bits_to_float(float_to_bf16_bits(value)) : value;
}

// The scales of one band of rows (values: rows x `columns`), one per `width` columns: each the
// absmax / 448 (1 where all zero) as stored, so codes times the stored scale is the weight.
std::vector<float> band_scales(const std::vector<float>& values, size_t columns, size_t width, SafetensorsDType dtype) {
  std::vector<float> absmax(columns / width, 0.0f);
  for (size_t k = 0; k < values.size(); ++k)
    absmax[(k % columns) / width] = std::max(absmax[(k % columns) / width], std::fabs(values[k]));
  for (float& m : absmax) m = stored_as(m > 0.0f ? m / kFloat8E4m3Max : 1.0f, dtype);
  return absmax;
}

void write_random_tensor(std::ofstream& out, const PlannedTensor& planned, uint64_t seed) {
  const ExpectedTensor& tensor = *planned.tensor;
  std::mt19937_64 rng(seed ^ ((planned.index + 1) * 0x9e3779b97f4a7c15ull));
  const float scale = random_scale(tensor);
  std::uniform_real_distribution<float> dist(-scale, scale);
  const float offset = tensor.spec->init == TensorInit::norm ? 1.0f : 0.0f;
  // FP8 a band of the rows one scale spans at a time (one row per channel, 128 per block), the
  // same numbers in the same order as the 16-bit tensor's chunks of up to 1M values.
  const uint64_t columns = static_cast<uint64_t>(tensor.shape.back());
  const int side = format_info(planned.format).scale_block;
  const uint64_t band = planned.part == Part::values ? 1 << 20 : columns * (side > 0 ? side : 1);
  const size_t scale_width = side > 0 ? static_cast<size_t>(side) : static_cast<size_t>(columns);
  uint64_t remaining = 1;
  for (int64_t extent : tensor.shape) remaining *= static_cast<uint64_t>(extent);
  std::vector<float> values;
  std::vector<char> chunk;
  while (remaining > 0) {
    values.resize(static_cast<size_t>(std::min(remaining, band)));
    for (float& value : values) value = offset + dist(rng);
    remaining -= values.size();
    chunk.clear();
    if (planned.part == Part::values) {
      for (float value : values) append_value(chunk, value, planned.dtype);
    } else {
      const std::vector<float> scales = band_scales(values, static_cast<size_t>(columns), scale_width, planned.scale_dtype);
      if (planned.part == Part::fp8_scales) {
        for (float s : scales) append_value(chunk, s, planned.scale_dtype);
      } else {
        for (size_t k = 0; k < values.size(); ++k)
          chunk.push_back(static_cast<char>(float_to_float8_e4m3(values[k] / scales[(k % columns) / scale_width])));
      }
    }
    out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  }
}

// One safetensors file holding `tensors` (indices into `all`), in order, with random data.
void write_shard(const std::filesystem::path& path, const std::vector<PlannedTensor>& all,
                 const std::vector<size_t>& tensors, const MakeModelOptions& options) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t i : tensors) {
    const uint64_t bytes = byte_size(all[i]);
    header[all[i].name] = {{"dtype", dtype_name(all[i].dtype)}, {"shape", all[i].shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned, as safetensors pads
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DF_CHECK(out.good(), path.string() + ": cannot create file");
  const uint64_t length = text.size();
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>(length >> (8 * b) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (size_t i : tensors) write_random_tensor(out, all[i], options.seed);
  DF_CHECK(out.good(), path.string() + ": write failed");
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  DF_CHECK(out.good(), path.string() + ": write failed");
}

// config.json's quantization_config for what fp8_checkpoint_quantization makes, as the
// checkpoints users download have it: compressed-tensors per channel (llm-compressor's), or fp8
// 128x128 blocks (Qwen's and DeepSeek's FP8 releases: no module list, transformers keeps lm_head).
nlohmann::ordered_json quantization_config_json(const WeightQuantization& q) {
  DF_CHECK(q.ignore == std::vector<std::string>{"lm_head"},
           "make-model writes FP8 checkpoints whose ignore list is lm_head alone");
  if (q.method == QuantizationMethod::fp8 && q.scale_scope == ScaleScope::block)
    return {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
            {"weight_block_size", {format_info(q.format).scale_block, format_info(q.format).scale_block}}};
  DF_CHECK(q.method == QuantizationMethod::compressed_tensors && q.scale_scope == ScaleScope::channel,
           "make-model writes compressed-tensors per-channel or fp8 block FP8 only");
  const nlohmann::ordered_json fp8 = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}};
  nlohmann::ordered_json weights = fp8, input = fp8;
  weights["strategy"] = "channel";
  weights["dynamic"] = false;
  input["strategy"] = "token";
  input["dynamic"] = true;
  return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}, {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", input},
                                          {"output_activations", nullptr}, {"format", "float-quantized"}}}}},
          {"ignore", q.ignore}, {"kv_cache_scheme", nullptr}, {"sparsity_config", nlohmann::ordered_json::object()}};
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny", "llama3.2-1b", "llama3-8b", "qwen2.5-7b", "mistral-7b"};
}

ModelConfig model_preset(const std::string& name) {
  using A = Architecture;
  if (name == "tiny") {
    // Vocabulary of 320: the 256 byte tokens, 59 merges and 5 specials of the tokenizer
    // `deepfuse make-model` writes next to it (which also renumbers BOS/EOS to its specials).
    ModelConfig c = config_from({A::llama, 320, 64, 128, 2, 4, 2, 512, 10000.0, 1e-5, false, 1, 2});
    return c;
  }
  if (name == "llama3.2-1b") {
    ModelConfig c = config_from({A::llama, 128256, 2048, 8192, 16, 32, 8, 131072, 500000.0, 1e-5, true, 128000, 128001});
    c.rope.llama3_scaling = true;
    c.rope.factor = 32.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position = 8192;
    return c;
  }
  if (name == "llama3-8b")
    return config_from({A::llama, 128256, 4096, 14336, 32, 32, 8, 8192, 500000.0, 1e-5, false, 128000, 128001});
  if (name == "qwen2.5-7b")
    return config_from({A::qwen2, 152064, 3584, 18944, 28, 28, 4, 32768, 1000000.0, 1e-6, false, 151643, 151645});
  if (name == "mistral-7b") {
    ModelConfig c = config_from({A::mistral, 32000, 4096, 14336, 32, 32, 8, 32768, 10000.0, 1e-5, false, 1, 2});
    c.sliding_window = 4096;
    return c;
  }
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown model preset '" + name + "' (known: " + known + ")");
}

std::string model_config_json(const ModelConfig& c, SafetensorsDType dtype) {
  static const char* model_types[] = {"llama", "qwen2", "mistral"};
  nlohmann::ordered_json j;
  j["architectures"] = {architecture_name(c.architecture)};
  j["model_type"] = model_types[static_cast<int>(c.architecture)];
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.llama3_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", c.rope.factor},
                         {"low_freq_factor", c.rope.low_freq_factor}, {"high_freq_factor", c.rope.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.original_max_position}};
  if (c.architecture == Architecture::llama) j["attention_bias"] = c.qkv_bias;
  if (c.architecture == Architecture::qwen2) j["use_sliding_window"] = false;
  if (c.architecture == Architecture::mistral)
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = dtype == SafetensorsDType::BF16 ? "bfloat16" : dtype == SafetensorsDType::F16 ? "float16" : "float32";
  if (c.quantization.quantized()) j["quantization_config"] = quantization_config_json(c.quantization);
  return j.dump(2) + "\n";
}

WeightQuantization fp8_checkpoint_quantization(WeightFormat format) {
  WeightQuantization q;
  q.format = format;
  q.ignore = {"lm_head"};
  if (format == WeightFormat::fp8_e4m3) {
    q.method = QuantizationMethod::compressed_tensors;
    q.scale_scope = ScaleScope::channel;
    q.scale_name = "weight_scale";
    return q;
  }
  DF_CHECK(format == WeightFormat::fp8_e4m3_block128,
           std::string("make-model writes FP8 checkpoints in fp8_e4m3 or fp8_e4m3_block128, not ") +
               weight_format_name(format));
  q.method = QuantizationMethod::fp8;
  q.scale_scope = ScaleScope::block;
  q.scale_name = "weight_scale_inv";
  q.ignore_by_substring = true;
  return q;
}

void write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                             const MakeModelOptions& options) {
  DF_CHECK(options.dtype == SafetensorsDType::BF16 || options.dtype == SafetensorsDType::F16 ||
               options.dtype == SafetensorsDType::F32,
           std::string("make-model: dtype ") + dtype_name(options.dtype) + " is not a weight dtype (BF16, F16, F32)");
  // Whatever we write must load: run the config through the same parser the loader uses first.
  const std::string config_text = model_config_json(config, options.dtype);
  parse_model_config(config_text, (dir / "config.json").string());
  const std::vector<ExpectedTensor> table_tensors = expected_tensors(config);
  const std::vector<PlannedTensor> tensors = plan_tensors(config, table_tensors, options.dtype);
  DF_CHECK(options.shards >= 1 && static_cast<size_t>(options.shards) <= tensors.size(),
           "make-model: shards must be between 1 and the tensor count (" + std::to_string(tensors.size()) + ")");

  std::filesystem::create_directories(dir);
  write_text(dir / "config.json", config_text);
  if (options.shards == 1) {
    std::vector<size_t> all(tensors.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    write_shard(dir / "model.safetensors", tensors, all, options);
    return;
  }
  // Contiguous runs of tensors, equal in count, as save_pretrained keeps model order.
  nlohmann::ordered_json index;
  uint64_t total = 0;
  for (int s = 0; s < options.shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, options.shards);
    std::vector<size_t> members;
    for (size_t i = tensors.size() * s / options.shards; i < tensors.size() * (s + 1) / options.shards; ++i) {
      members.push_back(i);
      index["weight_map"][tensors[i].name] = name;
      total += byte_size(tensors[i]);
    }
    write_shard(dir / name, tensors, members, options);
  }
  index["metadata"] = {{"total_size", total}};
  write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace deepfuse
