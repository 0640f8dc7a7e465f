// The step scheduler both backends run: FIFO admission up to max_batch, the prefill token budget
// and chunking, preemption of the youngest with requeue, prefix-cache matching, rows kept compact.
//
// Beyond the unit cases, simulated backends drive it on a fake model whose next token hashes
// every key/value slot the sequence reads through its block table: the CPU backend's pattern (one
// plan per step, run and reported at once), the CUDA engine's (prefill, then decode steps
// launched ahead of their read-back, each row's sample kept where its next step reads it, padded
// rows clobbering the samples of rows a step leaves out), and the engine's with mixed steps (one
// plan per launch, prompt chunks and decode rows in one pass whose sampler writes every row). A wrong page, a block shared before it
// was written, a stale sample or a recompute from the wrong tokens changes some output, so every
// sequence's tokens must equal those it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "batching/step_scheduler.hpp"
#include "deepfuse/error.hpp"
#include "test_util.hpp"

namespace deepfuse::batching {
namespace {

constexpr int kBlock = 16;

SequenceSpec spec_of(int prompt_tokens, int max_new, int first_id = 1) {
  SequenceSpec spec;
  spec.prompt.resize(prompt_tokens);
  std::iota(spec.prompt.begin(), spec.prompt.end(), first_id);
  spec.max_new_tokens = max_new;
  return spec;
}

// Runs a plan as the CPU backend does: every sample is token 7.
StepPlan run_step(StepScheduler& scheduler, std::vector<FinishReason>* finishes = nullptr) {
  StepPlan plan = scheduler.schedule(Phase::both);
  const StepPlan seen = plan;
  scheduler.complete(plan);
  std::vector<Sequence*> sampling;
  for (const PrefillChunk& c : plan.prefill)
    if (c.samples) sampling.push_back(c.sequence);
  for (const DecodeRow& d : plan.decode) sampling.push_back(d.sequence);
  for (Sequence* s : sampling) {
    const FinishReason predicted = scheduler.finish_on(*s, 7);  // what the engine asks before reporting
    const FinishReason finish = scheduler.report(*s, 7).finish;
    EXPECT_EQ(finish, predicted);
    if (finishes) finishes->push_back(finish);
  }
  return seen;
}

// Adds a sequence, prefills its prompt in one step and reports its first token (3): it decodes next.
Sequence& add_and_prefill(StepScheduler& scheduler, SequenceKey key, const SequenceSpec& spec) {
  scheduler.add(key, spec);
  StepPlan prefill = scheduler.schedule(Phase::prefill);
  scheduler.complete(prefill);
  Sequence& s = *prefill.prefill.back().sequence;
  scheduler.report(s, 3);
  return s;
}

TEST(StepScheduler, ChunksAPromptUnderThePrefillBudgetWhileOthersDecode) {
  KvBlockPool pool(64, false);
  StepScheduler scheduler({4, 512, 32}, pool);
  scheduler.add(1, spec_of(10, 100));
  run_step(scheduler);  // prefills 1 entirely, samples its first token
  scheduler.add(2, spec_of(100, 100));
  StepPlan plan = scheduler.schedule(Phase::both);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].sequence->key, 2u);
  EXPECT_EQ(plan.prefill[0].count, 32);  // the budget counts prompt tokens
  EXPECT_FALSE(plan.prefill[0].samples);
  ASSERT_EQ(plan.decode.size(), 1u);
  EXPECT_EQ(plan.decode[0].sequence->key, 1u);
  EXPECT_EQ(plan.decode[0].position, 10);
  EXPECT_FALSE(plan.decode[0].feeds_sample_in_flight());
  EXPECT_EQ(pool.used_pages(), 1 + 7) << "pages for the whole prompt at admission";
}

TEST(StepScheduler, AdmitsFirstInFirstOutUpToMaxBatch) {
  KvBlockPool pool(64, false);
  StepScheduler scheduler({2, 512, 0}, pool);
  for (SequenceKey k = 1; k <= 3; ++k) scheduler.add(k, spec_of(4, 3));
  const StepPlan plan = run_step(scheduler);
  ASSERT_EQ(plan.prefill.size(), 2u);
  EXPECT_EQ(scheduler.running(), 2);
  EXPECT_EQ(scheduler.waiting(), 1);
  EXPECT_EQ(scheduler.at_row(0).key, 1u);
  EXPECT_EQ(scheduler.at_row(1).key, 2u);
  for (int i = 0; i < 10 && scheduler.has_work(); ++i) run_step(scheduler);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(pool.used_pages(), 0);
}

TEST(StepScheduler, AWaitingPromptThatDoesNotFitHoldsBackTheQueue) {
  KvBlockPool pool(4, false);
  StepScheduler scheduler({4, 512, 0}, pool);
  scheduler.add(1, spec_of(40, 5));  // 3 pages
  scheduler.add(2, spec_of(30, 5));  // 2 pages: waits
  scheduler.add(3, spec_of(4, 5));   // 1 page would fit, but the queue is first in first out
  const StepPlan plan = scheduler.schedule(Phase::prefill);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(scheduler.waiting(), 2);
}

TEST(StepScheduler, PreemptsTheYoungestAndRequeuesItWithItsTokens) {
  KvBlockPool pool(4, false);  // 64 positions
  StepScheduler scheduler({4, 512, 0}, pool);
  scheduler.add(1, spec_of(16, 40));  // 55 positions: four pages
  scheduler.add(2, spec_of(16, 40));
  std::vector<FinishReason> finishes;
  // Both hold two pages after 16 decode steps; the next step needs a third for each.
  for (int i = 0; i < 17; ++i) run_step(scheduler, &finishes);
  EXPECT_EQ(scheduler.preemptions(), 0u);
  run_step(scheduler, &finishes);
  EXPECT_EQ(scheduler.preemptions(), 1u);
  ASSERT_EQ(scheduler.waiting(), 1);
  const Sequence* waiting = scheduler.find(2);
  ASSERT_NE(waiting, nullptr);
  EXPECT_EQ(waiting->row, -1);
  EXPECT_TRUE(waiting->pages.empty());
  EXPECT_EQ(waiting->computed, 0);
  EXPECT_EQ(static_cast<int>(waiting->tokens.size()), 16 + 17) << "the prompt and every token it generated";
  EXPECT_EQ(scheduler.at_row(0).key, 1u);
  for (int i = 0; i < 200 && scheduler.has_work(); ++i) run_step(scheduler, &finishes);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(std::count(finishes.begin(), finishes.end(), FinishReason::max_tokens), 2);
  EXPECT_EQ(pool.used_pages(), 0);
}

TEST(StepScheduler, TakesTheCachedPrefixAtAdmissionButComputesTheLastPosition) {
  KvBlockPool pool(64, true);
  StepScheduler scheduler({4, 512, 0}, pool);
  scheduler.add(1, spec_of(40, 1));
  run_step(scheduler);  // 2 full blocks registered, then the sequence ends
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.cached_pages(), 2);
  scheduler.add(2, spec_of(40, 1));
  StepPlan plan = scheduler.schedule(Phase::both);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].first, 32);
  EXPECT_EQ(plan.prefill[0].count, 8);
  EXPECT_EQ(plan.prefill[0].sequence->cached_tokens, 32);
  // A prompt of exactly two blocks keeps its last block to compute.
  scheduler.cancel(2);
  scheduler.add(3, spec_of(32, 1));
  plan = scheduler.schedule(Phase::both);
  ASSERT_EQ(plan.prefill.size(), 1u);
  EXPECT_EQ(plan.prefill[0].first, 16);
  EXPECT_EQ(scheduler.prefix_hit_tokens(), 48u);
}

TEST(StepScheduler, CancelReleasesPagesAndMovesTheLastRowIntoTheHole) {
  KvBlockPool pool(16, false);
  StepScheduler scheduler({3, 512, 0}, pool);
  std::vector<std::pair<int, int>> moves;
  scheduler.on_row_move([&](int from, int to) { moves.emplace_back(from, to); });
  for (SequenceKey k = 1; k <= 4; ++k) scheduler.add(k, spec_of(20, 10));
  run_step(scheduler);
  EXPECT_GT(pool.used_pages(), 0);
  EXPECT_TRUE(scheduler.cancel(1));
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0], std::make_pair(2, 0));
  EXPECT_EQ(scheduler.at_row(0).key, 3u);
  EXPECT_EQ(scheduler.at_row(0).row, 0);
  EXPECT_TRUE(scheduler.cancel(4));  // waiting: holds no pages, no row
  EXPECT_EQ(moves.size(), 1u);
  EXPECT_TRUE(scheduler.cancel(3));
  EXPECT_TRUE(scheduler.cancel(2));
  EXPECT_FALSE(scheduler.cancel(1));
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_FALSE(scheduler.has_work());
}

TEST(StepScheduler, FindsRunningSequencesAtTheirRowOrWhereTheyMoved) {
  KvBlockPool pool(16, false);
  StepScheduler scheduler({2, 512, 0}, pool);
  for (SequenceKey k = 1; k <= 3; ++k) scheduler.add(k, spec_of(20, 10));
  run_step(scheduler);
  EXPECT_EQ(scheduler.find_running(1, 0), scheduler.find(1));
  EXPECT_EQ(scheduler.find_running(2, 0), scheduler.find(2));  // not at the row given: searched
  EXPECT_EQ(scheduler.find_running(2, 7), scheduler.find(2));  // no such row
  EXPECT_EQ(scheduler.find_running(3, 0), nullptr);            // waiting, not running
  EXPECT_EQ(scheduler.find_running(9, 1), nullptr);
  ASSERT_TRUE(scheduler.cancel(1));
  ASSERT_NE(scheduler.find_running(2, 1), nullptr);  // moved from row 1 into row 0
  EXPECT_EQ(scheduler.find_running(2, 1)->row, 0);
}

TEST(StepScheduler, EndsOnStopIdsAndAtTheContextLength) {
  KvBlockPool pool(16, false);
  StepScheduler scheduler({2, 12, 0}, pool);
  SequenceSpec stops = spec_of(4, 100);
  stops.stop_ids = {7};
  scheduler.add(1, stops);
  scheduler.add(2, spec_of(10, 100));
  std::vector<FinishReason> finishes;
  for (int i = 0; i < 10 && scheduler.has_work(); ++i) run_step(scheduler, &finishes);
  EXPECT_EQ(std::count(finishes.begin(), finishes.end(), FinishReason::stop_token), 1);
  EXPECT_EQ(std::count(finishes.begin(), finishes.end(), FinishReason::context_length), 1);
}

TEST(StepScheduler, DecodeRowsFeedSamplesInFlightOnlyWhileTheRowKeepsThem) {
  KvBlockPool pool(16, false);
  StepScheduler scheduler({2, 512, 0}, pool);
  add_and_prefill(scheduler, 1, spec_of(5, 10));
  const StepPlan first = scheduler.schedule(Phase::decode);  // feeds the reported token
  ASSERT_EQ(first.decode.size(), 1u);
  EXPECT_FALSE(first.decode[0].feeds_sample_in_flight());
  const StepPlan ahead = scheduler.schedule(Phase::decode);  // launched before `first` is read back
  ASSERT_EQ(ahead.decode.size(), 1u);
  EXPECT_EQ(ahead.decode[0].position, 6);
  EXPECT_TRUE(ahead.decode[0].feeds_sample_in_flight());
  Sequence& s = *scheduler.find(1);
  EXPECT_EQ(s.in_flight, 2);
  scheduler.add(2, spec_of(5, 10));
  StepPlan other = scheduler.schedule(Phase::prefill);
  scheduler.complete(other);
  scheduler.report(*other.prefill[0].sequence, 3);
  // A step that leaves sequence 1 out (pretend it had no page) overwrites its row's sample: it
  // feeds again only once the host has read its samples back.
  s.preempting = true;
  ASSERT_EQ(scheduler.schedule(Phase::decode).decode.size(), 1u);
  s.preempting = false;
  EXPECT_FALSE(s.sample_in_row);
  EXPECT_TRUE(scheduler.schedule(Phase::decode).decode.size() == 1u) << "only sequence 2";
  scheduler.report(s, 4);
  scheduler.report(s, 5);
  EXPECT_EQ(s.computed, 7);
  EXPECT_EQ(s.tokens.size(), 8u);
  const StepPlan again = scheduler.schedule(Phase::decode);
  ASSERT_EQ(again.decode.size(), 2u) << "both sequences";
  EXPECT_EQ(again.decode[0].sequence, &s);
  EXPECT_FALSE(again.decode[0].feeds_sample_in_flight()) << "the host feeds what it read back";
  EXPECT_TRUE(again.decode[1].feeds_sample_in_flight());
}

TEST(StepScheduler, DraftsAreSamplesInFlightWithinLimitsAndRejectedOnesRollBack) {
  KvBlockPool pool(16, true);
  StepScheduler scheduler({2, 64, 0}, pool);
  Sequence& s = add_and_prefill(scheduler, 1, spec_of(14, 10));  // ends with max_tokens at 24 tokens
  StepPlan verify = scheduler.schedule(Phase::decode);
  ASSERT_EQ(verify.decode.size(), 1u);
  EXPECT_EQ(scheduler.add_drafts(verify.decode[0], 5), 5);
  EXPECT_EQ(verify.decode[0].drafts, 5);
  EXPECT_EQ(s.computed, 20);
  EXPECT_EQ(s.in_flight, 6);
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_TRUE(scheduler.complete(verify).empty()) << "no block of drafts' ids is cached";
  scheduler.reject_drafts(s, 3);  // 2 accepted: 3 tokens come
  EXPECT_EQ(s.computed, 17);
  EXPECT_EQ(s.in_flight, 3);
  std::vector<RegisteredBlock> registered;
  for (const int32_t id : {4, 5, 6}) {
    const Report report = scheduler.report(s, id);
    EXPECT_EQ(report.finish, FinishReason::none);
    registered.insert(registered.end(), report.registered.begin(), report.registered.end());
  }
  ASSERT_EQ(registered.size(), 1u) << "block 0, once its ids are known";
  EXPECT_EQ(registered[0].block, 0);
  EXPECT_EQ(s.tokens.size(), 18u);
  EXPECT_EQ(s.pages.size(), 2u) << "pages of rejected positions stay for the next ones";
  // Six tokens are left to the limit: the row and 5 drafts, not the 8 asked for.
  StepPlan last = scheduler.schedule(Phase::decode);
  ASSERT_EQ(last.decode.size(), 1u);
  EXPECT_EQ(last.decode[0].position, 17);
  EXPECT_EQ(scheduler.add_drafts(last.decode[0], 8), 5);
  scheduler.reject_drafts(s, 0);  // all accepted
  std::vector<FinishReason> finishes;
  for (int i = 0; i < 6; ++i) finishes.push_back(scheduler.report(s, 7 + i).finish);  // the 6th ends it
  std::vector<FinishReason> want(5, FinishReason::none);
  want.push_back(FinishReason::max_tokens);
  EXPECT_EQ(finishes, want);
  EXPECT_EQ(scheduler.find(1), nullptr);
}

TEST(StepScheduler, DraftsTakeOnlyFreePagesAndNeverAnInFlightRow) {
  KvBlockPool pool(2, false);
  StepScheduler scheduler({2, 64, 0}, pool);
  add_and_prefill(scheduler, 1, spec_of(28, 20));
  StepPlan verify = scheduler.schedule(Phase::decode);
  ASSERT_EQ(verify.decode.size(), 1u);
  EXPECT_EQ(scheduler.add_drafts(verify.decode[0], 8), 3) << "positions 29-31: the two pages' room";
  EXPECT_EQ(scheduler.preemptions(), 0u);
  EXPECT_TRUE(scheduler.schedule(Phase::decode).decode.empty()) << "not again until the verify is resolved";
  EXPECT_THROW(scheduler.report(*scheduler.find(1), 4), Error) << "rejected drafts come first";
  Sequence& s = *scheduler.find(1);
  scheduler.reject_drafts(s, 3);
  scheduler.report(s, 4);
  StepPlan next = scheduler.schedule(Phase::decode);  // the engine's pattern: launched ahead
  ASSERT_EQ(next.decode.size(), 1u);
  StepPlan ahead_again = scheduler.schedule(Phase::decode);
  ASSERT_EQ(ahead_again.decode.size(), 1u);
  EXPECT_TRUE(ahead_again.decode[0].feeds_sample_in_flight());
  EXPECT_THROW(scheduler.add_drafts(ahead_again.decode[0], 2), Error);
}

TEST(StepScheduler, MixedStepsCarryChunksAndDecodeRowsUnderTheirCap) {
  KvBlockPool pool(64, false);
  StepScheduler scheduler({4, 512, 100, /*mixed_step_prompt_tokens=*/40}, pool);
  scheduler.add(1, spec_of(10, 100));
  StepPlan first = scheduler.schedule(Phase::both);
  EXPECT_TRUE(first.mixed) << "prompt chunks alone run as a mixed step too";
  ASSERT_EQ(first.prefill.size(), 1u);
  EXPECT_TRUE(first.prefill[0].samples);
  EXPECT_TRUE(first.decode.empty());
  scheduler.complete(first);
  Sequence& s = *scheduler.find(1);
  EXPECT_TRUE(s.sample_in_row) << "the mixed step samples its first token into its row";
  scheduler.add(2, spec_of(100, 100));
  // Launched before the first is read back: sequence 1 feeds its first token from its row while
  // sequence 2's prompt rides along, capped at what one pass holds (40 < the budget of 100).
  const StepPlan mixed = scheduler.schedule(Phase::both);
  EXPECT_TRUE(mixed.mixed);
  ASSERT_EQ(mixed.prefill.size(), 1u);
  EXPECT_EQ(mixed.prefill[0].count, 40);
  ASSERT_EQ(mixed.decode.size(), 1u);
  EXPECT_TRUE(mixed.decode[0].feeds_sample_in_flight());
  EXPECT_EQ(scheduler.stats().mixed_steps, 1u) << "the first had no decode row";
  scheduler.complete(mixed);
  scheduler.report(s, 3);
  scheduler.report(s, 4);
  // A mixed step that leaves a row out (pretend sequence 1 had no page) overwrites its sample.
  s.preempting = true;
  const StepPlan without = scheduler.schedule(Phase::both);
  s.preempting = false;
  EXPECT_TRUE(without.mixed);
  EXPECT_TRUE(without.decode.empty());
  EXPECT_FALSE(s.sample_in_row);
  scheduler.complete(without);
  // Decode rows only: a plain step, whichever phases were asked for.
  scheduler.cancel(2);
  const StepPlan plain = scheduler.schedule(Phase::both);
  EXPECT_FALSE(plain.mixed);
  ASSERT_EQ(plain.decode.size(), 1u);
  EXPECT_FALSE(plain.decode[0].feeds_sample_in_flight()) << "the host feeds what it read back";
}

TEST(StepScheduler, BenchmarkContextsDecodeFromTheirLength) {
  KvBlockPool pool(16, true);
  StepScheduler scheduler({2, 512, 0}, pool);
  Sequence& s = scheduler.add_prefilled(9, 40, 2);
  EXPECT_EQ(s.row, 0);
  EXPECT_EQ(pool.used_pages(), 3);
  const StepPlan plan = scheduler.schedule(Phase::both);
  ASSERT_EQ(plan.decode.size(), 1u);
  EXPECT_EQ(plan.decode[0].position, 40);
  scheduler.complete(plan);
  EXPECT_EQ(scheduler.report(s, 1).finish, FinishReason::none);
  EXPECT_EQ(pool.cached_pages(), 0) << "benchmark ids are never shared";
}

// ---- simulated backends on a fake model

// Key/value slots as the device would hold them: the token each position was computed from.
// The fake model's next token hashes every slot the sequence reads through its block table.
class FakeModel {
 public:
  FakeModel(int pages, int max_batch) : slots_(pages), row_samples_(max_batch, -1) {
    for (auto& page : slots_) page.fill(-1);
  }
  int32_t run(const Sequence& s, int position, int32_t token, bool samples) {
    EXPECT_GE(token, 0) << "sequence " << s.key << " fed a lost sample at position " << position;
    slots_[s.pages.at(position / kBlock)][position % kBlock] = token;
    if (!samples) return -1;
    uint64_t h = 1469598103934665603ull;
    for (int q = 0; q <= position; ++q) {
      h ^= static_cast<uint64_t>(slots_[s.pages[q / kBlock]][q % kBlock] + 2);
      h *= 1099511628211ull;
    }
    return static_cast<int32_t>(h % kVocab);
  }
  // The engine's per-row sample: where the next step reads its id.
  std::vector<int32_t>& row_samples() { return row_samples_; }
  static constexpr int kVocab = 40;

 private:
  std::vector<std::array<int32_t, kBlock>> slots_;
  std::vector<int32_t> row_samples_;
};

using Outputs = std::map<SequenceKey, std::vector<int32_t>>;

struct Workload {
  std::vector<SequenceSpec> specs;
  int pages = 64;
  bool prefix_caching = true;
  int max_batch = 4, max_context = 200, budget = 0;  // the scheduler's options
  int mixed_tokens = 0;                              // SchedulerOptions::mixed_step_prompt_tokens
};

// A backend on the fake model: the scheduler, its pool, and what each sequence produced.
class SimulatedBackend {
 public:
  explicit SimulatedBackend(const Workload& w)
      : w_(w), pool_(w.pages, w.prefix_caching), scheduler_({w.max_batch, w.max_context, w.budget, w.mixed_tokens}, pool_),
        model_(w.pages, w.max_batch) {
    scheduler_.on_row_move([&](int from, int to) { model_.row_samples()[to] = model_.row_samples()[from]; });
    for (size_t i = 0; i < w.specs.size(); ++i) scheduler_.add(i + 1, w.specs[i]);
  }

  // Steps until every sequence ended; then checks that each did and that no page leaked.
  template <typename Step>
  Outputs run(Step&& step, uint64_t* preemptions) {
    for (int i = 0; scheduler_.has_work(); ++i) {
      if (i == 5000) {
        ADD_FAILURE() << "still running after 5000 steps";
        break;
      }
      step();
    }
    EXPECT_EQ(pool_.used_pages(), 0) << "pages leaked";
    EXPECT_EQ(ends_.size(), w_.specs.size());
    if (preemptions) *preemptions = scheduler_.preemptions();
    return out_;
  }

  // Runs the plan's prefill chunks; returns the samples of those that end a prompt. `keep`: the
  // sample also goes where the row's next step reads it (the engine's decode slot).
  std::vector<std::pair<Sequence*, int32_t>> prefill(const StepPlan& plan, bool keep) {
    std::vector<std::pair<Sequence*, int32_t>> samples;
    for (const PrefillChunk& c : plan.prefill)
      for (int p = c.first; p < c.first + c.count; ++p) {
        const bool samples_here = c.samples && p + 1 == c.first + c.count;
        const int32_t id = model_.run(*c.sequence, p, c.sequence->tokens[p], samples_here);
        if (!samples_here) continue;
        samples.emplace_back(c.sequence, id);
        if (keep) model_.row_samples()[c.sequence->row] = id;
      }
    return samples;
  }

  void report(Sequence& s, int32_t id) {
    const SequenceKey key = s.key;
    const Report report = scheduler_.report(s, id);  // may end s
    out_[key].push_back(id);
    if (report.finish != FinishReason::none) ends_[key] = report.finish;
  }

  StepScheduler& scheduler() { return scheduler_; }
  FakeModel& model() { return model_; }

 private:
  Workload w_;
  KvBlockPool pool_;
  StepScheduler scheduler_;
  FakeModel model_;
  Outputs out_;
  std::map<SequenceKey, FinishReason> ends_;
};

// The CPU backend's pattern: one plan per step, prefill chunks and decode rows run and reported.
Outputs run_like_cpu_backend(const Workload& w, uint64_t* preemptions = nullptr) {
  SimulatedBackend backend(w);
  StepScheduler& scheduler = backend.scheduler();
  return backend.run([&] {
    const StepPlan plan = scheduler.schedule(Phase::both);
    std::vector<std::pair<Sequence*, int32_t>> samples = backend.prefill(plan, false);
    for (const DecodeRow& d : plan.decode) {
      EXPECT_FALSE(d.feeds_sample_in_flight());
      samples.emplace_back(d.sequence, backend.model().run(*d.sequence, d.position, d.sequence->tokens[d.position], true));
    }
    scheduler.complete(plan);
    for (auto [s, id] : samples) backend.report(*s, id);
  }, preemptions);
}

// The CUDA engine's pattern (src/runtime/step.cpp): prefill, read its first tokens back, then
// decode steps launched ahead (overlap: one stays in flight), the oldest read back per step.
// `mixed` (mixed steps): no prefill phase; every launch plans both phases, and a mixed plan runs
// its chunks and decode rows in one pass whose sampler writes every row (a chunk that ends its
// prompt into its own row), read back like a decode step.
Outputs run_like_engine(const Workload& w, bool overlap, bool mixed, uint64_t* preemptions = nullptr) {
  SimulatedBackend backend(w);
  StepScheduler& scheduler = backend.scheduler();
  FakeModel& model = backend.model();
  struct Sampled {
    SequenceKey key;
    int row;  // at launch: rows move when sequences leave, so the read-back may find it elsewhere
    int32_t sample;
  };
  std::deque<std::vector<Sampled>> launched;
  auto launch = [&] {
    const StepPlan plan = scheduler.schedule(mixed ? Phase::both : Phase::decode);
    if (plan.empty()) return;
    EXPECT_EQ(plan.mixed, !plan.prefill.empty());
    std::vector<int32_t> next(w.max_batch, -1);  // padded rows sample garbage: -1 here
    std::vector<Sampled> lane;
    for (auto [s, id] : backend.prefill(plan, false)) {
      next[s->row] = id;
      lane.push_back({s->key, s->row, id});
    }
    for (const DecodeRow& d : plan.decode) {
      const Sequence& s = *d.sequence;
      const int32_t token = d.feeds_sample_in_flight() ? model.row_samples()[s.row] : s.tokens[d.position];
      next[s.row] = model.run(s, d.position, token, true);
      lane.push_back({s.key, s.row, next[s.row]});
    }
    model.row_samples() = next;
    scheduler.complete(plan);
    launched.push_back(std::move(lane));
  };
  auto read_back_oldest = [&] {
    for (const Sampled& sampled : launched.front())  // as the engine matches them; ended since: dropped
      if (Sequence* s = scheduler.find_running(sampled.key, sampled.row)) backend.report(*s, sampled.sample);
    launched.pop_front();
  };
  return backend.run([&] {
    if (!mixed) {
      const StepPlan plan = scheduler.schedule(Phase::prefill);
      const std::vector<std::pair<Sequence*, int32_t>> firsts = backend.prefill(plan, true);
      scheduler.complete(plan);
      for (auto [s, id] : firsts) backend.report(*s, id);
    }
    if (launched.empty()) launch();
    if (overlap) launch();
    if (!launched.empty()) read_back_oldest();
  }, preemptions);  // steps still in flight at the end feed sequences that ended: dropped
}

// Each sequence alone, on a cache with room to spare: the outputs every schedule must give.
Outputs solo(const Workload& w) {
  Outputs out;
  for (size_t i = 0; i < w.specs.size(); ++i) {
    Workload one = w;
    one.specs = {w.specs[i]};
    one.pages = 64;
    one.prefix_caching = false;
    out[i + 1] = run_like_cpu_backend(one)[1];
  }
  return out;
}

// Prompts that share prefixes (the prefix cache matches them), stop ids, and more sequences
// than rows; a tight cache makes the scheduler preempt.
Workload random_workload(std::mt19937_64& rng, int sequences, int pages) {
  Workload w;
  w.pages = pages;
  w.budget = 24;
  std::vector<int32_t> shared(40);
  for (int32_t& id : shared) id = static_cast<int32_t>(rng() % FakeModel::kVocab);
  for (int i = 0; i < sequences; ++i) {
    SequenceSpec spec;
    spec.prompt.assign(shared.begin(), shared.begin() + static_cast<int>(rng() % 41));
    const int own = 1 + static_cast<int>(rng() % 30);
    for (int t = 0; t < own; ++t) spec.prompt.push_back(static_cast<int32_t>(rng() % FakeModel::kVocab));
    spec.max_new_tokens = 1 + static_cast<int>(rng() % 60);
    if (i % 3 == 0) spec.stop_ids = {static_cast<int32_t>(rng() % FakeModel::kVocab)};
    w.specs.push_back(std::move(spec));
  }
  return w;
}

TEST(StepScheduler, CpuBackendPatternGivesEverySequenceItsSoloOutput) {
  auto rng = testing::make_rng(501);
  uint64_t preemptions = 0;
  for (int round = 0; round < 20; ++round) {
    const Workload w = random_workload(rng, 10, 12);
    uint64_t p = 0;
    EXPECT_EQ(run_like_cpu_backend(w, &p), solo(w)) << "round " << round;
    preemptions += p;
  }
  EXPECT_GT(preemptions, 0u) << "the cache was meant to be tight enough to preempt";
}

// Separate prefill passes, and mixed steps whose pass holds 16 prompt tokens (below the budget
// of 24) or 40 (the budget rules).
TEST(StepScheduler, EnginePatternGivesEverySequenceItsSoloOutput) {
  auto rng = testing::make_rng(502);
  for (const bool mixed : {false, true}) {
    for (const bool overlap : {true, false}) {
      const std::string what = std::string(mixed ? "mixed" : "separate") + (overlap ? ", overlapped" : "");
      uint64_t preemptions = 0;
      for (int round = 0; round < 20; ++round) {
        Workload w = random_workload(rng, 10, 12);
        w.prefix_caching = round % 2 == 0;
        if (mixed) w.mixed_tokens = round % 3 == 0 ? 16 : 40;
        uint64_t p = 0;
        EXPECT_EQ(run_like_engine(w, overlap, mixed, &p), solo(w)) << what << ", round " << round;
        preemptions += p;
      }
      EXPECT_GT(preemptions, 0u) << what << ": the cache was meant to be tight enough to preempt";
    }
  }
}

}  // namespace
}  // namespace deepfuse::batching
