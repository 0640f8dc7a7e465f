// Prompt lookup's index: for every n-gram length in [1, max_ngram], where the most recent
// occurrence of each n-gram of a sequence ends. Grows with the sequence, O(max_ngram) per token.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepfuse::speculative {

class NgramIndex {
 public:
  explicit NgramIndex(int max_ngram);

  // Indexes the n-grams of `tokens` (the whole sequence so far, the indexed part unchanged since
  // the last call) that end before its last position, so a lookup never finds the suffix itself.
  void update(std::span<const int32_t> tokens);

  struct Match {
    int length = 0;  // tokens the suffix of `tokens` shares with the earlier occurrence (0: none)
    int end = 0;     // index just past that occurrence: tokens[end] is its continuation
  };
  // The most recent earlier occurrence of the longest suffix of `tokens` up to max_ngram long
  // (its length then measured back up to `max_length`). Call update(tokens) first.
  Match lookup(std::span<const int32_t> tokens, int max_length) const;

 private:
  static uint64_t hash(std::span<const int32_t> gram);

  int max_ngram_;
  int indexed_ = 0;                                           // positions whose n-grams are in
  std::vector<std::unordered_map<uint64_t, int>> last_end_;  // per n - 1: n-gram hash -> end
};

}  // namespace deepfuse::speculative
