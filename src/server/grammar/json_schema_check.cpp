#include "server/grammar/json_schema_check.hpp"

#include <string_view>

#include "server/api/request_fields.hpp"

namespace deepfuse::server {

namespace {

using nlohmann::json;

// Where a keyword's value holds subschemas.
enum class Holds { nothing, schema, schema_map, schema_list, schema_or_list };

struct KeywordRule {
  const char* name;
  Holds holds;
};

// The keywords xgrammar 0.2.9 turns into grammar (or that only annotate); everything else is refused.
constexpr KeywordRule kSupported[] = {
    {"type", Holds::nothing},           {"enum", Holds::nothing},
    {"const", Holds::nothing},          {"anyOf", Holds::schema_list},
    {"$ref", Holds::nothing},           {"$defs", Holds::schema_map},
    {"definitions", Holds::schema_map}, {"properties", Holds::schema_map},
    {"required", Holds::nothing},       {"additionalProperties", Holds::schema},
    {"patternProperties", Holds::schema_map}, {"propertyNames", Holds::schema},
    {"minProperties", Holds::nothing},  {"maxProperties", Holds::nothing},
    {"unevaluatedProperties", Holds::schema}, {"items", Holds::schema_or_list},
    {"prefixItems", Holds::schema_list}, {"unevaluatedItems", Holds::schema},
    {"minItems", Holds::nothing},       {"maxItems", Holds::nothing},
    {"minLength", Holds::nothing},      {"maxLength", Holds::nothing},
    {"pattern", Holds::nothing},        {"format", Holds::nothing},
    {"minimum", Holds::nothing},        {"maximum", Holds::nothing},
    {"exclusiveMinimum", Holds::nothing}, {"exclusiveMaximum", Holds::nothing},
    {"multipleOf", Holds::nothing},     {"title", Holds::nothing},
    {"description", Holds::nothing},    {"default", Holds::nothing},
    {"examples", Holds::nothing},       {"$schema", Holds::nothing},
    {"$id", Holds::nothing},            {"$comment", Holds::nothing},
    {"readOnly", Holds::nothing},       {"writeOnly", Holds::nothing},
    {"deprecated", Holds::nothing},
};

const KeywordRule* rule_of(std::string_view name) {
  for (const KeywordRule& rule : kSupported)
    if (name == rule.name) return &rule;
  return nullptr;
}

bool has_type(const json& schema, const char* type) {
  const auto it = schema.find("type");
  if (it == schema.end()) return false;
  if (it->is_string()) return *it == type;
  if (it->is_array())
    for (const json& t : *it)
      if (t == type) return true;
  return false;
}

void check(const json& schema, const std::string& param) {
  if (schema.is_boolean()) return;
  checked_object(schema, param);
  for (const auto& [key, value] : schema.items()) {
    const std::string where = param_member(param, key);
    const KeywordRule* rule = rule_of(key);
    if (!rule) throw_unsupported(where, "is a JSON Schema keyword structured output does not enforce");
    switch (rule->holds) {
      case Holds::nothing: break;
      case Holds::schema: check(value, where); break;
      case Holds::schema_map:
        for (const auto& [name, sub] : checked_object(value, where).items()) check(sub, param_member(where, name));
        break;
      case Holds::schema_or_list:
        if (!value.is_array()) {
          check(value, where);
          break;
        }
        [[fallthrough]];
      case Holds::schema_list:
        for (size_t i = 0; i < checked_array(value, where).size(); ++i) check(value[i], param_element(where, i));
        break;
    }
  }
  // Combinations xgrammar ignores a part of.
  if ((schema.contains("pattern") || schema.contains("format")) &&
      (schema.contains("minLength") || schema.contains("maxLength")))
    throw_unsupported(param_member(param, schema.contains("minLength") ? "minLength" : "maxLength"),
                      "together with 'pattern' or 'format' is not enforced");
  if (schema.contains("multipleOf") && !has_type(schema, "integer"))
    throw_unsupported(param_member(param, "multipleOf"), "is enforced for integers only");
}

}  // namespace

void check_json_schema(const json& schema, const std::string& param) { check(schema, param); }

}  // namespace deepfuse::server
