// The plan as an nlohmann::json value, for the tuning cache (which nests plans in its entries);
// plan_to_json / plan_from_json (tuning_cache.hpp) are the text forms.
#pragma once

#include <nlohmann/json.hpp>

#include "deepfuse/decode_plan.hpp"

namespace deepfuse::scheduler {

nlohmann::json plan_json(const DecodePlan& plan);
// Strict: throws deepfuse::Error naming the field on a missing or unknown key, a wrong type or an
// unknown choice name.
DecodePlan plan_from_json_value(const nlohmann::json& json);

}  // namespace deepfuse::scheduler
