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
// The drafting step must know the sequence's last token; may_propose_after_next says, one token
// ahead, whether it is worth waiting for it (docs/runtime.md, "Launched ahead while nothing drafts").
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

  // `tokens`: the whole sequence so far, which only grows between calls. At most one call per step.
  Proposal propose(std::span<const int32_t> tokens, int limit);
  // Whether propose() may draft at the next step, which drafts after one more token than `tokens`
  // (the one a step in flight samples): while it is false the engine launches that step ahead of
  // the host. False while the budget sits that step out, or when `tokens` ends in no match of
  // min_match tokens (no match in progress). A match grows by at most one token per token, so
  // after a no, that step could only have proposed from a match of exactly min_match that the
  // token in flight completes (a suffix cache that grew in between aside): such a stretch starts
  // drafting one step later. Not the exact rule (a match of min_match - 1 tokens): one token is
  // nearly always found in a large suffix cache, so every step would wait. True means the caller
  // waits for the token; if propose() then proposes nothing, the wait counts as a miss
  // (DraftBudget::record_empty).
  bool may_propose_after_next(std::span<const int32_t> tokens);
  // What the verify step accepted of the last proposal (drafted > 0).
  void record(int drafted, int accepted) { budget_.record(proposed_at_, drafted, accepted); }
  const DraftBudget& budget() const { return budget_; }

 private:
  // The proposal after `tokens` of at most `allowed` drafts (none under min_match).
  Proposal choose(std::span<const int32_t> tokens, int allowed);
  // The longest suffix of `tokens` (within the window) that the matchers find, continued or not.
  int match_length(std::span<const int32_t> tokens);
  SuffixAutomaton::Match own_match(std::span<const int32_t> tokens);

  SpeculativeChoice choice_;
  DrafterOptions options_;
  const SuffixCache* shared_;
  NgramIndex ngrams_;
  SuffixAutomaton own_;  // over the sequence but its last token (so a match has a continuation)
  DraftBudget budget_;
  int proposed_at_ = 0;  // the sequence's length at the last proposal with drafts
  int awaited_at_ = -1;  // the length may_propose_after_next last said a proposal may come at
};

}  // namespace deepfuse::speculative
