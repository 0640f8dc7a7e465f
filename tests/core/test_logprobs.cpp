// token_logprobs (deepfuse/logprobs.hpp), which both serving backends report: log_softmax at the
// chosen id, the most likely ids in order (lowest id first on ties), on fresh random logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/logprobs.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(TokenLogprobs, AreTheLogSoftmaxAtTheChosenId) {
  auto rng = testing::make_rng(31);
  const std::vector<float> logits = testing::random_uniform(rng, 5000, 20.0f);
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x));
  for (const int32_t chosen : {0, 17, 4999}) {
    const TokenLogprobs lp = token_logprobs(logits, chosen, 0);
    EXPECT_NEAR(lp.logprob, logits[chosen] - std::log(sum), 1e-4) << "id " << chosen;
    EXPECT_TRUE(lp.top.empty());
  }
  // Shifting every logit changes nothing (the largest is subtracted before exp).
  std::vector<float> shifted = logits;
  for (float& x : shifted) x += 1000.0f;
  EXPECT_NEAR(token_logprobs(shifted, 17, 0).logprob, token_logprobs(logits, 17, 0).logprob, 1e-3);
}

// Under a token bitmask most logits are -inf: the top list holds only the allowed ids.
TEST(TokenLogprobs, LeftOutIdsAreNeverAmongTheTop) {
  auto rng = testing::make_rng(33);
  std::vector<float> logits = testing::random_uniform(rng, 1000, 10.0f);
  std::vector<int32_t> allowed = {3, 500, 999};
  for (int id = 0; id < 1000; ++id)
    if (std::find(allowed.begin(), allowed.end(), id) == allowed.end()) logits[id] = -INFINITY;
  const TokenLogprobs lp = token_logprobs(logits, 500, 10);
  ASSERT_EQ(lp.top.size(), 3u);
  double mass = 0;
  for (const TokenLogprob& t : lp.top) {
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), t.id), allowed.end()) << t.id;
    EXPECT_TRUE(std::isfinite(t.logprob));
    mass += std::exp(static_cast<double>(t.logprob));
  }
  EXPECT_NEAR(mass, 1.0, 1e-5);
}

TEST(TokenLogprobs, TopIdsAreTheMostLikelyInOrder) {
  auto rng = testing::make_rng(32);
  std::vector<float> logits = testing::random_uniform(rng, 3000, 10.0f);
  logits[2500] = logits[700] = logits[40] = 50.0f;  // a three-way tie at the top: lowest id first
  const TokenLogprobs lp = token_logprobs(logits, 2500, 5);
  ASSERT_EQ(lp.top.size(), 5u);
  EXPECT_EQ(lp.top[0].id, 40);
  EXPECT_EQ(lp.top[1].id, 700);
  EXPECT_EQ(lp.top[2].id, 2500);
  EXPECT_EQ(lp.top[2].logprob, lp.logprob);
  std::vector<float> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  for (size_t i = 0; i < lp.top.size(); ++i) {
    EXPECT_EQ(logits[lp.top[i].id], sorted[i]) << "rank " << i;
    EXPECT_EQ(lp.top[i].logprob, token_logprobs(logits, lp.top[i].id, 0).logprob) << "rank " << i;
    if (i > 0) EXPECT_LE(lp.top[i].logprob, lp.top[i - 1].logprob) << "rank " << i;
  }
  // More than the vocabulary: all of it.
  EXPECT_EQ(token_logprobs(std::vector<float>{1.0f, 2.0f}, 0, 20).top.size(), 2u);
}

TEST(TokenLogprobs, BadInputIsAnError) {
  EXPECT_THROW(token_logprobs(std::vector<float>{}, 0, 1), Error);
  EXPECT_THROW(token_logprobs(std::vector<float>{1.0f, 2.0f}, 2, 1), Error);
  EXPECT_THROW(token_logprobs(std::vector<float>{1.0f, 2.0f}, -1, 1), Error);
}

}  // namespace
}  // namespace deepfuse
