// Checked access to the fields of an OpenAI request body, each refusal in OpenAI's own words and
// codes: "Invalid type for 'temperature': expected a number, but got a string instead."
// (invalid_type), "Missing required parameter: 'messages[0].role'." (missing_required_parameter),
// range errors (decimal_above_max_value, ...), invalid_value, unknown_parameter and
// unsupported_parameter / unsupported_value for what this server does not implement.
//
// A field is named by its `param`, as OpenAI's error body writes it: `messages.[0].content.[1].type`
// (the message text writes `messages[0].content[1].type`).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.hpp"

namespace deepfuse::server {

// `param` of the element `index` of the array `param`, and of the member `key` of the object `param`.
std::string param_element(const std::string& param, size_t index);
std::string param_member(const std::string& param, const std::string& key);

// The refusals, one per kind of fault.
[[noreturn]] void throw_invalid_type(const std::string& param, const char* expected, const nlohmann::json& got);
[[noreturn]] void throw_missing(const std::string& param);
[[noreturn]] void throw_invalid_value(const std::string& param, const std::string& why);
// `value` not among `supported` (a string field with a fixed set of values).
[[noreturn]] void throw_not_one_of(const std::string& param, const std::string& value,
                                   std::initializer_list<const char*> supported);
[[noreturn]] void throw_empty_array(const std::string& param);
[[noreturn]] void throw_unknown(const std::string& param);
// A field (or one of its values) OpenAI defines and this server does not implement: refused by
// name, never ignored, because it would change the answer.
[[noreturn]] void throw_unsupported(const std::string& param, const std::string& why);

// Type and range checks of one value, named `param`. Integers are accepted where a number is.
double checked_number(const nlohmann::json& value, const std::string& param, double lo, double hi);
int64_t checked_integer(const nlohmann::json& value, const std::string& param, int64_t lo, int64_t hi);
bool checked_boolean(const nlohmann::json& value, const std::string& param);
const std::string& checked_string(const nlohmann::json& value, const std::string& param);
const nlohmann::json& checked_object(const nlohmann::json& value, const std::string& param);
const nlohmann::json& checked_array(const nlohmann::json& value, const std::string& param);

// An object's members, absent and null alike read as "not given".
class Fields {
 public:
  // `param` names the object itself ("" for the request body).
  Fields(const nlohmann::json& object, std::string param) : object_(object), param_(std::move(param)) {}

  const nlohmann::json* get(const std::string& key) const;
  const nlohmann::json& required(const std::string& key) const;
  std::string param(const std::string& key) const { return param_member(param_, key); }
  // Every member must be one of `known`; the first other is refused as unknown_parameter.
  void only(std::initializer_list<const char*> known) const;

  double number(const std::string& key, double fallback, double lo, double hi) const;
  int64_t integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  bool boolean(const std::string& key, bool fallback) const;
  const nlohmann::json& object() const { return object_; }

 private:
  const nlohmann::json& object_;
  std::string param_;
};

}  // namespace deepfuse::server
