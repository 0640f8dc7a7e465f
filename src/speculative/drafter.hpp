// One sequence's drafter: proposes the tokens a verify step checks after the sequence so far.
//   ngram:  prompt lookup, what followed the most recent earlier occurrence of the longest suffix
//           (up to max_ngram tokens) of the prompt and output.
//   suffix: a suffix automaton over the sequence itself and the backend's SuffixCache of recent
//           requests; the longer match proposes (the cache's on a tie). The automata give a
//           match's first occurrence, so where a matched stretch recurs (a loop) the proposal
//           follows its first pass; a loop that later breaks costs one partly rejected step,
//           after which the longer match is unique.
// The number of drafts is the smallest of the caller's limit, the match's length (a match of 2
// proposes at most 2) and the DraftBudget's allowance (the measured acceptance); a match shorter
// than min_match proposes nothing, so a miss costs no verify rows.
#pragma once

#include <cstdint>
#include <span>

#include "deepfuse/speculative.hpp"
#include "speculative/draft_budget.hpp"
#include "speculative/ngram_index.hpp"
#include "speculative/suffix_automaton.hpp"
#include "speculative/suffix_cache.hpp"

namespace deepfuse::speculative {

struct DrafterOptions {
  int max_draft = 8;  // drafts per step at most
  int min_match = 2;  // matched tokens needed to propose anything
  int max_ngram = 8;  // prompt lookup's longest indexed n-gram
  int window = 64;    // context tokens a match is looked for (and measured) in
};

class SequenceDrafter {
 public:
  // `shared` (suffix only, may be null) must outlive the drafter.
  SequenceDrafter(SpeculativeChoice choice, DrafterOptions options, const SuffixCache* shared = nullptr);

  // `tokens`: the whole sequence so far, which only grows between calls. One call per step.
  Proposal propose(std::span<const int32_t> tokens, int limit);
  // What the verify step accepted of the last proposal (drafted > 0).
  void record(int drafted, int accepted) { budget_.record(drafted, accepted); }
  const DraftBudget& budget() const { return budget_; }

 private:
  Proposal own_suffix_match(std::span<const int32_t> tokens, int limit);

  SpeculativeChoice choice_;
  DrafterOptions options_;
  const SuffixCache* shared_;
  NgramIndex ngrams_;
  SuffixAutomaton own_;  // over the sequence but its last token (so a match has a continuation)
  DraftBudget budget_;
};

}  // namespace deepfuse::speculative
