// quantization_config parsing: what loads is accepted field by field, everything else is refused
// naming the field, so a checkpoint never runs with scales read the wrong way.
#include "model/quantization.hpp"

#include <algorithm>
#include <regex>

#include "deepfuse/error.hpp"

namespace deepfuse {

namespace {

using nlohmann::json;

// One JSON object of the quantization_config, with errors naming "<source>: field 'a.b.c'".
class Section {
 public:
  Section(const json& object, std::string source, std::string path)
      : object_(object), source_(std::move(source)), path_(std::move(path)) {}

  std::string where(const std::string& key) const { return source_ + ": field '" + path_ + "." + key + "'"; }
  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }
  const json& at(const char* key) const { return object_.at(key); }

  // Absent and null read as `fallback`.
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    DF_CHECK(at(key).is_string(), where(key) + " must be a string (got " + at(key).dump() + ")");
    return at(key).get<std::string>();
  }
  // The field, absent or null, or equal to `wanted`; otherwise "<field> = <value>: <why>".
  void expect(const char* key, const json& wanted, const std::string& why) const {
    if (!has(key)) return;
    DF_CHECK(at(key) == wanted, where(key) + " = " + at(key).dump() + ": " + why);
  }
  // Absent, null or empty ({} or []): a feature deepfuse does not run.
  void expect_empty(const char* key, const std::string& why) const {
    DF_CHECK(!has(key) || at(key).empty(), where(key) + " = " + at(key).dump() + ": " + why);
  }
  Section object(const char* key) const {
    DF_CHECK(has(key) && at(key).is_object(), where(key) + " must be an object");
    return Section(at(key), source_, path_ + "." + key);
  }
  std::vector<std::string> strings(const char* key) const {
    std::vector<std::string> list;
    if (!has(key)) return list;
    DF_CHECK(at(key).is_array(), where(key) + " must be a list of strings");
    for (const json& item : at(key)) {
      DF_CHECK(item.is_string(), where(key) + " must be a list of strings");
      list.push_back(item.get<std::string>());
    }
    return list;
  }
  const json& object_json() const { return object_; }

 private:
  const json& object_;
  std::string source_;
  std::string path_;
};

// compressed-tensors' "weights" of the one config group: 8-bit floats, symmetric, static, per
// channel or per tensor.
ScaleScope parse_compressed_weights(const Section& weights) {
  weights.expect("num_bits", 8, "only 8-bit float weights (FP8) load");
  weights.expect("type", "float", "only float (FP8) weights load, not integer ones");
  weights.expect("symmetric", true, "asymmetric (zero-point) weights do not load");
  weights.expect("dynamic", false, "dynamic weight quantization does not load");
  weights.expect_empty("group_size", "grouped weight scales do not load (per channel or per tensor only)");
  weights.expect_empty("block_structure", "block scales in compressed-tensors do not load (per channel or per tensor only)");
  const std::string strategy = weights.string("strategy", "tensor");
  if (strategy == "channel") return ScaleScope::channel;
  DF_CHECK(strategy == "tensor", weights.where("strategy") + " = \"" + strategy +
                                     "\": FP8 weight scales must be per \"channel\" or per \"tensor\"");
  return ScaleScope::tensor;
}

// The activations: absent (weight-only) or FP8 computed per token at run time. Static scales
// (input_scale tensors) would change the arithmetic and are refused.
void parse_compressed_activations(const Section& group) {
  group.expect_empty("output_activations", "output activation quantization does not load");
  if (!group.has("input_activations")) return;
  const Section input = group.object("input_activations");
  input.expect("dynamic", true, "static activation scales (input_scale) do not load; only dynamic per-token ones");
  input.expect("type", "float", "only FP8 activations load");
  input.expect("num_bits", 8, "only FP8 activations load");
}

WeightQuantization parse_compressed_tensors(const Section& config) {
  WeightQuantization q;
  q.method = QuantizationMethod::compressed_tensors;
  q.format = WeightFormat::fp8_e4m3;
  q.scale_name = "weight_scale";
  const std::string format = config.string("format", "float-quantized");
  DF_CHECK(format == "float-quantized" || format == "naive-quantized",
           config.where("format") + " = \"" + format + "\": only float-quantized (FP8) checkpoints load");
  const std::string status = config.string("quantization_status", "compressed");
  DF_CHECK(status == "compressed", config.where("quantization_status") + " = \"" + status +
                                       "\": only compressed checkpoints (FP8 bytes and their scales) load");
  config.expect_empty("sparsity_config", "sparse checkpoints do not load");
  config.expect_empty("transform_config", "transformed (rotated) checkpoints do not load");
  config.expect_empty("kv_cache_scheme", "a quantized KV cache is not supported (the KV cache is bf16)");
  const Section groups = config.object("config_groups");
  DF_CHECK(groups.object_json().size() == 1, config.where("config_groups") + " has " +
                                                 std::to_string(groups.object_json().size()) +
                                                 " groups: exactly one (every Linear) loads");
  const std::string name = groups.object_json().begin().key();
  const Section group = groups.object(name.c_str());
  const std::vector<std::string> targets = group.strings("targets");
  DF_CHECK(targets == std::vector<std::string>{"Linear"},
           group.where("targets") + ": only groups targeting [\"Linear\"] load");
  const std::string group_format = group.string("format", format);
  DF_CHECK(group_format == "float-quantized" || group_format == "naive-quantized",
           group.where("format") + " = \"" + group_format + "\": only float-quantized (FP8) groups load");
  q.scale_scope = parse_compressed_weights(group.object("weights"));
  parse_compressed_activations(group);
  q.ignore = config.strings("ignore");
  return q;
}

WeightQuantization parse_fp8(const Section& config) {
  WeightQuantization q;
  q.method = QuantizationMethod::fp8;
  q.ignore_by_substring = true;
  config.expect("fmt", "e4m3", "only e4m3 weights load");
  config.expect("activation_scheme", "dynamic", "static activation scales (input_scale) do not load");
  if (config.has("weight_block_size")) {
    config.expect("weight_block_size", json::array({128, 128}), "only 128x128 weight blocks load");
    q.format = WeightFormat::fp8_e4m3_block128;
    q.scale_scope = ScaleScope::block;
    q.scale_name = "weight_scale_inv";
  } else {
    q.format = WeightFormat::fp8_e4m3;
    q.scale_scope = ScaleScope::tensor;
    q.scale_name = "weight_scale";
  }
  for (const char* key : {"modules_to_not_convert", "ignored_layers"})
    for (const std::string& module : config.strings(key)) q.ignore.push_back(module);
  // transformers' FP8 quantizer never converts the output embedding, so these checkpoints keep
  // lm_head 16-bit without listing it (Qwen's and DeepSeek's FP8 releases list nothing).
  if (std::find(q.ignore.begin(), q.ignore.end(), "lm_head") == q.ignore.end()) q.ignore.push_back("lm_head");
  return q;
}

}  // namespace

const char* quantization_method_name(QuantizationMethod method) {
  switch (method) {
    case QuantizationMethod::none: return "none";
    case QuantizationMethod::compressed_tensors: return "compressed-tensors";
    case QuantizationMethod::fp8: return "fp8";
  }
  return "unknown";
}

bool quantizes_module(const WeightQuantization& q, const std::string& module) {
  if (!q.quantized()) return false;
  for (const std::string& entry : q.ignore) {
    if (entry.rfind("re:", 0) == 0) {
      // compressed-tensors matches from the start of the name (Python's re.match).
      if (std::regex_search(module, std::regex(entry.substr(3)), std::regex_constants::match_continuous)) return false;
    } else if (module == entry || (q.ignore_by_substring && module.find(entry) != std::string::npos)) {
      return false;
    }
  }
  return true;
}

WeightQuantization parse_quantization_config(const nlohmann::json& config, const std::string& source) {
  DF_CHECK(config.is_object(), source + ": field 'quantization_config' must be an object");
  const Section section(config, source, "quantization_config");
  DF_CHECK(section.has("quant_method"), section.where("quant_method") + " is missing");
  const std::string method = section.string("quant_method", "");
  if (method == "compressed-tensors") return parse_compressed_tensors(section);
  if (method == "fp8") return parse_fp8(section);
  throw Error(section.where("quant_method") + " = \"" + method +
              "\": this quantization does not load (supported: compressed-tensors FP8, fp8)");
}

}  // namespace deepfuse
