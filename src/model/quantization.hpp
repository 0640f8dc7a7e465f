// config.json's quantization_config -> WeightQuantization (include/deepfuse/quantization.hpp).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "deepfuse/quantization.hpp"

namespace deepfuse {

// `config` is the quantization_config object; `source` names config.json. Throws
// deepfuse::Error naming the field ("quantization_config.quant_method", ...) for any method or
// setting deepfuse would run wrong: other methods, integer or 4-bit types, static activation
// scales, an FP8 KV cache, sparsity, block sizes other than 128x128.
WeightQuantization parse_quantization_config(const nlohmann::json& config, const std::string& source);

}  // namespace deepfuse
