// A suffix automaton over a growing token text: the smallest automaton accepting every substring,
// built online in amortized O(1) per token (Blumer et al.). It answers one question for the
// drafters: the longest suffix of a pattern that occurs in the text, and where.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace deepfuse::speculative {

class SuffixAutomaton {
 public:
  SuffixAutomaton();

  // Appends one token to the text. Tokens need not be ids: the suffix cache separates documents
  // with negative ones no pattern holds.
  void push(int32_t token);
  void clear();
  int text_length() const { return length_; }

  struct Match {
    int length = 0;  // of the longest suffix of the pattern that occurs in the text (0: none)
    int end = 0;     // text index just past that suffix's first occurrence
  };
  // O(pattern length) amortized, walking the pattern from the root.
  Match longest_suffix(std::span<const int32_t> pattern) const;

 private:
  struct State {
    int length = 0;     // of the longest string in this state's class
    int link = -1;      // suffix link
    int first_end = 0;  // text index just past the first occurrence of the class's strings
    std::vector<std::pair<int32_t, int>> next;  // transitions, sorted by token
  };
  int find(int state, int32_t token) const;  // -1 when none
  void set(int state, int32_t token, int target);

  std::vector<State> states_;
  int last_ = 0;
  int length_ = 0;
};

}  // namespace deepfuse::speculative
