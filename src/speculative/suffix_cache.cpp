#include "speculative/suffix_cache.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse::speculative {

namespace {

std::span<const int32_t> last_window(std::span<const int32_t> context, int window) {
  return context.last(std::min(context.size(), static_cast<size_t>(window)));
}

}  // namespace

SuffixCache::SuffixCache(SuffixCacheOptions options) : options_(options) {
  DF_CHECK(options.max_tokens > 0 && options.prompt_tail >= 0, "suffix cache: needs room for some tokens");
}

void SuffixCache::add(std::span<const int32_t> prompt, std::span<const int32_t> output) {
  if (output.empty()) return;
  const size_t tail = std::min(prompt.size(), static_cast<size_t>(options_.prompt_tail));
  std::vector<int32_t> entry(prompt.end() - tail, prompt.end());
  entry.insert(entry.end(), output.begin(), output.end());
  if (entry.size() > options_.max_tokens) entry.erase(entry.begin(), entry.end() - options_.max_tokens);
  tokens_ += entry.size();
  entries_.push_back(std::move(entry));
  if (tokens_ > options_.max_tokens) {
    // Evict down to three quarters, so a rebuild's cost spreads over many adds.
    while (tokens_ > options_.max_tokens - options_.max_tokens / 4 && entries_.size() > 1) {
      tokens_ -= entries_.front().size();
      entries_.pop_front();
    }
    rebuild();
    return;
  }
  for (const int32_t id : entries_.back()) {
    automaton_.push(id);
    text_.push_back(id);
  }
  // A separator of its own ends each entry: no match runs from one entry into the next.
  automaton_.push(next_separator_);
  text_.push_back(next_separator_--);
}

void SuffixCache::rebuild() {
  automaton_.clear();
  text_.clear();
  next_separator_ = -1;
  for (const std::vector<int32_t>& entry : entries_) {
    for (const int32_t id : entry) {
      automaton_.push(id);
      text_.push_back(id);
    }
    automaton_.push(next_separator_);
    text_.push_back(next_separator_--);
  }
}

Proposal SuffixCache::propose(std::span<const int32_t> context, int window, int limit) const {
  Proposal proposal;
  const SuffixAutomaton::Match match = automaton_.longest_suffix(last_window(context, window));
  if (match.length == 0) return proposal;
  for (int i = match.end; i < static_cast<int>(text_.size()) && text_[i] >= 0 &&
                          static_cast<int>(proposal.tokens.size()) < limit;
       ++i)
    proposal.tokens.push_back(text_[i]);
  if (!proposal.tokens.empty()) proposal.match_length = match.length;
  return proposal;
}

int SuffixCache::match_length(std::span<const int32_t> context, int window) const {
  return automaton_.longest_suffix(last_window(context, window)).length;
}

}  // namespace deepfuse::speculative
