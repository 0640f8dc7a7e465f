#include "tokenizer/decoder.hpp"

#include <optional>

#include "deepfuse/error.hpp"
#include "tokenizer/regex.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::tokenizer {
namespace {

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 invalid) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      // A token whose every character is in the byte map gives those bytes; any other token
      // (an added token with, say, a space) gives its own UTF-8 bytes.
      const size_t before = bytes.size();
      bool all_mapped = true;
      for (size_t pos = 0; pos < token.size() && all_mapped;) {
        const int byte = code_point_to_byte(next_code_point(token, pos));
        if (byte < 0) {
          all_mapped = false;
        } else {
          bytes += static_cast<char>(byte);
        }
      }
      if (!all_mapped) {
        bytes.resize(before);
        bytes += token;
      }
    }
    tokens.assign(1, invalid == InvalidUtf8::keep ? bytes : utf8_lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 /*invalid*/) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          // HF drops every marker of the first token when a prefix was prepended on encode.
          if (!(i == 0 && strip_first_)) out += ' ';
          pos += replacement_.size();
        } else {
          out += token[pos++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 /*invalid*/) const override {
    for (std::string& token : tokens) token = pattern_.replace_all(token, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

std::optional<unsigned char> byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  try {
    size_t used = 0;
    const int value = std::stoi(token.substr(3, 2), &used, 16);
    if (used != 2) return std::nullopt;
    return static_cast<unsigned char>(value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 invalid) const override {
    std::vector<std::string> out;
    std::string pending_bytes;
    const auto flush = [&] {
      if (pending_bytes.empty()) return;
      if (invalid == InvalidUtf8::keep || find_invalid_utf8(pending_bytes) == std::string::npos) {
        out.push_back(pending_bytes);
      } else {
        for (size_t i = 0; i < pending_bytes.size(); ++i) out.emplace_back(kReplacementChar);
      }
      pending_bytes.clear();
    };
    for (std::string& token : tokens) {
      if (const auto byte = byte_token_value(token)) {
        pending_bytes += static_cast<char>(*byte);
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 /*invalid*/) const override {
    std::string fused;
    for (const std::string& token : tokens) fused += token;
    tokens.assign(1, std::move(fused));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 /*invalid*/) const override {
    for (std::string& token : tokens) {
      size_t begin = 0, end = token.size();
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++i)
        begin += content_.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0; ++i)
        end -= content_.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, InvalidUtf8 invalid) const override {
    for (const auto& step : steps_) step->decode_chain(tokens, invalid);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : spec.at("decoders"))
      if (auto decoder = make_decoder(step)) steps.push_back(std::move(decoder));
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    const std::string replacement = spec.contains("replacement") ? spec.at("replacement").get<std::string>() : "\xE2\x96\x81";
    const bool strip_first = spec.contains("prepend_scheme") ? spec.at("prepend_scheme").get<std::string>() != "never"
                                                             : spec.value("add_prefix_space", true);
    return std::make_unique<MetaspaceDecoder>(replacement, strip_first);
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(pattern_from_json(spec.at("pattern")), spec.at("content").get<std::string>());
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip")
    return std::make_unique<StripDecoder>(spec.at("content").get<std::string>(), spec.value("start", 0), spec.value("stop", 0));
  throw Error("tokenizer.json: unsupported decoder type '" + type + "'");
}

std::string decode_tokens(const Decoder* decoder, std::vector<std::string> tokens, InvalidUtf8 invalid) {
  std::string text;
  if (!decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }
  decoder->decode_chain(tokens, invalid);
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace deepfuse::tokenizer
