// The plan as an nlohmann::json value, for the tuning cache (which nests plans in its entries);
// plan_to_json / plan_from_json (tuning_cache.hpp) are the text forms.
#pragma once

#include <nlohmann/json.hpp>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::scheduler {

nlohmann::json plan_json(const DecodePlan& plan);
// Strict: throws deepfuse::Error naming the field on a missing or unknown key, a wrong type or an
// unknown choice name.
DecodePlan plan_from_json_value(const nlohmann::json& json);

// One choice field: its name as a string (the writer uses choice_name), strictly read back.
template <typename Choice>
Choice choice_from_json(const nlohmann::json& value, const char* field) {
  DF_CHECK(value.is_string(), std::string("decode plan JSON: ") + field + " is not a string");
  const std::string name = value.get<std::string>();
  if (const std::optional<Choice> choice = parse_choice<Choice>(name)) return *choice;
  throw Error("decode plan JSON: unknown " + std::string(field) + " '" + name + "' (" + choice_names<Choice>(", ", ", ") +
              ")");
}

}  // namespace deepfuse::scheduler
