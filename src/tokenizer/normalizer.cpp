#include "tokenizer/normalizer.hpp"

#include <utf8proc.h>

#include <vector>

#include "deepfuse/error.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::tokenizer {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalizationForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = normalize_unicode(text, form_); }

 private:
  NormalizationForm form_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // HF leaves empty text empty
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = pattern_.replace_all(text, content_); }

 private:
  Regex pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      for (size_t pos = 0; pos < end; begin = pos)
        if (!is_unicode_whitespace(next_code_point(text, pos))) break;
    }
    if (right_) {
      // Walk forward remembering where the trailing whitespace run starts.
      size_t run_start = end;
      bool in_run = false;
      for (size_t pos = begin; pos < end;) {
        const size_t start = pos;
        const bool space = is_unicode_whitespace(next_code_point(text, pos));
        if (space && !in_run) run_start = start;
        in_run = space;
      }
      if (in_run) end = run_start;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    for (size_t pos = 0; pos < text.size();)
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(next_code_point(text, pos)))));
    text = std::move(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : spec.at("normalizers"))
      if (auto normalizer = make_normalizer(step)) steps.push_back(std::move(normalizer));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalizationForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalizationForm::NFKD);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec.at("prepend").get<std::string>());
  if (type == "Replace")
    return std::make_unique<ReplaceNormalizer>(pattern_from_json(spec.at("pattern")), spec.at("content").get<std::string>());
  if (type == "Strip") return std::make_unique<StripNormalizer>(spec.value("strip_left", false), spec.value("strip_right", false));
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  throw Error("tokenizer.json: unsupported normalizer type '" + type + "'");
}

}  // namespace deepfuse::tokenizer
