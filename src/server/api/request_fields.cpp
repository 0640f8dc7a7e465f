#include "server/api/request_fields.hpp"

#include <cmath>
#include <limits>

namespace deepfuse::server {

namespace {

using nlohmann::json;

// The field as the message text names it: messages[0].role for the param messages.[0].role.
std::string display(const std::string& param) {
  std::string out;
  for (size_t i = 0; i < param.size(); ++i) {
    if (param[i] == '.' && i + 1 < param.size() && param[i + 1] == '[') continue;
    out += param[i];
  }
  return out;
}

const char* type_phrase(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a decimal";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unknown type";
  }
}

// Python-like shortest form of a bound or value: 2, 0.5, -100.
std::string number_text(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  std::string s = json(x).dump();
  return s;
}

[[noreturn]] void throw_out_of_range(const std::string& param, const char* kind, bool above, const std::string& bound,
                                     const std::string& got) {
  throw ApiError(400,
                 "Invalid '" + display(param) + "': " + kind + (above ? " above maximum" : " below minimum") +
                     " value. Expected a value " + (above ? "<= " : ">= ") + bound + ", but got " + got + " instead.",
                 param, std::string(kind) + (above ? "_above_max_value" : "_below_min_value"));
}

}  // namespace

std::string param_element(const std::string& param, size_t index) {
  return param + ".[" + std::to_string(index) + "]";
}

std::string param_member(const std::string& param, const std::string& key) {
  return param.empty() ? key : param + "." + key;
}

void throw_invalid_type(const std::string& param, const char* expected, const json& got) {
  throw ApiError(400, "Invalid type for '" + display(param) + "': expected " + expected + ", but got " +
                          type_phrase(got) + " instead.",
                 param, "invalid_type");
}

void throw_missing(const std::string& param) {
  throw ApiError(400, "Missing required parameter: '" + display(param) + "'.", param, "missing_required_parameter");
}

void throw_invalid_value(const std::string& param, const std::string& why) {
  throw ApiError(400, "Invalid value for '" + display(param) + "': " + why, param, "invalid_value");
}

void throw_not_one_of(const std::string& param, const std::string& value, std::initializer_list<const char*> supported) {
  std::string list;
  size_t i = 0;
  for (const char* s : supported) {
    if (i > 0) list += i + 1 == supported.size() ? (supported.size() > 2 ? ", and " : " and ") : ", ";
    list += std::string("'") + s + "'";
    ++i;
  }
  throw ApiError(400, "Invalid value: '" + value + "'. Supported values are: " + list + ".", param, "invalid_value");
}

void throw_empty_array(const std::string& param) {
  throw ApiError(400, "Invalid '" + display(param) + "': empty array. Expected an array with minimum length 1, but got "
                      "an empty array instead.", param, "empty_array");
}

void throw_unknown(const std::string& param) {
  throw ApiError(400, "Unrecognized request argument supplied: '" + display(param) + "'.", param, "unknown_parameter");
}

void throw_unsupported(const std::string& param, const std::string& why) {
  throw ApiError(400, "Unsupported parameter: '" + display(param) + "' " + why + ".", param, "unsupported_parameter");
}

double checked_number(const json& value, const std::string& param, double lo, double hi) {
  if (!value.is_number()) throw_invalid_type(param, "a number", value);
  const double x = value.get<double>();
  if (!std::isfinite(x)) throw_invalid_value(param, "the number must be finite.");
  if (x < lo) throw_out_of_range(param, "decimal", false, number_text(lo), number_text(x));
  if (x > hi) throw_out_of_range(param, "decimal", true, number_text(hi), number_text(x));
  return x;
}

int64_t checked_integer(const json& value, const std::string& param, int64_t lo, int64_t hi) {
  if (!value.is_number_integer()) throw_invalid_type(param, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw_out_of_range(param, "integer", true, std::to_string(hi), value.dump());
  const int64_t x = value.get<int64_t>();
  if (x < lo) throw_out_of_range(param, "integer", false, std::to_string(lo), std::to_string(x));
  if (x > hi) throw_out_of_range(param, "integer", true, std::to_string(hi), std::to_string(x));
  return x;
}

bool checked_boolean(const json& value, const std::string& param) {
  if (!value.is_boolean()) throw_invalid_type(param, "a boolean", value);
  return value.get<bool>();
}

const std::string& checked_string(const json& value, const std::string& param) {
  if (!value.is_string()) throw_invalid_type(param, "a string", value);
  return value.get_ref<const std::string&>();
}

const json& checked_object(const json& value, const std::string& param) {
  if (!value.is_object()) throw_invalid_type(param, "an object", value);
  return value;
}

const json& checked_array(const json& value, const std::string& param) {
  if (!value.is_array()) throw_invalid_type(param, "an array", value);
  return value;
}

const json* Fields::get(const std::string& key) const {
  const auto it = object_.find(key);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

const json& Fields::required(const std::string& key) const {
  const json* v = get(key);
  if (!v) throw_missing(param(key));
  return *v;
}

void Fields::only(std::initializer_list<const char*> known) const {
  for (const auto& [key, value] : object_.items()) {
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found) throw_unknown(param(key));
  }
}

double Fields::number(const std::string& key, double fallback, double lo, double hi) const {
  const json* v = get(key);
  return v ? checked_number(*v, param(key), lo, hi) : fallback;
}

int64_t Fields::integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  const json* v = get(key);
  return v ? checked_integer(*v, param(key), lo, hi) : fallback;
}

bool Fields::boolean(const std::string& key, bool fallback) const {
  const json* v = get(key);
  return v ? checked_boolean(*v, param(key)) : fallback;
}

}  // namespace deepfuse::server
