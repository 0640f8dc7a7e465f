#include "speculative/drafter.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse::speculative {

namespace {

// Up to `count` tokens of `tokens` from `first`, after a match of `match_length`.
Proposal continuation(std::span<const int32_t> tokens, int match_length, int first, int count) {
  Proposal proposal;
  const int end = std::min(static_cast<int>(tokens.size()), first + count);
  if (first < end) {
    proposal.match_length = match_length;
    proposal.tokens.assign(tokens.begin() + first, tokens.begin() + end);
  }
  return proposal;
}

}  // namespace

SequenceDrafter::SequenceDrafter(SpeculativeChoice choice, DrafterOptions options, const SuffixCache* shared)
    : choice_(choice),
      options_(options),
      shared_(shared),
      ngrams_(choice == SpeculativeChoice::ngram ? options.max_ngram : 1),
      budget_(options.max_draft) {
  DF_CHECK(options.min_match >= 1 && options.window >= options.min_match,
           "drafter: min_match must be at least 1 and at most the window");
  // So that prompt lookup finds every match longer than min_match (may_propose_after_next's rule).
  DF_CHECK(choice != SpeculativeChoice::ngram || options.max_ngram > options.min_match,
           "drafter: max_ngram must be more than min_match");
}

SuffixAutomaton::Match SequenceDrafter::own_match(std::span<const int32_t> tokens) {
  while (own_.text_length() + 1 < static_cast<int>(tokens.size())) own_.push(tokens[own_.text_length()]);
  return own_.longest_suffix(tokens.last(std::min(tokens.size(), static_cast<size_t>(options_.window))));
}

int SequenceDrafter::match_length(std::span<const int32_t> tokens) {
  if (choice_ == SpeculativeChoice::ngram) {
    ngrams_.update(tokens);
    return ngrams_.lookup(tokens, options_.window).length;
  }
  const int cached = shared_ ? shared_->match_length(tokens, options_.window) : 0;
  return std::max(own_match(tokens).length, cached);
}

Proposal SequenceDrafter::propose(std::span<const int32_t> tokens, int limit) {
  const int length = static_cast<int>(tokens.size());
  const bool awaited = awaited_at_ == length;
  awaited_at_ = -1;
  Proposal proposal = choose(tokens, std::min({limit, budget_.allowance(length), options_.max_draft}));
  if (!proposal.tokens.empty()) proposed_at_ = length;
  else if (awaited) budget_.record_empty(length);  // the caller waited for this step for nothing
  return proposal;
}

bool SequenceDrafter::may_propose_after_next(std::span<const int32_t> tokens) {
  const int next = static_cast<int>(tokens.size()) + 1;
  const bool may = choice_ != SpeculativeChoice::off && !tokens.empty() &&
                   std::min(budget_.allowance(next), options_.max_draft) > 0 &&
                   match_length(tokens) >= options_.min_match;
  awaited_at_ = may ? next : -1;
  return may;
}

Proposal SequenceDrafter::choose(std::span<const int32_t> tokens, int allowed) {
  if (choice_ == SpeculativeChoice::off || allowed <= 0 || tokens.empty()) return {};
  Proposal best;
  if (choice_ == SpeculativeChoice::ngram) {
    ngrams_.update(tokens);
    const NgramIndex::Match match = ngrams_.lookup(tokens, options_.window);
    if (match.length > 0) best = continuation(tokens, match.length, match.end, allowed);
  } else {
    if (shared_) best = shared_->propose(tokens, options_.window, allowed);
    // The cache wins a tie: its continuation is a whole earlier answer, the sequence's own may run
    // into the very suffix it matched (a loop) and end there.
    const SuffixAutomaton::Match match = own_match(tokens);
    if (match.length > best.match_length) best = continuation(tokens, match.length, match.end, allowed);
  }
  if (best.match_length < options_.min_match) return {};
  best.tokens.resize(std::min<size_t>(best.tokens.size(), best.match_length));
  return best;
}

}  // namespace deepfuse::speculative
