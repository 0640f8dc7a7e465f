#include "server/api/tool_request.hpp"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "server/api/request_fields.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

// OpenAI's rule for function names: a-z, A-Z, 0-9, underscores and dashes, at most 64.
bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

// The names of the functions in `tools`, each definition checked.
std::vector<std::string> checked_tools(const json& tools) {
  if (checked_array(tools, "tools").empty()) throw_empty_array("tools");
  if (tools.size() > 128) throw_invalid_value("tools", "at most 128 tools.");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = param_element("tools", i);
    const Fields tool(checked_object(tools[i], param), param);
    const std::string& type = checked_string(tool.required("type"), tool.param("type"));
    if (type == "custom") throw_unsupported(tool.param("type"), "'custom' is not supported: tools are functions");
    if (type != "function") throw_not_one_of(tool.param("type"), type, {"function", "custom"});
    tool.only({"type", "function"});
    const Fields function(checked_object(tool.required("function"), tool.param("function")), tool.param("function"));
    function.only({"name", "description", "parameters", "strict"});
    const std::string& name = checked_string(function.required("name"), function.param("name"));
    if (!valid_function_name(name))
      throw_invalid_value(function.param("name"), "'" + name + "' does not match '^[a-zA-Z0-9_-]{1,64}$'.");
    if (const json* d = function.get("description")) checked_string(*d, function.param("description"));
    if (const json* p = function.get("parameters")) checked_object(*p, function.param("parameters"));
    function.boolean("strict", false);
    names.push_back(name);
  }
  return names;
}

}  // namespace

ToolRequest checked_tool_request(const json& body, const nlohmann::ordered_json& ordered, ToolCallFormat format) {
  const Fields fields(body, "");
  ToolRequest r;
  r.parallel = fields.boolean("parallel_tool_calls", true);
  const json* tools = fields.get("tools");
  const std::vector<std::string> names = tools ? checked_tools(*tools) : std::vector<std::string>();
  const json* choice = fields.get("tool_choice");
  if (choice && !tools) throw_invalid_value("tool_choice", "'tool_choice' is only allowed when 'tools' are specified.");
  std::string mode = "auto";
  if (choice && choice->is_string()) {
    mode = choice->get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      throw_not_one_of("tool_choice", mode, {"none", "auto", "required"});
  } else if (choice) {
    const Fields named(checked_object(*choice, "tool_choice"), "tool_choice");
    const std::string& type = checked_string(named.required("type"), named.param("type"));
    if (type != "function") throw_not_one_of(named.param("type"), type, {"function"});
    named.only({"type", "function"});
    const Fields function(checked_object(named.required("function"), named.param("function")), named.param("function"));
    function.only({"name"});
    const std::string& name = checked_string(function.required("name"), function.param("name"));
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw_invalid_value(function.param("name"), "no function named '" + name + "' in 'tools'.");
    mode = "named";
  }
  if (!tools || mode == "none") return r;
  r.required = mode == "required" || mode == "named";
  if (mode == "named") r.named = (*choice)["function"]["name"].get<std::string>();
  if (format == ToolCallFormat::none)
    throw_unsupported("tools", "is not supported by this model: its chat template renders no tools");
  r.tools = ordered.at("tools");
  r.parse = true;
  return r;
}

}  // namespace deepfuse::server
