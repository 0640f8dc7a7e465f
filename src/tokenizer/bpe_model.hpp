// The BPE model of tokenizer.json: a vocab, ranked merges, and the rules for characters the
// vocab lacks (byte fallback to <0xNN> tokens, or an unk token, optionally fused).
//
// Merging follows Hugging Face exactly: every adjacent pair with a merge sits in a min-heap
// ordered by (rank, position); the lowest pops, stale entries are skipped, and the pairs around
// the merged symbol are pushed. O(n log n) in the word length, never quadratic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/tokenizer.hpp"

namespace deepfuse::tokenizer {

class BpeModel {
 public:
  // From tokenizer.json's "model" object (type "BPE"). Throws deepfuse::Error naming the
  // problem: a merge naming a token that is not in the vocab, a malformed merge, etc.
  static BpeModel from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string* id_to_token(TokenId id) const;  // nullptr when out of range or unused
  size_t id_bound() const { return id_to_token_.size(); }

 private:
  struct MergeResult {
    uint32_t rank;
    TokenId merged;
  };
  static uint64_t pair_key(TokenId left, TokenId right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  // Initial symbols of a word: one per character, or byte tokens / unk for unknown characters.
  struct Symbol {
    TokenId id;
    int prev, next;  // neighbours in the word, -1 at the ends
    bool alive;
  };
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, MergeResult> merges_;
  std::optional<TokenId> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<std::optional<TokenId>, 256> byte_token_ids_{};  // <0xNN> tokens, for byte fallback
};

}  // namespace deepfuse::tokenizer
