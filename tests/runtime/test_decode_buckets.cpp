// Decode batch buckets: powers of two below max_batch, then max_batch; a step of n sequences
// takes the smallest bucket holding n. Host-only (no graph is captured here).
#include <gtest/gtest.h>

#include <vector>

#include "deepfuse/error.hpp"
#include "runtime/graph_cache.hpp"

namespace deepfuse::runtime {
namespace {

TEST(DecodeBuckets, PowersOfTwoThenMaxBatch) {
  EXPECT_EQ(decode_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(decode_buckets(2), (std::vector<int>{1, 2}));
  EXPECT_EQ(decode_buckets(6), (std::vector<int>{1, 2, 4, 6}));
  EXPECT_EQ(decode_buckets(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(decode_buckets(33), (std::vector<int>{1, 2, 4, 8, 16, 32, 33}));
  EXPECT_THROW(decode_buckets(0), Error);
}

TEST(DecodeBuckets, SmallestBucketHoldingTheBatch) {
  const DecodeGraphCache cache(6, false);
  const std::vector<int> expected_bucket = {1, 2, 4, 4, 6, 6};  // for 1..6 sequences
  for (int n = 1; n <= 6; ++n) EXPECT_EQ(cache.buckets()[cache.bucket_index(n)], expected_bucket[n - 1]) << n;
  EXPECT_THROW(cache.bucket_index(7), Error);
  EXPECT_EQ(cache.graphs_captured(), 0);
}

// Without graphs every step runs its ops eagerly, under whichever attention plan the engine picked
// (0: the bucket's, 1: the short-context plan); a plan the cache was not made for is refused.
TEST(DecodeBuckets, StepsRunUnderEitherPlan) {
  DecodeGraphCache cache(4, false, 2);
  std::vector<int> ran;
  for (int plan : {0, 1, 1, 0}) cache.run(0, plan, nullptr, [&](cudaStream_t) { ran.push_back(plan); });
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_FALSE(cache.captured(0));
  EXPECT_EQ(cache.kernel_nodes(0), 0);
  EXPECT_THROW(cache.run(0, 2, nullptr, [](cudaStream_t) {}), Error);
  EXPECT_THROW(cache.run(3, 0, nullptr, [](cudaStream_t) {}), Error);
  EXPECT_THROW(DecodeGraphCache(4, false, 0), Error);
}

}  // namespace
}  // namespace deepfuse::runtime
