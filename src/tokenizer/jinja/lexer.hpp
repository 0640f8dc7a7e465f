// Splits a Jinja template into text and tag tokens, applying whitespace control the way
// transformers configures Jinja for chat templates: trim_blocks (drop the newline after a block
// tag), lstrip_blocks (drop spaces before a block tag at the start of a line), and the explicit
// {%- -%} {{- -}} {#- -#} markers. Comments are dropped here.
#pragma once

#include <string>
#include <vector>

namespace deepfuse::jinja {

enum class TokenKind {
  Text,           // literal template text
  VariableOpen,   // {{
  VariableClose,  // }}
  BlockOpen,      // {%
  BlockClose,     // %}
  Name,
  String,         // already unescaped
  Integer,
  Float,
  Operator,       // + - * / // % ** ~ == != < <= > >= ( ) [ ] { } , . : | =
  End,
};

struct Token {
  TokenKind kind;
  std::string text;
  int line;
};

// Throws deepfuse::Error naming the line for an unterminated tag, comment or string.
std::vector<Token> lex_template(const std::string& source);

}  // namespace deepfuse::jinja
