// Chat messages to prompt text, shared by `tokenize --chat` and `generate/score --chat`.
#pragma once

#include <string>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {

// Renders `messages` (a JSON array of {"role", "content"} or "role: text" lines) through the
// tokenizer's chat template, with its BOS and EOS tokens. A tokenizer without a template is an
// error naming model_dir.
std::string render_chat(const Tokenizer& tokenizer, const std::string& messages, bool add_generation_prompt,
                        const std::string& model_dir);

}  // namespace deepfuse::cli
