#include "server/api/chat_messages.hpp"

#include <string>

#include "server/api/request_fields.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// One content part; its text (a refusal part's refusal), or a refusal naming what is not served.
std::string part_text(const json& part, const std::string& param, const std::string& role) {
  const Fields fields(checked_object(part, param), param);
  const std::string& type = checked_string(fields.required("type"), fields.param("type"));
  if (type == "text") {
    fields.only({"type", "text"});
    return checked_string(fields.required("text"), fields.param("text"));
  }
  if (type == "refusal" && role == "assistant") {
    fields.only({"type", "refusal"});
    return checked_string(fields.required("refusal"), fields.param("refusal"));
  }
  if (role == "user" && (type == "image_url" || type == "input_audio" || type == "file"))
    throw ApiError(400,
                   "Unsupported value: content parts of type '" + type +
                       "' are not supported by this model; it reads text parts only.",
                   fields.param("type"), "unsupported_value");
  if (role == "user") throw_not_one_of(fields.param("type"), type, {"text", "image_url", "input_audio", "file"});
  if (role == "assistant") throw_not_one_of(fields.param("type"), type, {"text", "refusal"});
  throw_not_one_of(fields.param("type"), type, {"text"});
}

// A string, or the parts' texts joined.
std::string content_text(const json& content, const std::string& param, const std::string& role) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw_invalid_type(param, "one of a string or array of objects", content);
  if (content.empty()) throw_empty_array(param);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) text += part_text(content[i], param_element(param, i), role);
  return text;
}

// An assistant message's tool_calls, with each call's arguments decoded for the template.
ordered_json tool_calls(const json& calls, const std::string& param) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < checked_array(calls, param).size(); ++i) {
    const std::string call_param = param_element(param, i);
    const Fields call(checked_object(calls[i], call_param), call_param);
    call.only({"id", "type", "function"});
    const std::string& id = checked_string(call.required("id"), call.param("id"));
    const std::string& type = checked_string(call.required("type"), call.param("type"));
    if (type != "function") throw_not_one_of(call.param("type"), type, {"function"});
    const Fields function(checked_object(call.required("function"), call.param("function")), call.param("function"));
    function.only({"name", "arguments"});
    const std::string& name = checked_string(function.required("name"), function.param("name"));
    const std::string& arguments = checked_string(function.required("arguments"), function.param("arguments"));
    ordered_json decoded = ordered_json::parse(arguments, nullptr, /*allow_exceptions=*/false);
    if (!decoded.is_object())
      throw_invalid_value(function.param("arguments"),
                          "the arguments must be a JSON object in a string (the chat template writes them as JSON).");
    out.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", std::move(decoded)}}}});
  }
  return out;
}

ordered_json checked_message(const json& message, const std::string& param) {
  const Fields fields(checked_object(message, param), param);
  const std::string& role = checked_string(fields.required("role"), fields.param("role"));
  ordered_json out;
  if (role == "system" || role == "developer" || role == "user") {
    fields.only({"role", "content", "name"});
    out["role"] = role == "developer" ? "system" : role;
    out["content"] = content_text(fields.required("content"), fields.param("content"), role);
  } else if (role == "assistant") {
    if (fields.get("audio")) throw_unsupported(fields.param("audio"), "is not supported: this server generates text");
    if (fields.get("function_call"))
      throw_unsupported(fields.param("function_call"), "is deprecated and not supported: use 'tool_calls'");
    fields.only({"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"});
    out["role"] = role;
    const json* calls = fields.get("tool_calls");
    const json* content = fields.get("content");
    if (!content && !calls) throw_missing(fields.param("content"));
    out["content"] = content ? content_text(*content, fields.param("content"), role) : std::string();
    if (const json* refusal = fields.get("refusal")) checked_string(*refusal, fields.param("refusal"));
    if (calls) {
      ordered_json decoded = tool_calls(*calls, fields.param("tool_calls"));
      if (!decoded.empty()) out["tool_calls"] = std::move(decoded);
    }
  } else if (role == "tool") {
    fields.only({"role", "content", "tool_call_id"});
    out["role"] = role;
    out["content"] = content_text(fields.required("content"), fields.param("content"), role);
    out["tool_call_id"] = checked_string(fields.required("tool_call_id"), fields.param("tool_call_id"));
  } else if (role == "function") {
    throw ApiError(400, "Unsupported value: the deprecated 'function' role is not supported; use 'tool'.",
                   fields.param("role"), "unsupported_value");
  } else {
    throw_not_one_of(fields.param("role"), role, {"system", "assistant", "user", "function", "tool", "developer"});
  }
  if (const json* name = fields.get("name")) out["name"] = checked_string(*name, fields.param("name"));
  return out;
}

}  // namespace

ordered_json checked_chat_messages(const json& body) {
  const json* messages = Fields(body, "").get("messages");
  if (!messages) throw_missing("messages");
  if (!messages->is_array()) throw_invalid_type("messages", "an array", *messages);
  if (messages->empty()) throw_empty_array("messages");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages->size(); ++i) out.push_back(checked_message((*messages)[i], param_element("messages", i)));
  return out;
}

}  // namespace deepfuse::server
