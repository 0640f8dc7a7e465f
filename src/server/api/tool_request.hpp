// A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked against OpenAI's
// rules: what the chat template renders and whether the answer is parsed into tool calls.
//
// tool_choice `auto` (the default with tools) renders the tools and parses calls; `none` renders
// no tools and parses nothing; `required` and a named function also constrain the answer to one
// call by a grammar (src/server/grammar), so that it always parses.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api/tool_calls.hpp"

namespace deepfuse::server {

struct ToolRequest {
  nlohmann::ordered_json tools;   // for the template (null: render none), in the client's key order
  bool parse = false;             // parse the answer into tool_calls
  bool parallel = true;           // false: at most one call per answer
  bool required = false;          // tool_choice `required` or a named function: the answer is one call
  std::optional<std::string> named;  // ... to this function
};

// `body` is the request; `ordered` the same body with its keys in the client's order (tool
// definitions reach the template as sent). `format`: the served model's (none: tools refused).
ToolRequest checked_tool_request(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                                 ToolCallFormat format);

}  // namespace deepfuse::server
