// The serving scheduler: decode before prefill, the per-step token budget, FIFO admission up to
// max_batch, preemption of the youngest on KV exhaustion, prefix-cache hits at admission, and
// every page back when sequences end or are cancelled.
#include <gtest/gtest.h>

#include <numeric>

#include "server/batching/batch_scheduler.hpp"

namespace deepfuse::server {
namespace {

GenerationSpec spec_of(int prompt_tokens, int max_new, int first_id = 1) {
  GenerationSpec spec;
  spec.prompt.resize(prompt_tokens);
  std::iota(spec.prompt.begin(), spec.prompt.end(), first_id);
  spec.max_new_tokens = max_new;
  return spec;
}

// Runs the planned work as a backend would: every sampling work appends token 7.
std::vector<StepWork> run_step(BatchScheduler& scheduler, std::vector<SequenceEnd>* ends = nullptr) {
  std::vector<StepWork> works = scheduler.plan();
  std::vector<StepWork> seen = works;
  for (const StepWork& w : works) {
    scheduler.commit(w);
    if (!w.samples) continue;
    const SequenceEnd end = scheduler.append(*w.sequence, 7);
    if (ends) ends->push_back(end);
  }
  return seen;
}

TEST(BatchScheduler, ChunksAPromptUnderTheStepBudgetWhileOthersDecode) {
  KvBlockPool pool(64, false);
  BatchScheduler scheduler({4, 32, 512}, pool);
  scheduler.add(1, spec_of(10, 100));
  run_step(scheduler);  // prefills 1 entirely, samples its first token
  scheduler.add(2, spec_of(100, 100));
  const std::vector<StepWork> works = scheduler.plan();
  ASSERT_EQ(works.size(), 2u);
  EXPECT_EQ(works[0].sequence->key, 1u);  // the decode row first
  EXPECT_EQ(works[0].count, 1);
  EXPECT_EQ(works[1].sequence->key, 2u);
  EXPECT_EQ(works[1].count, 31);          // what the budget leaves
  EXPECT_FALSE(works[1].samples);
}

TEST(BatchScheduler, AdmitsFirstInFirstOutUpToMaxBatch) {
  KvBlockPool pool(64, false);
  BatchScheduler scheduler({2, 512, 512}, pool);
  for (SequenceKey k = 1; k <= 3; ++k) scheduler.add(k, spec_of(4, 3));
  const std::vector<StepWork> works = run_step(scheduler);
  ASSERT_EQ(works.size(), 2u);
  EXPECT_EQ(works[0].sequence->key, 1u);
  EXPECT_EQ(scheduler.running(), 2);
  EXPECT_EQ(scheduler.waiting(), 1);
  for (int i = 0; i < 10 && scheduler.has_work(); ++i) run_step(scheduler);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(pool.used_pages(), 0);
}

TEST(BatchScheduler, PreemptsTheYoungestWhenPagesRunOutAndFinishesEveryone) {
  KvBlockPool pool(4, false);  // 64 positions
  BatchScheduler scheduler({4, 512, 512}, pool);
  scheduler.add(1, spec_of(20, 30));  // needs 50 positions: 4 pages
  scheduler.add(2, spec_of(20, 30));
  std::vector<SequenceEnd> ends;
  for (int i = 0; i < 200 && scheduler.has_work(); ++i) run_step(scheduler, &ends);
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_GE(scheduler.preemptions(), 1u);
  EXPECT_EQ(std::count(ends.begin(), ends.end(), SequenceEnd::max_tokens), 2);
  EXPECT_EQ(pool.used_pages(), 0);
}

TEST(BatchScheduler, TakesTheCachedPrefixAtAdmissionButComputesTheLastPosition) {
  KvBlockPool pool(64, true);
  BatchScheduler scheduler({4, 512, 512}, pool);
  scheduler.add(1, spec_of(40, 1));
  run_step(scheduler);  // 2 full blocks registered, then the sequence ends
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.cached_pages(), 2);
  scheduler.add(2, spec_of(40, 1));
  std::vector<StepWork> works = scheduler.plan();
  ASSERT_EQ(works.size(), 1u);
  EXPECT_EQ(works[0].first, 32);
  EXPECT_EQ(works[0].count, 8);
  EXPECT_EQ(works[0].sequence->cached_tokens, 32);
  // A prompt of exactly two blocks keeps its last block to compute.
  scheduler.cancel(2);
  scheduler.add(3, spec_of(32, 1));
  works = scheduler.plan();
  ASSERT_EQ(works.size(), 1u);
  EXPECT_EQ(works[0].first, 16);
  EXPECT_EQ(scheduler.prefix_hit_tokens(), 48u);
}

TEST(BatchScheduler, CancelReleasesPagesOfRunningAndWaitingSequences) {
  KvBlockPool pool(16, false);
  BatchScheduler scheduler({1, 512, 512}, pool);
  scheduler.add(1, spec_of(50, 10));
  scheduler.add(2, spec_of(50, 10));
  run_step(scheduler);
  EXPECT_GT(pool.used_pages(), 0);
  EXPECT_TRUE(scheduler.cancel(2));
  EXPECT_TRUE(scheduler.cancel(1));
  EXPECT_FALSE(scheduler.cancel(1));
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_FALSE(scheduler.has_work());
}

TEST(BatchScheduler, EndsOnStopIdsAndAtTheContextLength) {
  KvBlockPool pool(16, false);
  BatchScheduler scheduler({2, 512, 12}, pool);
  GenerationSpec stops = spec_of(4, 100);
  stops.stop_ids = {7};
  scheduler.add(1, stops);
  scheduler.add(2, spec_of(10, 100));
  std::vector<SequenceEnd> ends;
  for (int i = 0; i < 10 && scheduler.has_work(); ++i) run_step(scheduler, &ends);
  EXPECT_EQ(std::count(ends.begin(), ends.end(), SequenceEnd::stop_token), 1);
  EXPECT_EQ(std::count(ends.begin(), ends.end(), SequenceEnd::context_length), 1);
}

}  // namespace
}  // namespace deepfuse::server
