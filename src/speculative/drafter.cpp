#include "speculative/drafter.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse::speculative {

namespace {

// Up to `count` tokens of `tokens` from `first`.
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
}

Proposal SequenceDrafter::own_suffix_match(std::span<const int32_t> tokens, int limit) {
  while (own_.text_length() + 1 < static_cast<int>(tokens.size())) own_.push(tokens[own_.text_length()]);
  const size_t from = tokens.size() > static_cast<size_t>(options_.window) ? tokens.size() - options_.window : 0;
  const SuffixAutomaton::Match match = own_.longest_suffix(tokens.subspan(from));
  if (match.length == 0) return {};
  return continuation(tokens, match.length, match.end, limit);
}

Proposal SequenceDrafter::propose(std::span<const int32_t> tokens, int limit) {
  const int allowed = std::min({limit, budget_.allowance(), options_.max_draft});
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
    Proposal own = own_suffix_match(tokens, allowed);
    if (own.match_length > best.match_length) best = std::move(own);
  }
  if (best.match_length < options_.min_match) return {};
  best.tokens.resize(std::min<size_t>(best.tokens.size(), best.match_length));
  return best;
}

}  // namespace deepfuse::speculative
