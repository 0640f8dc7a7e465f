#include "tokenizer/added_tokens.hpp"

#include "deepfuse/error.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::tokenizer {
namespace {

// Whether the last / first character of `text` is a word character (HF's \w$ and ^\w).
bool ends_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return is_word_char(next_code_point(text, start));
}

bool starts_with_word_char(std::string_view text) {
  size_t pos = 0;
  return !text.empty() && is_word_char(next_code_point(text, pos));
}

// Byte offset where the trailing whitespace of `text` begins.
size_t trailing_whitespace_start(std::string_view text) {
  size_t run_start = 0;
  bool in_run = false;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const bool space = is_unicode_whitespace(next_code_point(text, pos));
    if (space && !in_run) run_start = start;
    in_run = space;
  }
  return in_run ? run_start : text.size();
}

size_t leading_whitespace_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!is_unicode_whitespace(next_code_point(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

int AddedTokenMatcher::child(int node, unsigned char byte) const {
  const auto it = edges_.find(static_cast<uint64_t>(node) << 8 | byte);
  return it == edges_.end() ? -1 : it->second;
}

void AddedTokenMatcher::add(const AddedToken& token) {
  if (token.content.empty()) return;
  int node = 0;
  for (const char c : token.content) {
    int next = child(node, static_cast<unsigned char>(c));
    if (next < 0) {
      next = static_cast<int>(nodes_.size());
      nodes_.push_back({});
      edges_[static_cast<uint64_t>(node) << 8 | static_cast<unsigned char>(c)] = next;
    }
    node = next;
  }
  if (nodes_[node].token < 0) {
    nodes_[node].token = static_cast<int>(tokens_.size());
    tokens_.push_back(token);
  }
}

std::pair<int, size_t> AddedTokenMatcher::longest_match(std::string_view text, size_t pos) const {
  std::pair<int, size_t> best{-1, 0};
  int node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, bool at_input_start, std::vector<Segment>& out) const {
  size_t emitted = 0;  // text before this is already in `out`
  size_t pos = 0;
  while (pos < text.size() && !empty()) {
    const auto [index, length] = longest_match(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (token.single_word && (ends_with_word_char(text.substr(0, start)) || starts_with_word_char(text.substr(stop))))
      continue;
    if (token.lstrip) start = std::max(trailing_whitespace_start(text.substr(0, start)), emitted);
    if (token.rstrip) stop += leading_whitespace_length(text.substr(stop));
    if (emitted < start) out.push_back({std::string(text.substr(emitted, start - emitted)), std::nullopt, at_input_start && emitted == 0});
    out.push_back({token.content, token.id, false});
    emitted = stop;
    pos = stop;
  }
  if (emitted < text.size() || text.empty())
    out.push_back({std::string(text.substr(emitted)), std::nullopt, at_input_start && emitted == 0});
}

std::vector<AddedToken> parse_added_tokens(const nlohmann::json& added_tokens) {
  std::vector<AddedToken> tokens;
  if (added_tokens.is_null()) return tokens;
  for (const auto& entry : added_tokens) {
    AddedToken token;
    if (!entry.contains("id") || !entry.contains("content"))
      throw Error("tokenizer.json: an added_tokens entry lacks \"id\" or \"content\": " + entry.dump());
    token.id = entry.at("id").get<TokenId>();
    token.content = entry.at("content").get<std::string>();
    token.special = entry.value("special", false);
    token.lstrip = entry.value("lstrip", false);
    token.rstrip = entry.value("rstrip", false);
    token.single_word = entry.value("single_word", false);
    token.normalized = entry.value("normalized", !token.special);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace deepfuse::tokenizer
