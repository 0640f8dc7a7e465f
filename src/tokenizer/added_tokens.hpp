// The added tokens of tokenizer.json ("added_tokens"): matched as whole strings in the text
// before normalization and pre-tokenization, leftmost-longest like HF's Aho-Corasick matcher,
// with the lstrip / rstrip / single_word rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::tokenizer {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // swallow whitespace before the match
  bool rstrip = false;       // swallow whitespace after it
  bool single_word = false;  // match only when not inside a word
  bool normalized = false;   // match in the normalized text rather than the raw text
};

// A stretch of the input: either an added token or text still to be tokenized.
struct Segment {
  std::string text;
  std::optional<TokenId> token;
  bool at_input_start;
};

class AddedTokenMatcher {
 public:
  void add(const AddedToken& token);
  bool empty() const { return nodes_.size() == 1; }
  // Splits `text` into added-token segments and the text between them.
  void split(std::string_view text, bool at_input_start, std::vector<Segment>& out) const;

 private:
  struct Node {
    int token = -1;  // index into tokens_ when a token ends here
  };
  int child(int node, unsigned char byte) const;
  // Longest token starting at text[pos]: (token index, length), or token index -1.
  std::pair<int, size_t> longest_match(std::string_view text, size_t pos) const;

  std::vector<Node> nodes_{Node{}};
  std::unordered_map<uint64_t, int> edges_;  // (node << 8 | byte) -> child node
  std::vector<AddedToken> tokens_;
};

// Parses tokenizer.json's "added_tokens" array.
std::vector<AddedToken> parse_added_tokens(const nlohmann::json& added_tokens);

}  // namespace deepfuse::tokenizer
