// The JSON Schema keywords structured output enforces, checked before a schema is compiled: a
// keyword the grammar could not enforce (xgrammar would warn and ignore it) is refused with an
// ApiError naming it (`response_format.json_schema.schema.properties.tags.uniqueItems`), so a
// client never gets output that silently breaks its schema.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace deepfuse::server {

// Walks `schema` (named `param`) and every subschema in it.
void check_json_schema(const nlohmann::json& schema, const std::string& param);

}  // namespace deepfuse::server
