// A compiled PCRE2 pattern in UTF + UCP mode, so \s, \w, \d and \p{..} follow Unicode as the
// Oniguruma engine behind Hugging Face's Split pre-tokenizer does. JIT-compiled when available.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deepfuse::tokenizer {

class Regex {
 public:
  // Throws deepfuse::Error("invalid regex ...") naming PCRE2's message and the offset.
  explicit Regex(const std::string& pattern);
  // A pattern matching `literal` exactly.
  static Regex literal(std::string_view literal);

  // Calls on_match(start, end) for each non-overlapping match, left to right. text must be
  // valid UTF-8.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;
  // `text` with every match replaced by `replacement` (no group references).
  std::string replace_all(std::string_view text, std::string_view replacement) const;

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

// tokenizer.json's pattern object: {"String": "literal"} or {"Regex": "pattern"}.
Regex pattern_from_json(const nlohmann::json& pattern);

}  // namespace deepfuse::tokenizer
