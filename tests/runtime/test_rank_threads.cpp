// The tensor-parallel engine's threads (runtime/rank_group.hpp): every rank runs each task on its
// own thread, all at once, and the call waits for all; a rank's exception comes back by rank. And
// the all-reduce each bucket keeps from the times measured at engine start.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/rank_group.hpp"

namespace deepfuse::runtime {
namespace {

TEST(RankThreads, EveryRankRunsEachTaskOnItsOwnThread) {
  RankThreads threads(4);
  for (int round = 0; round < 100; ++round) {
    std::atomic<int> ran{0};
    std::mutex mutex;
    std::set<std::thread::id> ids;
    const auto errors = threads.run([&](int rank) {
      EXPECT_GE(rank, 0);
      EXPECT_LT(rank, 4);
      ran += 1 << (8 * rank);  // each rank once
      std::lock_guard lock(mutex);
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(ran.load(), 0x01010101);
    EXPECT_EQ(ids.size(), 4u);
    EXPECT_FALSE(ids.count(std::this_thread::get_id()));
    for (const auto& e : errors) EXPECT_FALSE(e);
  }
}

// The ranks wait for each other inside a task (as their collectives do): all run at once.
TEST(RankThreads, TasksRunConcurrently) {
  RankThreads threads(3);
  std::atomic<int> arrived{0}, saw_all{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);  // bounded: fails, never hangs
  threads.run([&](int) {
    ++arrived;
    while (arrived.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    if (arrived.load() == 3) ++saw_all;
  });
  EXPECT_EQ(saw_all.load(), 3);
}

TEST(RankThreads, ExceptionsComeBackByRank) {
  RankThreads threads(3);
  const auto errors = threads.run([&](int rank) {
    if (rank == 1) throw std::runtime_error("rank one failed");
  });
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_FALSE(errors[0]);
  EXPECT_FALSE(errors[2]);
  ASSERT_TRUE(errors[1]);
  EXPECT_THROW(std::rethrow_exception(errors[1]), std::runtime_error);
  // The threads still serve the next task.
  std::atomic<int> ran{0};
  for (const auto& e : threads.run([&](int) { ++ran; })) EXPECT_FALSE(e);
  EXPECT_EQ(ran.load(), 3);
}

// The all-reduce a bucket keeps: the fastest of NCCL and the two one-shot protocols as timed at
// engine start (the slowest rank's times), NCCL on ties.
TEST(AllReduceTiming, TheFastestTimedChoiceWins) {
  auto timing = [](double nccl, double flag, double lines) {
    AllReduceTiming t;
    t.nccl_us = nccl, t.flag_us = flag, t.lines_us = lines;
    return t;
  };
  EXPECT_EQ(timing(9.37, 6.17, 4.61).fastest(), AllReduceChoice::one_shot_lines);  // 4 x H100, 8 KiB
  EXPECT_EQ(timing(10.23, 4.50, 4.62).fastest(), AllReduceChoice::one_shot_flag);  // 4 x H200, 16 KiB
  EXPECT_EQ(timing(13.78, 11.30, 24.35).fastest(), AllReduceChoice::one_shot_flag);
  EXPECT_EQ(timing(5.0, 6.0, 7.0).fastest(), AllReduceChoice::nccl);
  EXPECT_EQ(timing(5.0, 5.0, 5.0).fastest(), AllReduceChoice::nccl);
  EXPECT_EQ(timing(5.0, 4.0, 4.0).fastest(), AllReduceChoice::one_shot_flag);
  EXPECT_EQ(timing(5.0, 0.0, 0.0).fastest(), AllReduceChoice::nccl);  // not timed (no peer access)
  EXPECT_DOUBLE_EQ(timing(1, 2, 3).us(AllReduceChoice::one_shot_lines), 3.0);
  EXPECT_DOUBLE_EQ(timing(1, 2, 3).us(AllReduceChoice::epilogue), 3.0);  // its attention block's kernel
  EXPECT_DOUBLE_EQ(timing(1, 2, 3).us(AllReduceChoice::in_mlp), 3.0);  // its unfused MLP blocks' kernel
  EXPECT_DOUBLE_EQ(timing(1, 2, 3).us(AllReduceChoice::one_shot), 0.0);  // its size rule is not timed
}

}  // namespace
}  // namespace deepfuse::runtime
