// tokenizer.json "post_processor": the ids added around an encoded sequence when
// add_special_tokens is on (TemplateProcessing's "single" template, Roberta/Bert processing;
// ByteLevel adds nothing to the ids).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::tokenizer {

struct SpecialTokenFrame {
  std::vector<TokenId> prefix;  // e.g. {BOS}
  std::vector<TokenId> suffix;  // e.g. {EOS}
};

// The frame for a single sequence. Throws deepfuse::Error for unsupported processor types.
SpecialTokenFrame parse_post_processor(const nlohmann::json& spec);

}  // namespace deepfuse::tokenizer
