#include "server/api/openai_request.hpp"

#include <limits>

#include <nlohmann/json.hpp>

#include "server/api_error.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

// Typed access to optional fields: absent or null gives the default, a wrong type a 400.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}

  const json* get(const char* name) const {
    const auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  double number(const char* name, double fallback, double lo, double hi) const {
    const json* v = get(name);
    if (!v) return fallback;
    if (!v->is_number()) throw ApiError::bad_field(name, std::string("'") + name + "' must be a number");
    const double x = v->get<double>();
    if (x < lo || x > hi)
      throw ApiError::bad_field(name, std::string("'") + name + "' must be between " + format(lo) + " and " +
                                          format(hi) + ", got " + format(x));
    return x;
  }
  std::optional<int64_t> integer(const char* name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw ApiError::bad_field(name, std::string("'") + name + "' must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ApiError::bad_field(name, std::string("'") + name + "' is too large");
    return v->get<int64_t>();
  }
  int64_t integer(const char* name, int64_t fallback, int64_t lo, int64_t hi) const {
    const int64_t x = integer(name).value_or(fallback);
    if (x < lo || x > hi)
      throw ApiError::bad_field(name, std::string("'") + name + "' must be between " + std::to_string(lo) +
                                          " and " + std::to_string(hi) + ", got " + std::to_string(x));
    return x;
  }
  bool boolean(const char* name, bool fallback) const {
    const json* v = get(name);
    if (!v) return fallback;
    if (!v->is_boolean()) throw ApiError::bad_field(name, std::string("'") + name + "' must be a boolean");
    return v->get<bool>();
  }

 private:
  static std::string format(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& body_;
};

json parse_body(const std::string& body) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos)
      throw ApiError(400, "the request body is not valid UTF-8");
    throw ApiError(400, "the request body is not valid JSON: " + what.substr(what.find(']') + 2));
  }
  if (!parsed.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return parsed;
}

std::vector<int32_t> checked_ids(const json& array, const ServedModel& model, const char* param) {
  std::vector<int32_t> ids;
  for (const json& id : array) {
    if (!id.is_number_integer()) throw ApiError::bad_field(param, std::string("'") + param + "' token ids must be integers");
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= model.vocab_size)
      throw ApiError::bad_field(param, "token id " + std::to_string(value) + " is outside the vocabulary [0, " +
                                           std::to_string(model.vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

std::vector<int32_t> tokenize(const std::string& text, const ServedModel& model, const char* param) {
  if (!model.tokenizer)
    throw ApiError::bad_field(param, "this model has no tokenizer: send the prompt as an array of token ids");
  return model.tokenizer->encode(text, /*add_special_tokens=*/true);
}

// A string, an array of token ids, or a one-element array of either (OpenAI's batch form, with one
// prompt: several prompts per request are not served).
std::vector<int32_t> completion_prompt(const json& body, const ServedModel& model) {
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw ApiError::bad_field("prompt", "'prompt' is required");
  const json& prompt = *it;
  if (prompt.is_string()) return tokenize(prompt.get<std::string>(), model, "prompt");
  if (!prompt.is_array()) throw ApiError::bad_field("prompt", "'prompt' must be a string or an array of token ids");
  if (prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    if (prompt[0].is_string()) return tokenize(prompt[0].get<std::string>(), model, "prompt");
    return checked_ids(prompt[0], model, "prompt");
  }
  if (!prompt.empty() && (prompt[0].is_string() || prompt[0].is_array()))
    throw ApiError::bad_field("prompt", "one prompt per request: 'prompt' holds " + std::to_string(prompt.size()));
  return checked_ids(prompt, model, "prompt");
}

// Messages with string content, or content as an array of {"type": "text", "text"} parts.
std::vector<int32_t> chat_prompt(const json& body, const ServedModel& model) {
  const auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw ApiError::bad_field("messages", "'messages' is required");
  if (!it->is_array() || it->empty())
    throw ApiError::bad_field("messages", "'messages' must be a non-empty array of messages");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (const json& message : *it) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      throw ApiError::bad_field("messages", "each message must be an object with a string 'role'");
    std::string content;
    const json c = message.value("content", json(nullptr));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw ApiError::bad_field("messages", "message content parts must be {\"type\": \"text\", \"text\": ...}");
        content += part["text"].get<std::string>();
      }
    } else if (!c.is_null()) {
      throw ApiError::bad_field("messages", "message 'content' must be a string or an array of text parts");
    }
    messages.push_back({{"role", message["role"].get<std::string>()}, {"content", content}});
  }
  if (!model.tokenizer || !model.chat_template)
    throw ApiError::bad_field("messages", "this model has no chat template: use /v1/completions");
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.bos_token = model.tokenizer->bos_token();
  options.eos_token = model.tokenizer->eos_token();
  std::string rendered;
  try {
    rendered = model.chat_template->render(messages, options);
  } catch (const std::exception& e) {
    throw ApiError::bad_field("messages", std::string("the chat template failed: ") + e.what());
  }
  return model.tokenizer->encode_rendered_chat(rendered);
}

std::vector<std::string> stop_strings(const Fields& fields) {
  const json* stop = fields.get("stop");
  if (!stop) return {};
  if (stop->is_string()) return {stop->get<std::string>()};
  if (!stop->is_array() || stop->size() > 16)
    throw ApiError::bad_field("stop", "'stop' must be a string or an array of at most 16 strings");
  std::vector<std::string> out;
  for (const json& s : *stop) {
    if (!s.is_string()) throw ApiError::bad_field("stop", "'stop' must hold strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

OpenAiRequest parse_openai_request(Endpoint endpoint, const std::string& text, const ServedModel& model) {
  const json body = parse_body(text);
  const Fields fields(body);
  OpenAiRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::chat_completions;

  if (const json* name = fields.get("model")) {
    if (!name->is_string()) throw ApiError::bad_field("model", "'model' must be a string");
    if (name->get<std::string>() != model.name)
      throw ApiError(404, "The model '" + name->get<std::string>() + "' does not exist; this server serves '" +
                              model.name + "'", "model", "model_not_found");
  }
  GenerationSpec& spec = r.spec;
  spec.prompt = chat ? chat_prompt(body, model) : completion_prompt(body, model);
  const int prompt = static_cast<int>(spec.prompt.size());
  if (prompt == 0) throw ApiError::bad_field(chat ? "messages" : "prompt", "the prompt has no tokens");
  if (prompt >= model.max_context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(model.max_context) +
                            " tokens; the prompt has " + std::to_string(prompt) + " (leaving none to generate)",
                   chat ? "messages" : "prompt", "context_length_exceeded");

  const char* budget_field = chat && fields.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const std::optional<int64_t> max_tokens = fields.integer(budget_field);
  if (max_tokens && *max_tokens <= 0)
    throw ApiError::bad_field(budget_field, std::string("'") + budget_field + "' must be at least 1");
  // OpenAI's defaults: 16 for completions; chat runs to the end of the context.
  const int64_t budget = max_tokens.value_or(chat ? model.max_context - prompt : 16);
  if (prompt + budget > model.max_context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(model.max_context) +
                            " tokens. However, you requested " + std::to_string(prompt + budget) + " tokens (" +
                            std::to_string(prompt) + " in the prompt, " + std::to_string(budget) +
                            " in the completion)",
                   budget_field, "context_length_exceeded");
  spec.max_new_tokens = static_cast<int>(budget);

  spec.sampling.temperature = static_cast<float>(fields.number("temperature", 1.0, 0.0, 2.0));
  spec.sampling.top_p = static_cast<float>(fields.number("top_p", 1.0, 0.0, 1.0));
  if (spec.sampling.top_p <= 0.0f) throw ApiError::bad_field("top_p", "'top_p' must be greater than 0");
  const int64_t top_k = fields.integer("top_k", 0, -1, model.vocab_size);
  spec.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  spec.sampling.min_p = static_cast<float>(fields.number("min_p", 0.0, 0.0, 1.0));
  spec.sampling.seed = static_cast<uint64_t>(fields.integer("seed").value_or(0));
  spec.presence_penalty = static_cast<float>(fields.number("presence_penalty", 0.0, -2.0, 2.0));
  spec.frequency_penalty = static_cast<float>(fields.number("frequency_penalty", 0.0, -2.0, 2.0));
  if (!fields.boolean("ignore_eos", false)) spec.stop_ids = model.stop_ids;
  r.n = static_cast<int>(fields.integer("n", 1, 1, 16));
  if (const auto best_of = fields.integer("best_of"); best_of && *best_of != r.n)
    throw ApiError::bad_field("best_of", "'best_of' other than n is not supported");
  if (fields.boolean("echo", false)) throw ApiError::bad_field("echo", "'echo' is not supported");
  if (fields.get("suffix")) throw ApiError::bad_field("suffix", "'suffix' is not supported");
  r.stop_strings = stop_strings(fields);

  if (chat) {
    r.logprobs = fields.boolean("logprobs", false);
    const int64_t top = fields.integer("top_logprobs", 0, 0, 20);
    if (fields.get("top_logprobs") && !r.logprobs)
      throw ApiError::bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    spec.top_logprobs = r.logprobs ? static_cast<int>(top) : -1;
  } else if (fields.get("logprobs")) {
    spec.top_logprobs = static_cast<int>(fields.integer("logprobs", 0, 0, 20));
    r.logprobs = true;
  }

  r.stream = fields.boolean("stream", false);
  if (const json* options = fields.get("stream_options")) {
    if (!options->is_object()) throw ApiError::bad_field("stream_options", "'stream_options' must be an object");
    r.include_usage = Fields(*options).boolean("include_usage", false);
  }
  return r;
}

}  // namespace deepfuse::server
