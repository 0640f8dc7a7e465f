// Recent requests' outputs, shared by every sequence of a backend (suffix drafting's cross-request
// half): each finished sequence leaves the last `prompt_tail` tokens of its prompt and its whole
// output, so a repeated or retried request matches its prompt's end and is proposed its earlier
// output whole. Bounded: past `max_tokens` the oldest entries go (the automaton is rebuilt from
// what stays, amortized over a quarter of the bound). Not thread-safe: one backend thread uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "speculative/suffix_automaton.hpp"

namespace deepfuse::speculative {

struct SuffixCacheOptions {
  size_t max_tokens = 1 << 16;  // tokens kept over all entries
  int prompt_tail = 32;         // prompt tokens kept before each output, to match a repeat on
};

// What a drafter proposes: the tokens and how long a suffix of the context matched to find them.
struct Proposal {
  int match_length = 0;
  std::vector<int32_t> tokens;
};

class SuffixCache {
 public:
  explicit SuffixCache(SuffixCacheOptions options = {});

  void add(std::span<const int32_t> prompt, std::span<const int32_t> output);
  // Up to `limit` tokens that followed the longest suffix of `context` (its last `window` tokens)
  // found in an entry; none when nothing matches or the match ends its entry.
  Proposal propose(std::span<const int32_t> context, int window, int limit) const;
  // How long a suffix of `context` (of its last `window` tokens) some entry holds, continued or not.
  int match_length(std::span<const int32_t> context, int window) const;

  size_t tokens() const { return tokens_; }
  size_t entries() const { return entries_.size(); }

 private:
  void rebuild();

  SuffixCacheOptions options_;
  std::deque<std::vector<int32_t>> entries_;
  size_t tokens_ = 0;
  SuffixAutomaton automaton_;   // over the entries, each followed by a separator of its own
  std::vector<int32_t> text_;   // what the automaton holds
  int32_t next_separator_ = -1;
};

}  // namespace deepfuse::speculative
