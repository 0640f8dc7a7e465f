// tokenizer.json "normalizer": rewrites each stretch of text between added tokens before it is
// pre-tokenized (Llama 2's Prepend("▁") + Replace(" ", "▁"), Qwen2's NFC, ...).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace deepfuse::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null (no normalizer). Throws deepfuse::Error for unsupported types.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec);

}  // namespace deepfuse::tokenizer
