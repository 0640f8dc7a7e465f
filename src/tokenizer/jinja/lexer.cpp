#include "tokenizer/jinja/lexer.hpp"

#include <cctype>

#include "deepfuse/error.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::jinja {
namespace {

[[noreturn]] void fail(const std::string& message, int line) {
  throw Error("chat template: " + message + " (line " + std::to_string(line) + ")");
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {}

  std::vector<Token> run() {
    bool strip_next_text = false;  // a "-" closed the previous tag
    while (pos_ < src_.size()) {
      if (strip_next_text) {
        while (pos_ < src_.size() && is_space(src_[pos_])) advance();
        strip_next_text = false;
      }
      const size_t text_start = pos_;
      const size_t tag = find_tag(pos_);
      std::string text = src_.substr(text_start, tag - text_start);
      for (; pos_ < tag; ++pos_) line_ += src_[pos_] == '\n';
      if (tag == src_.size()) {
        push_text(std::move(text));
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char marker = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (marker == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (marker != '+' && type != '{') {
        lstrip_block_indent(text, text_start);
      }
      push_text(std::move(text));
      pos_ = tag + 2 + (marker == '-' || marker == '+' ? 1 : 0);

      bool trim_marker = false, keep_marker = false;
      if (type == '#') {
        lex_comment_end(trim_marker, keep_marker);
      } else {
        tokens_.push_back({type == '{' ? TokenKind::VariableOpen : TokenKind::BlockOpen, "", line_});
        lex_tag_body(type == '{' ? '}' : '%', trim_marker, keep_marker);
        tokens_.push_back({type == '{' ? TokenKind::VariableClose : TokenKind::BlockClose, "", line_});
      }
      if (trim_marker) {
        strip_next_text = true;
      } else if (type != '{' && !keep_marker && pos_ < src_.size() && src_[pos_] == '\n') {
        advance();  // trim_blocks
      }
    }
    tokens_.push_back({TokenKind::End, "", line_});
    return std::move(tokens_);
  }

 private:
  void advance() { line_ += src_[pos_++] == '\n'; }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the start of a line and a block tag go away.
  void lstrip_block_indent(std::string& text, size_t text_start) const {
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    const bool at_line_start = newline != std::string::npos || text_start == 0 || src_[text_start - 1] == '\n';
    if (!at_line_start) return;
    for (size_t i = line_start; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return;
    text.resize(line_start);
  }

  void push_text(std::string text) {
    if (!text.empty()) tokens_.push_back({TokenKind::Text, std::move(text), line_});
  }

  void lex_comment_end(bool& trim_marker, bool& keep_marker) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("unterminated comment", line_);
    trim_marker = end > pos_ && src_[end - 1] == '-';
    keep_marker = end > pos_ && src_[end - 1] == '+';
    while (pos_ < end + 2) advance();
  }

  void lex_tag_body(char closer, bool& trim_marker, bool& keep_marker) {
    int depth = 0;  // brackets: a "}}" inside a dict literal does not end the tag
    const int open_line = line_;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance();
      if (pos_ >= src_.size()) fail(std::string("unterminated ") + (closer == '}' ? "{{ ... }}" : "{% ... %}"), open_line);
      if (depth == 0) {
        for (const char marker : {'-', '+', '\0'}) {
          const std::string end = (marker ? std::string(1, marker) : "") + closer + "}";
          if (src_.compare(pos_, end.size(), end) == 0) {
            trim_marker = marker == '-';
            keep_marker = marker == '+';
            pos_ += end.size();
            return;
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t start = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        tokens_.push_back({TokenKind::Name, src_.substr(start, pos_ - start), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const two_char[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* candidate : two_char)
          if (src_.compare(pos_, 2, candidate) == 0) op = candidate;
        if (op.size() == 1 && std::string("+-*/%~<>()[]{},.:|=").find(c) == std::string::npos)
          fail(std::string("unexpected character '") + c + "' in a tag", line_);
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        pos_ += op.size();
        tokens_.push_back({TokenKind::Operator, op, line_});
      }
    }
  }

  void lex_number() {
    const size_t start = pos_;
    while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    }
    tokens_.push_back({is_float ? TokenKind::Float : TokenKind::Integer, src_.substr(start, pos_ - start), line_});
  }

  // Python string literal escapes: \n \t \r \\ \' \" \xHH \uHHHH.
  void lex_string(char quote) {
    const int start_line = line_;
    std::string value;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) fail("unterminated string literal", start_line);
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\' || pos_ + 1 >= src_.size()) {
        value += c;
        advance();
        continue;
      }
      const char escaped = src_[pos_ + 1];
      pos_ += 2;
      switch (escaped) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'x': case 'u': {
          const size_t digits = escaped == 'x' ? 2 : 4;
          if (pos_ + digits > src_.size()) fail("bad escape in string literal", line_);
          tokenizer::append_utf8(value, static_cast<char32_t>(std::stoul(src_.substr(pos_, digits), nullptr, 16)));
          pos_ += digits;
          break;
        }
        default:
          value += '\\';
          value += escaped;
      }
    }
    tokens_.push_back({TokenKind::String, std::move(value), start_line});
  }

  const std::string& src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) { return Lexer(source).run(); }

}  // namespace deepfuse::jinja
