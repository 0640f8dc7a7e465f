#include "tokenizer/regex.hpp"

#include <pcre2.h>

#include <cctype>

#include "deepfuse/error.hpp"

namespace deepfuse::tokenizer {

namespace {

// The members of Unicode White_Space, which is what \s means to Oniguruma (HF's engine). PCRE2's
// \s with UCP also takes U+180E (through \h), so \s and \S are spelled out before compiling.
constexpr const char* kWhiteSpaceMembers =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string spell_out_white_space(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[++i];
      if (escaped == 's') {
        out += in_class ? std::string(kWhiteSpaceMembers) : std::string("[") + kWhiteSpaceMembers + "]";
      } else if (escaped == 'S' && !in_class) {
        out += std::string("[^") + kWhiteSpaceMembers + "]";
      } else {
        out += c;
        out += escaped;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string compiled_pattern = spell_out_white_space(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_pattern.data()), compiled_pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof message);
    throw Error("invalid regex '" + pattern + "': " + reinterpret_cast<const char*>(message) +
                " at offset " + std::to_string(error_offset));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  auto compiled = std::make_shared<Compiled>();
  compiled->code = code;
  compiled_ = std::move(compiled);
}

Regex Regex::literal(std::string_view literal) {
  // Every ASCII punctuation character escaped; letters, digits and non-ASCII stand for themselves.
  std::string quoted;
  for (const char c : literal) {
    if (static_cast<unsigned char>(c) < 0x80 && std::ispunct(static_cast<unsigned char>(c))) quoted += '\\';
    quoted += c;
  }
  return Regex(quoted);
}

void Regex::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset <= text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                               match_data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      throw Error(std::string("regex match failed: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match_data.get());
    const size_t start = range[0], end = range[1];
    if (end > start) {
      on_match(start, end);
      offset = end;
    } else {
      // An empty match yields nothing (HF drops empty pieces); step over one character.
      if (start >= text.size()) return;
      offset = start + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
}

std::string Regex::replace_all(std::string_view text, std::string_view replacement) const {
  std::string out;
  size_t copied = 0;
  for_each_match(text, [&](size_t start, size_t end) {
    out.append(text.substr(copied, start - copied));
    out.append(replacement);
    copied = end;
  });
  out.append(text.substr(copied));
  return out;
}

Regex pattern_from_json(const nlohmann::json& pattern) {
  if (pattern.contains("String")) return Regex::literal(pattern.at("String").get<std::string>());
  if (pattern.contains("Regex")) return Regex(pattern.at("Regex").get<std::string>());
  throw Error("tokenizer.json: pattern " + pattern.dump() + " is neither {\"String\": ..} nor {\"Regex\": ..}");
}

}  // namespace deepfuse::tokenizer
