// config.json / generation_config.json -> ModelConfig. Missing fields take the defaults of the
// transformers config class (LlamaConfig, Qwen2Config, MistralConfig); anything present must have
// the right type and a sane value, and anything deepfuse would silently compute wrong (other rope
// types, biased MLPs, Qwen2's per-layer sliding window) is rejected by name.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/model_config.hpp"
#include "model/quantization.hpp"

namespace deepfuse {

const char* architecture_name(Architecture architecture) {
  switch (architecture) {
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::mistral: return "MistralForCausalLM";
  }
  return "unknown";
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DF_CHECK(in.good(), path.string() + ": cannot open file");
  std::ostringstream text;
  text << in.rdbuf();
  DF_CHECK(!in.bad(), path.string() + ": read failed");
  return text.str();
}

namespace {

using nlohmann::json;

// Typed access to one JSON object's fields with errors that name the file and the field.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* name) const { return object_.contains(name) && !object_.at(name).is_null(); }
  const json& at(const char* name) const { return object_.at(name); }

  int integer(const char* name, std::optional<int> fallback, int64_t min, int64_t max) const {
    if (!has(name)) {
      DF_CHECK(fallback.has_value(), where(name) + " is missing");
      return *fallback;
    }
    const json& value = object_.at(name);
    DF_CHECK(value.is_number_integer(), where(name) + " must be an integer (got " + value.type_name() + ")");
    // Unsigned values above INT64_MAX read back negative, so the range check catches them too.
    const int64_t v = value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? -1
                          : value.get<int64_t>();
    DF_CHECK(v >= min && v <= max, where(name) + " = " + value.dump() + " is outside [" + std::to_string(min) +
                                       ", " + std::to_string(max) + "]");
    return static_cast<int>(v);
  }

  double number(const char* name, double fallback) const {
    if (!has(name)) return fallback;
    const json& value = object_.at(name);
    DF_CHECK(value.is_number(), where(name) + " must be a number (got " + value.type_name() + ")");
    return value.get<double>();
  }

  double required_number(const char* name) const {
    DF_CHECK(has(name), where(name) + " is missing");
    return number(name, 0.0);
  }

  bool boolean(const char* name, bool fallback) const {
    if (!has(name)) return fallback;
    const json& value = object_.at(name);
    DF_CHECK(value.is_boolean(), where(name) + " must be true or false (got " + value.type_name() + ")");
    return value.get<bool>();
  }

  std::string string(const char* name, const std::string& fallback) const {
    if (!has(name)) return fallback;
    const json& value = object_.at(name);
    DF_CHECK(value.is_string(), where(name) + " must be a string (got " + value.type_name() + ")");
    return value.get<std::string>();
  }

  // An id or a list of ids (eos_token_id takes both forms).
  std::vector<int32_t> token_ids(const char* name) const {
    if (!has(name)) return {};
    const json& value = object_.at(name);
    std::vector<int32_t> ids;
    auto add = [&](const json& id) {
      DF_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX,
               where(name) + " must be a token id or a list of token ids");
      ids.push_back(id.get<int32_t>());
    };
    if (value.is_array()) {
      for (const json& id : value) add(id);
    } else {
      add(value);
    }
    return ids;
  }

  Fields object(const char* name) const {
    const json& value = object_.at(name);
    DF_CHECK(value.is_object(), where(name) + " must be an object (got " + value.type_name() + ")");
    return Fields(value, source_, prefix_ + name + ".");
  }

  std::string where(const char* name) const { return source_ + ": field '" + prefix_ + name + "'"; }
  const std::string& source() const { return source_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

json parse_json_object(const std::string& text, const std::string& source) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(source + ": invalid JSON (" + e.what() + ")");
  }
  DF_CHECK(document.is_object(), source + ": expected a JSON object at the top level");
  return document;
}

Architecture parse_architecture(const Fields& fields) {
  std::string name;
  if (fields.has("architectures")) {
    const json& list = fields.at("architectures");
    DF_CHECK(list.is_array() && !list.empty() && list[0].is_string(),
             fields.where("architectures") + " must be a non-empty list of strings");
    name = list[0].get<std::string>();
  } else {
    DF_CHECK(fields.has("model_type"), fields.where("architectures") + " is missing (and so is 'model_type')");
    const std::string type = fields.string("model_type", "");
    name = type == "llama" ? "LlamaForCausalLM" : type == "qwen2" ? "Qwen2ForCausalLM"
         : type == "mistral" ? "MistralForCausalLM" : type;
  }
  for (Architecture a : {Architecture::llama, Architecture::qwen2, Architecture::mistral})
    if (name == architecture_name(a)) return a;
  throw Error(fields.where("architectures") + ": unsupported architecture '" + name +
              "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)");
}

// rope_theta at the top level (transformers 4.x) or inside rope_parameters (5.x); scaling under
// rope_scaling or rope_parameters with "rope_type" (or the older "type").
void parse_rope(const Fields& fields, ModelConfig& config) {
  config.rope.head_dim = config.head_dim;
  config.rope.theta = fields.number("rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!fields.has(key)) continue;
    const Fields rope = fields.object(key);
    config.rope.theta = rope.number("rope_theta", config.rope.theta);
    const std::string type = rope.has("rope_type") ? rope.string("rope_type", "") : rope.string("type", "default");
    if (type == "default") continue;
    DF_CHECK(type == "llama3", rope.where("rope_type") + ": unsupported rope type '" + type +
                                   "' (supported: default, llama3)");
    config.rope.llama3_scaling = true;
    config.rope.factor = rope.required_number("factor");
    config.rope.low_freq_factor = rope.required_number("low_freq_factor");
    config.rope.high_freq_factor = rope.required_number("high_freq_factor");
    config.rope.original_max_position = rope.integer("original_max_position_embeddings", std::nullopt, 1, 1 << 30);
    DF_CHECK(config.rope.factor > 0, rope.where("factor") + " must be positive");
    DF_CHECK(config.rope.low_freq_factor > 0 && config.rope.high_freq_factor > config.rope.low_freq_factor,
             rope.where("high_freq_factor") + " must exceed low_freq_factor, both positive");
  }
  DF_CHECK(config.rope.theta > 1.0, fields.where("rope_theta") + " must be greater than 1");
}

void parse_attention_variant(const Fields& fields, ModelConfig& config) {
  switch (config.architecture) {
    case Architecture::llama:
      config.qkv_bias = config.o_proj_bias = fields.boolean("attention_bias", false);
      DF_CHECK(!fields.boolean("mlp_bias", false), fields.where("mlp_bias") + ": biased MLPs are not supported");
      break;
    case Architecture::qwen2:
      config.qkv_bias = true;
      DF_CHECK(!fields.boolean("use_sliding_window", false),
               fields.where("use_sliding_window") + ": Qwen2's per-layer sliding window is not supported");
      break;
    case Architecture::mistral:
      config.sliding_window = fields.integer("sliding_window", 0, 0, INT32_MAX);
      break;
  }
  // transformers 5 lists each layer's attention kind; deepfuse runs one kind for all layers.
  if (fields.has("layer_types")) {
    const std::string expected = config.sliding_window > 0 ? "sliding_attention" : "full_attention";
    const nlohmann::json& types = fields.at("layer_types");
    DF_CHECK(types.is_array(), fields.where("layer_types") + " must be a list");
    for (const auto& type : types)
      DF_CHECK(type == expected, fields.where("layer_types") + ": every layer must be " + expected +
                                     " for this config (mixed attention kinds are not supported)");
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const json document = parse_json_object(json_text, source);
  const Fields fields(document, source);
  ModelConfig config;
  config.architecture = parse_architecture(fields);
  DF_CHECK(fields.string("hidden_act", "silu") == "silu",
           fields.where("hidden_act") + ": only silu (SwiGLU) is supported");
  config.vocab_size = fields.integer("vocab_size", std::nullopt, 1, 1 << 24);
  config.hidden_size = fields.integer("hidden_size", std::nullopt, 1, 1 << 16);
  config.intermediate_size = fields.integer("intermediate_size", std::nullopt, 1, 1 << 20);
  config.num_hidden_layers = fields.integer("num_hidden_layers", std::nullopt, 1, 1024);
  config.num_attention_heads = fields.integer("num_attention_heads", std::nullopt, 1, 1024);
  config.num_key_value_heads = fields.integer("num_key_value_heads", config.num_attention_heads, 1, 1024);
  DF_CHECK(config.num_attention_heads % config.num_key_value_heads == 0,
           fields.where("num_key_value_heads") + " must divide num_attention_heads");
  const bool head_dim_given = fields.has("head_dim");
  if (!head_dim_given)
    DF_CHECK(config.hidden_size % config.num_attention_heads == 0,
             fields.where("head_dim") + " is missing and hidden_size is not a multiple of num_attention_heads");
  config.head_dim = fields.integer("head_dim", config.hidden_size / config.num_attention_heads, 2, 1024);
  DF_CHECK(config.head_dim % 2 == 0, fields.where("head_dim") + " must be even (rotary pairs)");
  config.max_position_embeddings = fields.integer("max_position_embeddings", 2048, 1, 1 << 30);
  config.rms_norm_eps = fields.number("rms_norm_eps", 1e-6);
  DF_CHECK(config.rms_norm_eps > 0, fields.where("rms_norm_eps") + " must be positive");
  parse_rope(fields, config);
  parse_attention_variant(fields, config);
  config.tie_word_embeddings = fields.boolean("tie_word_embeddings", false);
  config.eos_token_ids = fields.token_ids("eos_token_id");
  if (fields.has("bos_token_id")) config.bos_token_id = fields.integer("bos_token_id", 0, 0, INT32_MAX);
  config.torch_dtype = fields.string("torch_dtype", fields.string("dtype", ""));
  if (fields.has("quantization_config"))
    config.quantization = parse_quantization_config(fields.at("quantization_config"), source);
  return config;
}

void parse_generation_config(const std::string& json_text, const std::string& source, ModelConfig& config) {
  const json document = parse_json_object(json_text, source);
  const Fields fields(document, source);
  GenerationDefaults& g = config.generation;
  if (fields.has("do_sample")) g.do_sample = fields.boolean("do_sample", false);
  if (fields.has("temperature")) g.temperature = static_cast<float>(fields.number("temperature", 1.0));
  if (fields.has("top_k")) g.top_k = fields.integer("top_k", 0, 0, INT32_MAX);
  if (fields.has("top_p")) g.top_p = static_cast<float>(fields.number("top_p", 1.0));
  if (fields.has("min_p")) g.min_p = static_cast<float>(fields.number("min_p", 0.0));
  if (fields.has("repetition_penalty"))
    g.repetition_penalty = static_cast<float>(fields.number("repetition_penalty", 1.0));
  g.eos_token_ids = fields.token_ids("eos_token_id");
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  const auto config_path = model_dir / "config.json";
  DF_CHECK(std::filesystem::is_regular_file(config_path), config_path.string() + ": not found");
  ModelConfig config = parse_model_config(read_text_file(config_path), config_path.string());
  const auto generation_path = model_dir / "generation_config.json";
  if (std::filesystem::exists(generation_path))
    parse_generation_config(read_text_file(generation_path), generation_path.string(), config);
  return config;
}

}  // namespace deepfuse
