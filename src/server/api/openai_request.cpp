#include "server/api/openai_request.hpp"

#include <limits>

#include <nlohmann/json.hpp>

#include "server/api/chat_messages.hpp"
#include "server/api/request_fields.hpp"
#include "server/api_error.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

// What the server does with each top-level field OpenAI defines for the two endpoints, and with
// the extensions it serves (top_k, min_p, ignore_eos, as vLLM names them; speculative, deepfuse's
// per-request opt-out of --speculative). A field outside the table is refused as unknown; a
// `refused` one is refused by name whenever it is given, because it would change the answer and is
// not implemented; `metadata` ones are checked and accepted (they do not change the answer).
enum class FieldUse { read, metadata, refused };
struct RequestFieldRule {
  const char* name;
  bool completions, chat;
  FieldUse use;
  const char* refusal;  // why, for `refused`
};
constexpr RequestFieldRule kRequestFields[] = {
    {"model", true, true, FieldUse::read, nullptr},
    {"prompt", true, false, FieldUse::read, nullptr},
    {"messages", false, true, FieldUse::read, nullptr},
    {"max_tokens", true, true, FieldUse::read, nullptr},
    {"max_completion_tokens", false, true, FieldUse::read, nullptr},
    {"temperature", true, true, FieldUse::read, nullptr},
    {"top_p", true, true, FieldUse::read, nullptr},
    {"n", true, true, FieldUse::read, nullptr},
    {"seed", true, true, FieldUse::read, nullptr},
    {"stop", true, true, FieldUse::read, nullptr},
    {"stream", true, true, FieldUse::read, nullptr},
    {"stream_options", true, true, FieldUse::read, nullptr},
    {"presence_penalty", true, true, FieldUse::read, nullptr},
    {"frequency_penalty", true, true, FieldUse::read, nullptr},
    {"logprobs", true, true, FieldUse::read, nullptr},
    {"top_logprobs", false, true, FieldUse::read, nullptr},
    {"logit_bias", true, true, FieldUse::read, nullptr},
    {"best_of", true, false, FieldUse::read, nullptr},
    {"echo", true, false, FieldUse::read, nullptr},
    {"suffix", true, false, FieldUse::read, nullptr},
    {"modalities", false, true, FieldUse::read, nullptr},
    {"response_format", true, true, FieldUse::read, nullptr},
    {"tools", false, true, FieldUse::read, nullptr},
    {"tool_choice", false, true, FieldUse::read, nullptr},
    {"parallel_tool_calls", false, true, FieldUse::read, nullptr},
    {"top_k", true, true, FieldUse::read, nullptr},
    {"min_p", true, true, FieldUse::read, nullptr},
    {"ignore_eos", true, true, FieldUse::read, nullptr},
    {"speculative", true, true, FieldUse::read, nullptr},
    {"user", true, true, FieldUse::metadata, nullptr},
    {"metadata", false, true, FieldUse::metadata, nullptr},
    {"store", false, true, FieldUse::metadata, nullptr},
    {"service_tier", false, true, FieldUse::metadata, nullptr},
    {"safety_identifier", false, true, FieldUse::metadata, nullptr},
    {"prompt_cache_key", false, true, FieldUse::metadata, nullptr},
    {"audio", false, true, FieldUse::refused, "is not supported: this server generates text"},
    {"prediction", false, true, FieldUse::refused, "(predicted outputs) is not supported"},
    {"functions", false, true, FieldUse::refused, "is deprecated and not supported: use 'tools'"},
    {"function_call", false, true, FieldUse::refused, "is deprecated and not supported: use 'tool_choice'"},
    {"reasoning_effort", false, true, FieldUse::refused, "is not supported: the models served here do not reason"},
    {"verbosity", false, true, FieldUse::refused, "is not supported"},
    {"web_search_options", false, true, FieldUse::refused, "is not supported: this server has no web search"},
};

// Unknown and refused fields, then the metadata fields' types.
void check_field_names(const json& body, bool chat) {
  for (const auto& [key, value] : body.items()) {
    const RequestFieldRule* rule = nullptr;
    for (const RequestFieldRule& r : kRequestFields)
      if (key == r.name && (chat ? r.chat : r.completions)) rule = &r;
    if (!rule) throw_unknown(key);
    if (rule->use == FieldUse::refused && !value.is_null()) throw_unsupported(key, rule->refusal);
  }
  const Fields fields(body, "");
  if (const json* user = fields.get("user")) checked_string(*user, "user");
  if (const json* id = fields.get("safety_identifier")) checked_string(*id, "safety_identifier");
  if (const json* key = fields.get("prompt_cache_key")) checked_string(*key, "prompt_cache_key");
  fields.boolean("store", false);
  if (const json* tier = fields.get("service_tier")) {
    const std::string& value = checked_string(*tier, "service_tier");
    if (value != "auto" && value != "default" && value != "flex" && value != "scale" && value != "priority")
      throw_not_one_of("service_tier", value, {"auto", "default", "flex", "scale", "priority"});
  }
  // OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512.
  if (const json* metadata = fields.get("metadata")) {
    checked_object(*metadata, "metadata");
    if (metadata->size() > 16) throw_invalid_value("metadata", "at most 16 key-value pairs.");
    for (const auto& [key, value] : metadata->items()) {
      if (key.size() > 64) throw_invalid_value("metadata", "keys are at most 64 characters.");
      if (checked_string(value, param_member("metadata", key)).size() > 512)
        throw_invalid_value(param_member("metadata", key), "values are at most 512 characters.");
    }
  }
}

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

std::vector<int32_t> checked_ids(const json& array, const ServedModel& model, const std::string& param) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < array.size(); ++i) {
    const int64_t id = checked_integer(array[i], param_element(param, i), std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max());
    if (id < 0 || id >= model.vocab_size)
      throw ApiError::bad_field(param, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                           std::to_string(model.vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<int32_t> tokenize(const std::string& text, const ServedModel& model) {
  if (!model.tokenizer)
    throw ApiError::bad_field("prompt", "this model has no tokenizer: send the prompt as an array of token ids");
  return model.tokenizer->encode(text, /*add_special_tokens=*/true);
}

// A string, an array of token ids, or a one-element array of either (OpenAI's batch form, with one
// prompt: several prompts per request are not served).
std::vector<int32_t> completion_prompt(const json& body, const ServedModel& model) {
  const json& prompt = Fields(body, "").required("prompt");
  if (prompt.is_string()) return tokenize(prompt.get<std::string>(), model);
  if (!prompt.is_array())
    throw_invalid_type("prompt", "a string, an array of strings, or an array of token ids", prompt);
  if (prompt.size() == 1 && prompt[0].is_string()) return tokenize(prompt[0].get<std::string>(), model);
  if (prompt.size() == 1 && prompt[0].is_array()) return checked_ids(prompt[0], model, "prompt");
  if (!prompt.empty() && (prompt[0].is_string() || prompt[0].is_array()))
    throw_unsupported("prompt", "with " + std::to_string(prompt.size()) + " prompts is not supported: one per request");
  return checked_ids(prompt, model, "prompt");
}

std::vector<int32_t> chat_prompt(const json& body, const ServedModel& model, const ToolRequest& tools) {
  const nlohmann::ordered_json messages = checked_chat_messages(body);
  if (!model.tokenizer || !model.chat_template)
    throw ApiError::bad_field("messages", "this model has no chat template: use /v1/completions");
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  if (!tools.tools.is_null()) options.extra_context["tools"] = tools.tools;
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

// A string or an array of up to 4 non-empty strings.
std::vector<std::string> stop_strings(const Fields& fields) {
  const json* stop = fields.get("stop");
  if (!stop) return {};
  if (!stop->is_string() && !stop->is_array()) throw_invalid_type("stop", "a string or an array of strings", *stop);
  const json array = stop->is_string() ? json::array({*stop}) : *stop;
  if (array.size() > 4)
    throw ApiError(400, "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array "
                        "with length " + std::to_string(array.size()) + " instead.", "stop", "array_above_max_length");
  std::vector<std::string> out;
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string param = stop->is_string() ? "stop" : param_element("stop", i);
    out.push_back(checked_string(array[i], param));
    if (out.back().empty()) throw_invalid_value(param, "a stop sequence must not be empty.");
  }
  return out;
}

// Biases change the answer and are not implemented: an empty map is the only one accepted, and a
// map is checked first (token ids as strings inside the vocabulary, biases in [-100, 100]) so a
// malformed one gets the error that names its fault.
void check_logit_bias(const Fields& fields, const ServedModel& model) {
  const json* bias = fields.get("logit_bias");
  if (!bias) return;
  for (const auto& [key, value] : checked_object(*bias, "logit_bias").items()) {
    const std::string param = param_member("logit_bias", key);
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
    }
    if (used != key.size() || id < 0 || id >= model.vocab_size)
      throw_invalid_value(param, "keys must be token ids in [0, " + std::to_string(model.vocab_size) + ").");
    checked_number(value, param, -100, 100);
  }
  if (!bias->empty()) throw_unsupported("logit_bias", "is not supported: the sampler applies no per-token bias");
}

// `modalities`: text only.
void check_modalities(const Fields& fields) {
  if (const json* modalities = fields.get("modalities")) {
    for (size_t i = 0; i < checked_array(*modalities, "modalities").size(); ++i) {
      const std::string& m = checked_string((*modalities)[i], param_element("modalities", i));
      if (m == "audio") throw_unsupported("modalities", "with 'audio' is not supported: this server generates text");
      if (m != "text") throw_not_one_of(param_element("modalities", i), m, {"text", "audio"});
    }
  }
}

StructuredOutput& structured_output(const ServedModel& model, const std::string& param) {
  if (!model.structured_output)
    throw_unsupported(param, "is not supported by this model: structured output needs its tokenizer");
  return *model.structured_output;
}

// `response_format`: text (no grammar), json_object or json_schema ({name, description, schema,
// strict}; strict or not, the schema is enforced).
std::shared_ptr<const OutputGrammar> response_format_grammar(const Fields& fields, const ServedModel& model) {
  const json* format = fields.get("response_format");
  if (!format) return nullptr;
  const Fields f(checked_object(*format, "response_format"), "response_format");
  const std::string& type = checked_string(f.required("type"), f.param("type"));
  if (type == "text") {
    f.only({"type"});
    return nullptr;
  }
  if (type == "json_object") {
    f.only({"type"});
    return structured_output(model, "response_format").json_object();
  }
  if (type != "json_schema") throw_not_one_of(f.param("type"), type, {"text", "json_object", "json_schema"});
  f.only({"type", "json_schema"});
  const Fields s(checked_object(f.required("json_schema"), f.param("json_schema")), f.param("json_schema"));
  s.only({"name", "description", "schema", "strict"});
  const std::string& name = checked_string(s.required("name"), s.param("name"));
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    throw_invalid_value(s.param("name"), "'" + name + "' does not match '^[a-zA-Z0-9_-]{1,64}$'.");
  if (const json* d = s.get("description")) checked_string(*d, s.param("description"));
  s.boolean("strict", false);
  StructuredOutput& output = structured_output(model, "response_format");
  const json* schema = s.get("schema");
  return schema ? output.json_schema(checked_object(*schema, s.param("schema")), s.param("schema"))
                : output.json_object();
}

// The grammar the answer follows: the response format's, or one tool call's when tool_choice
// forces a call.
std::shared_ptr<const OutputGrammar> answer_grammar(const Fields& fields, const json& body, const ServedModel& model,
                                                    const ToolRequest& tools, std::string& field) {
  std::shared_ptr<const OutputGrammar> grammar = response_format_grammar(fields, model);
  field = "response_format";
  if (!tools.required) return grammar;
  if (grammar)
    throw_invalid_value("response_format", "a JSON response format cannot be combined with a 'tool_choice' that "
                                           "forces a tool call.");
  field = "tool_choice";
  return structured_output(model, "tool_choice").tool_call(model.tool_format, body.at("tools"), tools.named);
}

}  // namespace

void set_chat_side(ServedModel& model, const Tokenizer* tokenizer, const ChatTemplate* chat_template,
                   const std::string& tool_call_parser) {
  model.tokenizer = tokenizer;
  model.chat_template = chat_template;
  model.tool_format = ToolCallFormat::none;
  model.tool_marker_ids.clear();
  if (!tokenizer || !chat_template) return;
  model.tool_format = tool_call_parser == "auto" ? detect_tool_call_format(tokenizer->chat_template())
                                                 : tool_call_format_named(tool_call_parser);
  model.tool_marker_ids = tool_call_marker_ids(model.tool_format, *tokenizer);
}

OpenAiRequest parse_openai_request(Endpoint endpoint, const std::string& text, const ServedModel& model) {
  const json body = parse_body(text);
  const bool chat = endpoint == Endpoint::chat_completions;
  check_field_names(body, chat);
  const Fields fields(body, "");
  OpenAiRequest r;
  r.endpoint = endpoint;

  if (const json* name = fields.get("model")) {
    if (checked_string(*name, "model") != model.name)
      throw ApiError(404, "The model '" + name->get<std::string>() + "' does not exist; this server serves '" +
                              model.name + "'", "model", "model_not_found");
  }
  GenerationSpec& spec = r.spec;
  if (chat) {
    // Tool definitions reach the template with their keys in the client's order, as transformers
    // renders them.
    const bool tools = fields.get("tools") != nullptr;
    r.tools = checked_tool_request(body, tools ? nlohmann::ordered_json::parse(text) : nlohmann::ordered_json(),
                                   model.tool_format);
  }
  spec.prompt = chat ? chat_prompt(body, model, r.tools) : completion_prompt(body, model);
  const int prompt = static_cast<int>(spec.prompt.size());
  if (prompt == 0) throw ApiError::bad_field(chat ? "messages" : "prompt", "the prompt has no tokens");
  if (prompt >= model.max_context)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(model.max_context) +
                            " tokens; the prompt has " + std::to_string(prompt) + " (leaving none to generate)",
                   chat ? "messages" : "prompt", "context_length_exceeded");

  // Chat takes either budget field (max_tokens is the deprecated name), the newer one first.
  const int64_t no_limit = std::numeric_limits<int64_t>::max();
  const int64_t max_tokens = fields.integer("max_tokens", 0, 1, no_limit);
  const int64_t max_completion = chat ? fields.integer("max_completion_tokens", 0, 1, no_limit) : 0;
  const char* budget_field = max_completion ? "max_completion_tokens" : "max_tokens";
  // OpenAI's defaults: 16 for completions; chat runs to the end of the context.
  const int64_t budget = max_completion ? max_completion : max_tokens ? max_tokens : chat ? model.max_context - prompt : 16;
  if (budget > model.max_context - prompt)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(model.max_context) +
                            " tokens. However, you requested " + std::to_string(prompt + budget) + " tokens (" +
                            std::to_string(prompt) + " in the prompt, " + std::to_string(budget) +
                            " in the completion)",
                   budget_field, "context_length_exceeded");
  spec.max_new_tokens = static_cast<int>(budget);

  spec.sampling.temperature = static_cast<float>(fields.number("temperature", 1.0, 0.0, 2.0));
  spec.sampling.top_p = static_cast<float>(fields.number("top_p", 1.0, 0.0, 1.0));
  if (spec.sampling.top_p <= 0.0f) throw_invalid_value("top_p", "'top_p' must be greater than 0.");
  const int64_t top_k = fields.integer("top_k", 0, -1, model.vocab_size);
  spec.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  spec.sampling.min_p = static_cast<float>(fields.number("min_p", 0.0, 0.0, 1.0));
  spec.sampling.seed = static_cast<uint64_t>(
      fields.integer("seed", 0, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  spec.presence_penalty = static_cast<float>(fields.number("presence_penalty", 0.0, -2.0, 2.0));
  spec.frequency_penalty = static_cast<float>(fields.number("frequency_penalty", 0.0, -2.0, 2.0));
  if (!fields.boolean("ignore_eos", false)) spec.stop_ids = model.stop_ids;
  spec.speculative = fields.boolean("speculative", true);
  // OpenAI allows n up to 128; this server runs at most 16 sequences for one request.
  r.n = static_cast<int>(fields.integer("n", 1, 1, 16));
  if (!chat) {
    const int64_t best_of = fields.integer("best_of", r.n, 0, 20);
    if (best_of != r.n) throw_unsupported("best_of", "other than 'n' is not supported");
    if (fields.boolean("echo", false)) throw_unsupported("echo", "is not supported");
    if (const json* suffix = fields.get("suffix"); suffix && !checked_string(*suffix, "suffix").empty())
      throw_unsupported("suffix", "is not supported");
  }
  r.stop_strings = stop_strings(fields);
  check_logit_bias(fields, model);
  check_modalities(fields);
  r.grammar = answer_grammar(fields, body, model, r.tools, spec.constraint_field);
  if (r.grammar) {
    if (spec.stop_ids.empty())
      throw_invalid_value("ignore_eos", "'ignore_eos' cannot be combined with '" + spec.constraint_field +
                                            "': a constrained answer ends with its grammar.");
    spec.constraint = r.grammar->start();
  }

  if (chat) {
    r.logprobs = fields.boolean("logprobs", false);
    const int64_t top = fields.integer("top_logprobs", 0, 0, 20);
    if (fields.get("top_logprobs") && !r.logprobs)
      throw_invalid_value("top_logprobs", "'top_logprobs' needs 'logprobs': true.");
    spec.top_logprobs = r.logprobs ? static_cast<int>(top) : -1;
  } else if (fields.get("logprobs")) {
    // OpenAI's limit is 5; 20 here, as chat's top_logprobs.
    spec.top_logprobs = static_cast<int>(fields.integer("logprobs", 0, 0, 20));
    r.logprobs = true;
  }

  r.stream = fields.boolean("stream", false);
  if (const json* options = fields.get("stream_options")) {
    const Fields o(checked_object(*options, "stream_options"), "stream_options");
    o.only({"include_usage", "include_obfuscation"});
    if (!r.stream)
      throw_invalid_value("stream_options", "'stream_options' is only allowed when 'stream' is enabled.");
    r.include_usage = o.boolean("include_usage", false);
    o.boolean("include_obfuscation", true);
  }
  return r;
}

}  // namespace deepfuse::server
