#include "tokenizer/pre_tokenizer.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::tokenizer {
namespace {

// What happens to the matched delimiters (HF's SplitDelimiterBehavior).
enum class Delimiter { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Delimiter parse_delimiter(const std::string& name) {
  if (name == "Removed") return Delimiter::Removed;
  if (name == "Isolated") return Delimiter::Isolated;
  if (name == "MergedWithPrevious") return Delimiter::MergedWithPrevious;
  if (name == "MergedWithNext") return Delimiter::MergedWithNext;
  if (name == "Contiguous") return Delimiter::Contiguous;
  throw Error("tokenizer.json: unknown split behavior '" + name + "'");
}

// Splits one piece at the matches of `pattern` (or at the non-matches when invert is set),
// following HF's NormalizedString::split span by span.
void split_piece(const Piece& piece, const Regex& pattern, Delimiter behavior, bool invert, std::vector<Piece>& out) {
  struct Span {
    size_t start, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t covered = 0;
  pattern.for_each_match(piece.text, [&](size_t start, size_t end) {
    if (start > covered) spans.push_back({covered, start, invert});
    spans.push_back({start, end, !invert});
    covered = end;
  });
  if (covered < piece.text.size()) spans.push_back({covered, piece.text.size(), invert});

  std::vector<Span> kept;
  bool previous_match = false;
  if (behavior == Delimiter::MergedWithNext) {
    // A delimiter joins the span after it: walk backwards so "after" is the last one kept.
    for (auto span = spans.rbegin(); span != spans.rend(); ++span) {
      if (span->is_match && !previous_match && !kept.empty()) {
        kept.back().start = span->start;
      } else {
        kept.push_back(*span);
      }
      previous_match = span->is_match;
    }
    std::reverse(kept.begin(), kept.end());
  } else {
    for (const Span& span : spans) {
      const bool join = !kept.empty() && ((behavior == Delimiter::MergedWithPrevious && span.is_match && !previous_match) ||
                                          (behavior == Delimiter::Contiguous && span.is_match == previous_match));
      if (join) {
        kept.back().end = span.end;
      } else if (!(behavior == Delimiter::Removed && span.is_match)) {
        kept.push_back(span);
      }
      previous_match = span.is_match;
    }
  }
  for (const Span& span : kept) {
    if (span.end > span.start)
      out.push_back({piece.text.substr(span.start, span.end - span.start), piece.at_input_start && span.start == 0});
  }
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, Delimiter behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& piece : pieces) split_piece(piece, pattern_, behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  Regex pattern_;
  Delimiter behavior_;
  bool invert_;
};

// GPT-2's word pattern, which ByteLevel uses when use_regex is set.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), word_pattern_(use_regex ? std::make_unique<Regex>(kGpt2Pattern) : nullptr) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> words;
    for (Piece& piece : pieces) {
      if (add_prefix_space_ && piece.text.rfind(' ', 0) != 0) piece.text.insert(piece.text.begin(), ' ');
      if (word_pattern_) {
        split_piece(piece, *word_pattern_, Delimiter::Isolated, false, words);
      } else {
        words.push_back(std::move(piece));
      }
    }
    // Every byte becomes its printable stand-in, so the vocab holds only printable strings.
    const auto& map = byte_to_code_point();
    for (Piece& word : words) {
      std::string mapped;
      mapped.reserve(word.text.size() * 2);
      for (const char byte : word.text) append_utf8(mapped, map[static_cast<unsigned char>(byte)]);
      word.text = std::move(mapped);
    }
    pieces = std::move(words);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> word_pattern_;
};

enum class PrependScheme { Always, Never, First };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split_words)
      : replacement_(std::move(replacement)), scheme_(scheme), split_words_(split_words),
        marker_(Regex::literal(replacement_)) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece& piece : pieces) {
      std::string text;
      for (const char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      const bool prepend = scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && piece.at_input_start);
      if (prepend && text.rfind(replacement_, 0) != 0) text.insert(0, replacement_);
      Piece replaced{std::move(text), piece.at_input_start};
      if (split_words_) {
        split_piece(replaced, marker_, Delimiter::MergedWithNext, false, out);
      } else if (!replaced.text.empty()) {
        out.push_back(std::move(replaced));
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_words_;
  Regex marker_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

PrependScheme parse_prepend_scheme(const nlohmann::json& spec) {
  if (spec.contains("prepend_scheme")) {
    const std::string scheme = spec.at("prepend_scheme").get<std::string>();
    if (scheme == "always") return PrependScheme::Always;
    if (scheme == "never") return PrependScheme::Never;
    if (scheme == "first") return PrependScheme::First;
    throw Error("tokenizer.json: unknown Metaspace prepend_scheme '" + scheme + "'");
  }
  return spec.value("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;  // older files
}

std::unique_ptr<PreTokenizer> make_split(Regex pattern, const std::string& behavior, bool invert) {
  return std::make_unique<SplitPreTokenizer>(std::move(pattern), parse_delimiter(behavior), invert);
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : spec.at("pretokenizers"))
      if (auto pre_tokenizer = make_pre_tokenizer(step)) steps.push_back(std::move(pre_tokenizer));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split")
    return make_split(pattern_from_json(spec.at("pattern")), spec.at("behavior").get<std::string>(), spec.value("invert", false));
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(spec.value("add_prefix_space", false), spec.value("use_regex", true));
  if (type == "Metaspace") {
    const std::string replacement = spec.contains("replacement") ? spec.at("replacement").get<std::string>() : "\xE2\x96\x81";
    return std::make_unique<MetaspacePreTokenizer>(replacement, parse_prepend_scheme(spec), spec.value("split", true));
  }
  if (type == "Digits") return make_split(Regex(spec.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)"), "Isolated", false);
  if (type == "Whitespace") return make_split(Regex(R"(\w+|[^\w\s]+)"), "Removed", true);
  if (type == "WhitespaceSplit") return make_split(Regex(R"(\s+)"), "Removed", false);
  throw Error("tokenizer.json: unsupported pre_tokenizer type '" + type + "'");
}

}  // namespace deepfuse::tokenizer
