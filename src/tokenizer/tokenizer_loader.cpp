// Tokenizer::from_directory / from_json: tokenizer.json plus the tokenizer_config.json details
// Hugging Face transformers layers on top (BOS/EOS names, add_bos_token, the chat template).
#include <fstream>
#include <sstream>

#include "deepfuse/error.hpp"
#include "tokenizer/tokenizer_impl.hpp"

namespace deepfuse {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DF_CHECK(in.good(), "cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& name) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(name + ": invalid JSON: " + e.what());
  }
}

// bos_token / eos_token are a string or an AddedToken object {"content": ...}.
std::string token_name(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  throw Error(std::string("tokenizer_config.json: ") + key + " is neither a string nor {\"content\": ...}");
}

// chat_template is a string, or a list of {"name", "template"} of which "default" is the one.
std::string chat_template_from_config(const nlohmann::json& config) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& named : *it)
      if (named.value("name", "") == "default") return named.at("template").get<std::string>();
    if (!it->empty()) return it->at(0).at("template").get<std::string>();
  }
  throw Error("tokenizer_config.json: chat_template is neither a string nor a list of named templates");
}

void load_added_tokens(Tokenizer::Impl& impl, const nlohmann::json& added_tokens) {
  for (const auto& token : tokenizer::parse_added_tokens(added_tokens)) {
    impl.added_by_id[token.id] = token;
    impl.added_by_content[token.content] = token.id;
    if (!token.normalized) {
      impl.raw_matcher.add(token);
      continue;
    }
    // Matched inside normalized text, so matched in its normalized form (as HF does).
    tokenizer::AddedToken as_matched = token;
    if (impl.normalizer) impl.normalizer->normalize(as_matched.content);
    impl.normalized_matcher.add(as_matched);
  }
}

void load_config(Tokenizer::Impl& impl, const nlohmann::json& config, const Tokenizer& tokenizer) {
  impl.bos_token = token_name(config, "bos_token");
  impl.eos_token = token_name(config, "eos_token");
  if (!impl.bos_token.empty()) impl.bos_id = tokenizer.token_to_id(impl.bos_token);
  if (!impl.eos_token.empty()) impl.eos_id = tokenizer.token_to_id(impl.eos_token);
  // transformers' Llama/Mistral tokenizers rebuild the post-processor from these flags.
  const bool has_bos_flag = config.contains("add_bos_token") && config["add_bos_token"].is_boolean();
  const bool has_eos_flag = config.contains("add_eos_token") && config["add_eos_token"].is_boolean();
  if (has_bos_flag || has_eos_flag) {
    impl.frame = {};
    if (config.value("add_bos_token", false) && impl.bos_id) impl.frame.prefix.push_back(*impl.bos_id);
    if (config.value("add_eos_token", false) && impl.eos_id) impl.frame.suffix.push_back(*impl.eos_id);
  }
  impl.chat_template = chat_template_from_config(config);
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  const nlohmann::json spec = parse_json(tokenizer_json, "tokenizer.json");
  auto impl = std::make_unique<Impl>();
  try {
    const auto model = spec.find("model");
    if (model == spec.end() || !model->is_object()) throw Error("tokenizer.json: no \"model\" object");
    const std::string type = model->value("type", "BPE");
    if (type != "BPE") throw Error("tokenizer.json: model type '" + type + "' is not supported (only BPE)");
    impl->model = tokenizer::BpeModel::from_json(*model);
    impl->normalizer = tokenizer::make_normalizer(spec.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = tokenizer::make_pre_tokenizer(spec.value("pre_tokenizer", nlohmann::json()));
    impl->decoder = tokenizer::make_decoder(spec.value("decoder", nlohmann::json()));
    impl->frame = tokenizer::parse_post_processor(spec.value("post_processor", nlohmann::json()));
    load_added_tokens(*impl, spec.value("added_tokens", nlohmann::json()));
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("tokenizer.json: unexpected structure: ") + e.what());
  }

  Tokenizer tokenizer(std::move(impl));
  Impl& loaded = *tokenizer.impl_;
  if (!config_json.empty()) {
    try {
      load_config(loaded, parse_json(config_json, "tokenizer_config.json"), tokenizer);
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("tokenizer_config.json: unexpected structure: ") + e.what());
    }
  }
  // Without a config, the post-processor's first id is the BOS (Llama's "<s>" / "<|begin_of_text|>").
  if (!loaded.bos_id && !loaded.frame.prefix.empty()) {
    loaded.bos_id = loaded.frame.prefix.front();
    loaded.bos_token = tokenizer.id_to_token(*loaded.bos_id).value_or("");
  }
  if (loaded.eos_id) loaded.stop_ids.push_back(*loaded.eos_id);
  return tokenizer;
}

Tokenizer Tokenizer::from_directory(const std::filesystem::path& dir) {
  const auto tokenizer_path = dir / "tokenizer.json";
  DF_CHECK(std::filesystem::exists(tokenizer_path), "no tokenizer.json in " + dir.string());
  const auto config_path = dir / "tokenizer_config.json";
  const std::string config = std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  Tokenizer tokenizer = from_json(read_file(tokenizer_path), config);

  Impl& impl = *tokenizer.impl_;
  if (const auto jinja_path = dir / "chat_template.jinja"; std::filesystem::exists(jinja_path))
    impl.chat_template = read_file(jinja_path);
  // generation_config.json lists every id that ends a turn (Llama 3: <|eot_id|> too).
  if (const auto generation_path = dir / "generation_config.json"; std::filesystem::exists(generation_path)) {
    const nlohmann::json generation = parse_json(read_file(generation_path), "generation_config.json");
    if (const auto it = generation.find("eos_token_id"); it != generation.end()) {
      const auto add_stop = [&](const nlohmann::json& id) {
        if (!id.is_number_integer()) return;
        const auto value = id.get<TokenId>();
        if (std::find(impl.stop_ids.begin(), impl.stop_ids.end(), value) == impl.stop_ids.end()) impl.stop_ids.push_back(value);
      };
      if (it->is_array()) {
        for (const auto& id : *it) add_stop(id);
      } else {
        add_stop(*it);
      }
    }
  }
  return tokenizer;
}

}  // namespace deepfuse
