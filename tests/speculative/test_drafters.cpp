// The model-free drafters (src/speculative): the suffix automaton and the n-gram index against
// brute force on random texts, the cross-request suffix cache, the draft budget's back-off, what
// each SequenceDrafter proposes and when it says a proposal may come (the engine's launch ahead).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "speculative/draft_budget.hpp"
#include "speculative/drafter.hpp"
#include "speculative/launch_ahead.hpp"
#include "speculative/ngram_index.hpp"
#include "speculative/suffix_automaton.hpp"
#include "speculative/suffix_cache.hpp"
#include "test_util.hpp"

namespace deepfuse::speculative {
namespace {

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int count, int alphabet) {
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % alphabet);
  return tokens;
}

// Does text[end - length, end) equal the last `length` tokens of pattern?
bool occurs_at(const std::vector<int32_t>& text, const std::vector<int32_t>& pattern, int length, int end) {
  if (end < length || end > static_cast<int>(text.size())) return false;
  return std::equal(pattern.end() - length, pattern.end(), text.begin() + (end - length));
}

TEST(SuffixAutomaton, LongestSuffixAndFirstOccurrenceMatchBruteForce) {
  auto rng = testing::make_rng(5401);
  for (int trial = 0; trial < 200; ++trial) {
    const int alphabet = 2 + static_cast<int>(rng() % 5);
    const std::vector<int32_t> text = random_tokens(rng, 1 + static_cast<int>(rng() % 120), alphabet);
    SuffixAutomaton automaton;
    for (const int32_t t : text) automaton.push(t);
    ASSERT_EQ(automaton.text_length(), static_cast<int>(text.size()));
    const std::vector<int32_t> pattern = random_tokens(rng, 1 + static_cast<int>(rng() % 20), alphabet + 1);
    // Brute force: the longest suffix that occurs anywhere, and its first occurrence's end.
    int best = 0, first_end = 0;
    for (int length = static_cast<int>(pattern.size()); length >= 1 && best == 0; --length)
      for (int end = length; end <= static_cast<int>(text.size()); ++end)
        if (occurs_at(text, pattern, length, end)) {
          best = length;
          first_end = end;
          break;
        }
    const SuffixAutomaton::Match match = automaton.longest_suffix(pattern);
    ASSERT_EQ(match.length, best) << "trial " << trial;
    if (best > 0) EXPECT_EQ(match.end, first_end) << "trial " << trial;
  }
}

TEST(SuffixAutomaton, ClearEmptiesIt) {
  SuffixAutomaton automaton;
  for (const int32_t t : {1, 2, 3}) automaton.push(t);
  EXPECT_EQ(automaton.longest_suffix(std::vector<int32_t>{1, 2}).length, 2);
  automaton.clear();
  EXPECT_EQ(automaton.text_length(), 0);
  EXPECT_EQ(automaton.longest_suffix(std::vector<int32_t>{1, 2}).length, 0);
}

TEST(NgramIndex, FindsTheMostRecentEarlierOccurrenceOfTheLongestSuffix) {
  auto rng = testing::make_rng(5402);
  constexpr int kMaxNgram = 4, kMaxLength = 64;
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<int32_t> all = random_tokens(rng, 2 + static_cast<int>(rng() % 150), 2 + rng() % 4);
    NgramIndex index(kMaxNgram);
    // Grow the sequence in random steps, looking up after each, as a drafter does.
    for (size_t size = 1; size <= all.size(); size += 1 + rng() % 3) {
      const std::vector<int32_t> tokens(all.begin(), all.begin() + size);
      index.update(tokens);
      const NgramIndex::Match match = index.lookup(tokens, kMaxLength);
      int want_n = 0, want_end = 0;
      for (int n = std::min<int>(kMaxNgram, static_cast<int>(size) - 1); n >= 1 && want_n == 0; --n)
        for (int end = static_cast<int>(size) - 1; end >= n; --end)
          if (occurs_at(tokens, tokens, n, end)) {
            want_n = n;
            want_end = end;
            break;
          }
      if (want_n == 0) {
        EXPECT_EQ(match.length, 0);
        continue;
      }
      ASSERT_EQ(match.end, want_end) << "trial " << trial << " size " << size;
      int want_length = 0;  // the match measured back from the end, up to kMaxLength
      while (want_length < std::min(kMaxLength, want_end) &&
             tokens[want_end - 1 - want_length] == tokens[size - 1 - want_length])
        ++want_length;
      EXPECT_EQ(match.length, want_length);
      EXPECT_GE(match.length, want_n);
    }
  }
}

TEST(SuffixCache, ARepeatedRequestIsProposedItsEarlierOutput) {
  auto rng = testing::make_rng(5403);
  SuffixCache cache;
  const std::vector<int32_t> prompt = random_tokens(rng, 100, 1000);
  const std::vector<int32_t> output = random_tokens(rng, 40, 1000);
  cache.add(random_tokens(rng, 50, 1000), random_tokens(rng, 30, 1000));  // unrelated
  cache.add(prompt, output);
  const Proposal whole = cache.propose(prompt, 64, 1000);
  EXPECT_EQ(whole.tokens, output);  // the whole output, and no further (the entry ends)
  EXPECT_EQ(whole.match_length, 32);  // the prompt tail kept
  // Midway through the repeat: the rest of the output.
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), output.begin(), output.begin() + 25);
  const Proposal rest = cache.propose(context, 64, 8);
  EXPECT_EQ(rest.tokens, std::vector<int32_t>(output.begin() + 25, output.begin() + 33));
  // A fresh prompt matches nothing long.
  EXPECT_LT(cache.propose(random_tokens(rng, 100, 1000), 64, 8).match_length, 2);
}

TEST(SuffixCache, NoMatchRunsAcrossEntriesAndTheBoundHolds) {
  SuffixCacheOptions options;
  options.max_tokens = 100;
  options.prompt_tail = 2;
  SuffixCache cache(options);
  cache.add(std::vector<int32_t>{1, 2}, std::vector<int32_t>{3, 4});
  cache.add(std::vector<int32_t>{5, 6}, std::vector<int32_t>{7, 8});
  // "3 4" ends its entry: the next entry's tokens are not its continuation.
  EXPECT_TRUE(cache.propose(std::vector<int32_t>{3, 4}, 64, 8).tokens.empty());
  EXPECT_EQ(cache.propose(std::vector<int32_t>{9, 5, 6}, 64, 8).tokens, (std::vector<int32_t>{7, 8}));
  for (int i = 0; i < 50; ++i) {
    cache.add(std::vector<int32_t>{100 + i}, std::vector<int32_t>{200 + i, 300 + i, 400 + i});
    EXPECT_LE(cache.tokens(), options.max_tokens);
  }
  // The oldest entries went; the newest is still proposed.
  EXPECT_TRUE(cache.propose(std::vector<int32_t>{5, 6}, 64, 8).tokens.empty());
  EXPECT_EQ(cache.propose(std::vector<int32_t>{149, 249}, 64, 8).tokens, (std::vector<int32_t>{349, 449}));
}

TEST(DraftBudget, GrowsOnFullAcceptanceAndBacksOffOnMisses) {
  DraftBudget budget(8);
  int length = 100;  // the sequence's tokens: a verify emits what it accepted plus one
  EXPECT_EQ(budget.allowance(length), 8);
  budget.record(length, 8, 3);  // partial: what was accepted plus one
  length += 4;
  EXPECT_EQ(budget.allowance(length), 4);
  budget.record(length, 4, 4);  // all: doubles, up to the max
  length += 5;
  EXPECT_EQ(budget.allowance(length), 8);
  budget.record(length, 8, 0);  // a miss halves
  length += 1;
  EXPECT_EQ(budget.allowance(length), 4);
  budget.record(length, 4, 0);  // a second miss in a row: sits out the next 2 tokens
  length += 1;
  EXPECT_EQ(budget.allowance(length), 0);
  EXPECT_EQ(budget.allowance(length + 1), 0);
  length += 2;
  EXPECT_EQ(budget.allowance(length), 2);
  budget.record(length, 2, 0);  // third: 4 tokens
  length += 1;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(budget.allowance(length + i), 0);
  length += 4;
  EXPECT_EQ(budget.allowance(length), 1);
  for (int miss = 0; miss < 20; ++miss) budget.record(length++, 1, 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(budget.allowance(length + i), 0) << i;  // never more than 64
  length += 64;
  EXPECT_EQ(budget.allowance(length), 1);
  budget.record(length, 1, 1);  // any accept ends the back-off
  length += 2;
  EXPECT_EQ(budget.allowance(length), 2);
  budget.record(length, 2, 1);
  length += 2;
  EXPECT_EQ(budget.allowance(length), 2);
  budget.record(length, 2, 0);  // one miss again: the cap halves, no sitting out
  length += 1;
  EXPECT_EQ(budget.allowance(length), 1);
}

TEST(DraftBudget, AStepWaitedForInVainIsAMissThatKeepsTheCap) {
  DraftBudget budget(8);
  budget.record_empty(10);
  EXPECT_EQ(budget.allowance(11), 8);  // one: no sitting out, the cap kept
  budget.record_empty(11);             // two in a row: the next 2 tokens
  EXPECT_EQ(budget.allowance(12), 0);
  EXPECT_EQ(budget.allowance(13), 0);
  EXPECT_EQ(budget.allowance(14), 8);
  budget.record(14, 4, 0);  // a verify's miss continues the run: 4 tokens, and the cap halves
  for (int length = 15; length < 19; ++length) EXPECT_EQ(budget.allowance(length), 0) << length;
  EXPECT_EQ(budget.allowance(19), 4);
}

TEST(SequenceDrafter, PromptLookupProposesWhatFollowedTheMatch) {
  SequenceDrafter drafter(SpeculativeChoice::ngram, {});
  // "10 11 12 13 14 15 16 ... 10 11 12": what followed 10 11 12 is 13 14 ..., up to the match length.
  std::vector<int32_t> tokens{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 99, 10, 11, 12};
  const Proposal p = drafter.propose(tokens, 8);
  EXPECT_EQ(p.match_length, 3);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{13, 14, 15}));  // k <= match length
  const Proposal limited = drafter.propose(tokens, 2);
  EXPECT_EQ(limited.tokens, (std::vector<int32_t>{13, 14}));
  tokens.insert(tokens.end(), {13, 14, 15, 16, 17});  // a long match now: up to max_draft
  EXPECT_EQ(drafter.propose(tokens, 100).tokens, (std::vector<int32_t>{18, 19, 99, 10, 11, 12, 13, 14}));
}

TEST(SequenceDrafter, NothingMatchesNothingIsProposed) {
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = i;
  for (const SpeculativeChoice choice : all_choices<SpeculativeChoice>()) {
    SequenceDrafter drafter(choice, {});
    EXPECT_TRUE(drafter.propose(tokens, 8).tokens.empty()) << choice_name(choice);
  }
  // A single repeated token is a match of 1: under min_match, nothing.
  tokens.push_back(5);
  SequenceDrafter drafter(SpeculativeChoice::ngram, {});
  EXPECT_TRUE(drafter.propose(tokens, 8).tokens.empty());
  SequenceDrafter off(SpeculativeChoice::off, {});
  tokens.push_back(6);
  EXPECT_TRUE(off.propose(tokens, 8).tokens.empty());
}

TEST(SequenceDrafter, SuffixDraftsFromTheSequenceAndFromEarlierRequests) {
  auto rng = testing::make_rng(5404);
  SuffixCache cache;
  const std::vector<int32_t> prompt = random_tokens(rng, 60, 5000);
  const std::vector<int32_t> output = random_tokens(rng, 20, 5000);
  SequenceDrafter first(SpeculativeChoice::suffix, {}, &cache);
  EXPECT_TRUE(first.propose(prompt, 8).tokens.empty());
  cache.add(prompt, output);
  SequenceDrafter second(SpeculativeChoice::suffix, {}, &cache);
  EXPECT_EQ(second.propose(prompt, 8).tokens, std::vector<int32_t>(output.begin(), output.begin() + 8));
  // Its own text: a repeat inside the sequence (longer than anything cached) is found there.
  std::vector<int32_t> tokens = random_tokens(rng, 30, 5000);
  tokens.insert(tokens.end(), tokens.begin() + 5, tokens.begin() + 15);
  SequenceDrafter own(SpeculativeChoice::suffix, {}, &cache);
  const Proposal p = own.propose(tokens, 8);
  EXPECT_EQ(p.match_length, 10);
  EXPECT_EQ(p.tokens, std::vector<int32_t>(tokens.begin() + 15, tokens.begin() + 23));
}

TEST(SequenceDrafter, SuffixTakesTheCachedAnswerOnATie) {
  // "A X A" with A as long as the window: A matches in the sequence (followed by X) and in the
  // cache (followed by an earlier answer's 5 6 7); the cache's continuation is proposed.
  const std::vector<int32_t> a{11, 12, 13, 14, 15, 16, 17, 18}, x{30, 31, 32, 33};
  std::vector<int32_t> tokens = a;
  tokens.insert(tokens.end(), x.begin(), x.end());
  tokens.insert(tokens.end(), a.begin(), a.end());
  SuffixCache cache;
  std::vector<int32_t> earlier = a;
  earlier.insert(earlier.end(), {5, 6, 7});
  cache.add(std::vector<int32_t>{9}, earlier);
  DrafterOptions options;
  options.window = 8;
  SequenceDrafter drafter(SpeculativeChoice::suffix, options, &cache);
  const Proposal p = drafter.propose(tokens, 8);
  EXPECT_EQ(p.match_length, 8);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{5, 6, 7}));
  SequenceDrafter alone(SpeculativeChoice::suffix, options, nullptr);
  // Without the cache: what followed A before (X, then A again).
  EXPECT_EQ(alone.propose(tokens, 8).tokens, (std::vector<int32_t>{30, 31, 32, 33, 11, 12, 13, 14}));
}

TEST(SequenceDrafter, BacksOffAfterMisses) {
  std::vector<int32_t> tokens;
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 10; ++i) tokens.push_back(i);  // a loop: always a long match
  SequenceDrafter drafter(SpeculativeChoice::ngram, {});
  // Each step the loop goes on by one token (a verify that accepts nothing emits one).
  auto next_step = [&] {
    tokens.push_back(tokens[tokens.size() - 10]);
    return drafter.propose(tokens, 8).tokens.size();
  };
  EXPECT_EQ(drafter.propose(tokens, 8).tokens.size(), 8u);
  drafter.record(8, 0);
  EXPECT_EQ(next_step(), 4u);
  drafter.record(4, 0);
  EXPECT_EQ(next_step(), 0u);  // sitting out
  EXPECT_EQ(next_step(), 0u);
  EXPECT_EQ(next_step(), 2u);
}

// The engine launches a step ahead of the host while no drafter may propose at it: whenever
// may_propose_after_next says no, propose() after any next token proposes nothing, or only from a
// match of exactly min_match that the next token completes (a stretch that starts drafting a step
// later). Along random sequences over small alphabets (matches come and go), every next token
// tried, with random options, a suffix cache, and budgets backing off on the way.
TEST(SequenceDrafter, MayProposeAfterNextSaysNoOnlyWhenNoMatchIsInProgress) {
  auto rng = testing::make_rng(5405);
  int said_no = 0, said_yes = 0, proposed_after_yes = 0, started = 0;
  for (const SpeculativeChoice choice : {SpeculativeChoice::ngram, SpeculativeChoice::suffix}) {
    for (int trial = 0; trial < 40; ++trial) {
      DrafterOptions options;
      options.max_draft = 1 + static_cast<int>(rng() % 8);
      options.min_match = 1 + static_cast<int>(rng() % 3);
      options.window = options.min_match + static_cast<int>(rng() % 10);
      options.max_ngram = options.min_match + 1 + static_cast<int>(rng() % 4);
      const int alphabet = 4 + static_cast<int>(rng() % 12);
      SuffixCache cache;
      cache.add(random_tokens(rng, 10, alphabet), random_tokens(rng, 15, alphabet));
      SequenceDrafter drafter(choice, options, &cache);
      std::vector<int32_t> tokens = random_tokens(rng, 1 + static_cast<int>(rng() % 6), alphabet);
      for (int step = 0; step < 60; ++step) {
        const SequenceDrafter before = drafter;
        const bool may = drafter.may_propose_after_next(tokens);
        (may ? said_yes : said_no) += 1;
        for (int32_t next = 0; next <= alphabet && !may; ++next) {  // `alphabet` itself: a new token
          SequenceDrafter probe = before;
          std::vector<int32_t> longer = tokens;
          longer.push_back(next);
          const Proposal after = probe.propose(longer, 8);
          ASSERT_TRUE(after.tokens.empty() || after.match_length == options.min_match)
              << choice_name(choice) << " trial " << trial << " step " << step << " next " << next << ": a match of "
              << after.match_length;
          started += !after.tokens.empty();
        }
        // The step itself: a next token, then what a verify accepts of the drafts and one more.
        tokens.push_back(static_cast<int32_t>(rng() % alphabet));
        const Proposal proposal = drafter.propose(tokens, 8);
        if (proposal.tokens.empty()) continue;
        proposed_after_yes += may;
        const int accepted = static_cast<int>(rng() % (proposal.tokens.size() + 1));
        drafter.record(static_cast<int>(proposal.tokens.size()), accepted);
        tokens.insert(tokens.end(), proposal.tokens.begin(), proposal.tokens.begin() + accepted);
        tokens.push_back(static_cast<int32_t>(rng() % alphabet));
      }
    }
  }
  std::printf("said no %d (a next token could start a match %d times), yes %d (a proposal followed %d times)\n",
              said_no, started, said_yes, proposed_after_yes);
  EXPECT_GT(said_no, 100);
  EXPECT_GT(started, 100);
  EXPECT_GT(proposed_after_yes, 100);
}

TEST(SequenceDrafter, AStepWaitedForThatProposesNothingCountsAsAMiss) {
  // "1 ... 9 1 2": "1 2" matched, so a proposal may come after the next token; none does when
  // that token is new. Three waits in vain in a row: the drafter sits out the next 4 tokens.
  std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2};
  SequenceDrafter drafter(SpeculativeChoice::ngram, {});
  SequenceDrafter unasked = drafter;  // proposes at the same steps, never asked beforehand
  int32_t fresh = 100;
  for (int wait = 0; wait < 3; ++wait) {
    if (wait > 0) tokens.insert(tokens.end(), {1, 2});
    EXPECT_TRUE(drafter.may_propose_after_next(tokens)) << wait;
    tokens.push_back(fresh++);  // nothing followed "2 <fresh>" before
    EXPECT_TRUE(drafter.propose(tokens, 8).tokens.empty());
    EXPECT_TRUE(unasked.propose(tokens, 8).tokens.empty());
  }
  tokens.insert(tokens.end(), {1, 2});  // the first two of the 4 tokens
  EXPECT_FALSE(drafter.may_propose_after_next(tokens));
  EXPECT_TRUE(unasked.may_propose_after_next(tokens));
  tokens.push_back(3);
  EXPECT_FALSE(drafter.may_propose_after_next(tokens));
  tokens.push_back(4);
  EXPECT_TRUE(drafter.may_propose_after_next(tokens));  // its next step drafts after the 4th
}

TEST(LaunchAhead, TheNextStepMayDraftWhenSomeSequenceMayAndNoneBlocks) {
  using enum NextStepDrafts;
  auto may_draft = [](std::vector<NextStepDrafts> sequences) { return next_step_may_draft(sequences); };
  EXPECT_FALSE(may_draft({}));
  EXPECT_FALSE(may_draft({none, none}));
  EXPECT_TRUE(may_draft({none, possible, none}));
  EXPECT_TRUE(may_draft({possible}));
  EXPECT_FALSE(may_draft({possible, blocks}));
  EXPECT_FALSE(may_draft({blocks, none}));
}

}  // namespace
}  // namespace deepfuse::speculative
