#include "server/api/tool_calls.hpp"

#include <algorithm>
#include <random>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

constexpr const char* kPythonTag = "<|python_tag|>";
constexpr const char* kHermesClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string trim_left(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  return s.substr(i);
}

// Where the JSON object or array starting at `start` ends (one past its closing bracket), or npos
// while it is incomplete. Strings and their escapes are skipped, so brackets inside them do not count.
size_t json_value_end(const std::string& text, size_t start) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string::npos;
}

// {"name": ..., "arguments" | "parameters": {...} or a JSON string of one}.
bool call_from_json(const json& object, ToolCallFormat format, ToolCall& call) {
  if (!object.is_object() || !object.contains("name") || !object["name"].is_string()) return false;
  json arguments = object.contains("arguments") ? object["arguments"] : object.value("parameters", json::object());
  if (arguments.is_string()) arguments = json::parse(arguments.get<std::string>(), nullptr, false);
  if (!arguments.is_object()) return false;
  call = {new_tool_call_id(format), object["name"].get<std::string>(), arguments.dump()};
  return true;
}

// Length of the longest tail of `text` that is a proper prefix of `marker`.
size_t marker_prefix_tail(const std::string& text, const std::string& marker) {
  for (size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n)
    if (text.compare(text.size() - n, n, marker, 0, n) == 0) return n;
  return 0;
}

}  // namespace

const std::vector<ToolCallFormatInfo>& tool_call_formats() {
  static const std::vector<ToolCallFormatInfo> formats = {
      {ToolCallFormat::hermes, "hermes", "<tool_call>", "<tool_call>", "<tool_call>\n{\"name\": \"", "arguments",
       "}\n</tool_call>"},
      {ToolCallFormat::mistral, "mistral", "[TOOL_CALLS]", "[TOOL_CALLS]", "[TOOL_CALLS] [{\"name\": \"", "arguments",
       "}]"},
      {ToolCallFormat::llama3_json, "llama3_json", "", "\"parameters\": ", "{\"name\": \"", "parameters", "}"},
      {ToolCallFormat::none, "none", "", nullptr, nullptr, nullptr, nullptr},
  };
  return formats;
}

const ToolCallFormatInfo& tool_call_format_info(ToolCallFormat format) {
  for (const ToolCallFormatInfo& info : tool_call_formats())
    if (info.format == format) return info;
  throw Error("unknown tool call format");
}

ToolCallFormat detect_tool_call_format(const std::string& source) {
  if (source.find("tools") == std::string::npos) return ToolCallFormat::none;
  for (const ToolCallFormatInfo& info : tool_call_formats())
    if (info.detect && source.find(info.detect) != std::string::npos) return info.format;
  return ToolCallFormat::none;
}

ToolCallFormat tool_call_format_named(const std::string& name) {
  for (const ToolCallFormatInfo& info : tool_call_formats())
    if (name == info.name) return info.format;
  throw Error("unknown tool call format '" + name + "'");
}

std::vector<int32_t> tool_call_marker_ids(ToolCallFormat format, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const std::string marker : {std::string(tool_call_format_info(format).marker),
                                   std::string(format == ToolCallFormat::llama3_json ? kPythonTag : "")}) {
    if (marker.empty()) continue;
    const std::optional<TokenId> id = tokenizer.token_to_id(marker);
    if (id && tokenizer.is_special(*id)) ids.push_back(*id);
  }
  return ids;
}

std::string new_tool_call_id(ToolCallFormat format) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof kAlphabet - 2);
  std::string id = format == ToolCallFormat::mistral ? "" : "call_";
  const int length = format == ToolCallFormat::mistral ? 9 : 24;
  for (int i = 0; i < length; ++i) id += kAlphabet[pick(rng)];
  return id;
}

bool ToolCallParser::parse_calls(const std::string& text, std::vector<ToolCall>& calls) const {
  // Llama 3.1: one or more objects separated by ';'. Mistral: one array. Hermes: one object.
  size_t at = 0;
  std::vector<ToolCall> parsed;
  for (;;) {
    while (at < text.size() && is_space(text[at])) ++at;
    if (at == text.size()) break;
    const size_t end = json_value_end(text, at);
    if (end == std::string::npos) return false;
    const json value = json::parse(text.substr(at, end - at), nullptr, false);
    for (const json& item : value.is_array() && format_ == ToolCallFormat::mistral ? value : json::array({value})) {
      ToolCall call;
      if (!call_from_json(item, format_, call)) return false;
      parsed.push_back(std::move(call));
    }
    at = end;
    while (at < text.size() && is_space(text[at])) ++at;
    if (at < text.size() && text[at] == ';' && format_ == ToolCallFormat::llama3_json) ++at;
    else if (at < text.size()) return false;
  }
  if (parsed.empty()) return false;
  calls.insert(calls.end(), parsed.begin(), parsed.end());
  return true;
}

// A Hermes call is a JSON object, then </tool_call>: the tag is looked for after the object, so
// one inside a string argument does not end the call. Something else after the object (or no
// object) makes the call end at the first tag, as malformed.
void ToolCallParser::hermes_call_end(bool at_end, size_t& end, size_t& resume) const {
  const std::string close = kHermesClose;
  const size_t open = pending_.find_first_not_of(" \n\r\t");
  const size_t object_end =
      open != std::string::npos && pending_[open] == '{' ? json_value_end(pending_, open) : std::string::npos;
  if (object_end != std::string::npos) {
    size_t after = object_end;
    while (after < pending_.size() && is_space(pending_[after])) ++after;
    const std::string rest = pending_.substr(after, close.size());
    if (rest == close) {
      end = object_end;
      resume = after + close.size();
      return;
    }
    if (!at_end && close.rfind(rest, 0) == 0) return;  // the tag may still come
  } else if (!at_end && open != std::string::npos && pending_[open] == '{') {
    return;  // the object is still being written
  }
  end = pending_.find(close);
  if (end != std::string::npos) resume = end + close.size();
}

void ToolCallParser::advance(Output& out, bool at_end) {
  const std::string marker = tool_call_format_info(format_).marker;
  for (;;) {
    if (format_ == ToolCallFormat::none || plain_) {
      out.content += pending_;
      pending_.clear();
      return;
    }
    if (!in_call_ && format_ == ToolCallFormat::llama3_json) {
      // A call is the whole answer: it starts with '{' or the python tag, after any whitespace.
      const std::string start = trim_left(pending_);
      if (start.rfind(kPythonTag, 0) == 0 || (!start.empty() && start[0] == '{')) {
        in_call_ = true;
        opened_with_.clear();
        continue;
      }
      const bool undecided = start.empty() || std::string(kPythonTag).rfind(start, 0) == 0;
      if (undecided && !at_end) return;
      plain_ = true;
      continue;
    }
    if (!in_call_) {
      if (calls_ > 0) pending_ = trim_left(pending_);  // the whitespace between calls is not content
      const size_t found = pending_.find(marker);
      if (found == std::string::npos) {
        const size_t keep = at_end ? 0 : marker_prefix_tail(pending_, marker);
        out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      out.content += pending_.substr(0, found);
      pending_.erase(0, found + marker.size());
      opened_with_ = marker;
      in_call_ = true;
    }
    // In a call: find where its text ends.
    size_t end = std::string::npos, resume = std::string::npos;
    if (format_ == ToolCallFormat::hermes) {
      hermes_call_end(at_end, end, resume);
    } else if (format_ == ToolCallFormat::mistral) {
      const size_t open = pending_.find_first_not_of(" \n\r\t");
      end = open == std::string::npos ? std::string::npos : json_value_end(pending_, open);
      resume = end;
    }
    if (end == std::string::npos && !at_end) return;
    if (end == std::string::npos) end = resume = pending_.size();
    std::string text = pending_.substr(0, end);
    if (format_ == ToolCallFormat::llama3_json) {
      text = trim_left(text);
      if (text.rfind(kPythonTag, 0) == 0) text.erase(0, std::string(kPythonTag).size());
    }
    std::vector<ToolCall> calls;
    if (parse_calls(text, calls)) {
      calls_ += static_cast<int>(calls.size());
      out.calls.insert(out.calls.end(), calls.begin(), calls.end());
    } else {
      out.content += opened_with_ + pending_.substr(0, resume);  // not a call after all
    }
    pending_.erase(0, resume);
    in_call_ = false;
    if (format_ == ToolCallFormat::llama3_json) plain_ = true;  // what follows a Llama call is content
  }
}

ToolCallParser::Output ToolCallParser::push(const std::string& text) {
  Output out;
  pending_ += text;
  advance(out, false);
  return out;
}

ToolCallParser::Output ToolCallParser::finish(const std::string& last) {
  Output out;
  pending_ += last;
  advance(out, true);
  return out;
}

}  // namespace deepfuse::server
