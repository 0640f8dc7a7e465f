// The reference sampler: Hugging Face's logits processors (repetition penalty, temperature, top-k,
// top-p, min-p), OpenAI's presence and frequency penalties, and the counter-based uniform draw the
// GPU sampler must reproduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

void expect_probs_near(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(actual[i], expected[i], 1e-6) << "id " << i;
}

TEST(ReferenceSampling, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  auto rng = testing::make_rng(41);
  const std::vector<float> original = testing::random_uniform(rng, 10, 5.0f);
  std::vector<float> logits = original;
  // id 3 twice, id 7 once, id 0 three times.
  const std::vector<int32_t> generated = {3, 0, 7, 3, 0, 0};
  reference::apply_presence_frequency_penalties(logits, 0.5f, 0.25f, generated);
  for (int id = 0; id < 10; ++id) {
    const int count = static_cast<int>(std::count(generated.begin(), generated.end(), id));
    const float expected = count == 0 ? original[id] : original[id] - (0.5f + 0.25f * static_cast<float>(count));
    EXPECT_EQ(logits[id], expected) << "id " << id << ", generated " << count << " times";
  }
  // Negative penalties reward repeats; zero penalties change nothing.
  logits = original;
  reference::apply_presence_frequency_penalties(logits, -1.0f, 0.0f, generated);
  EXPECT_EQ(logits[7], original[7] + 1.0f);
  logits = original;
  reference::apply_presence_frequency_penalties(logits, 0.0f, 0.0f, generated);
  EXPECT_EQ(logits, original);
  EXPECT_THROW(reference::apply_presence_frequency_penalties(logits, 1.0f, 0.0f, std::vector<int32_t>{10}), Error);
}

TEST(ReferenceSampling, TokenBitmaskLeavesOutTheIdsItClears) {
  auto rng = testing::make_rng(42);
  const int vocab = 70;  // three words, the last one partly used
  const std::vector<float> original = testing::random_uniform(rng, vocab, 5.0f);
  std::vector<uint32_t> mask(token_bitmask_words(vocab), 0u);
  std::vector<bool> allowed(vocab, false);
  for (int id = 0; id < vocab; ++id)
    if (rng() % 3 == 0) mask[id / 32] |= 1u << (id % 32), allowed[id] = true;
  std::vector<float> logits = original;
  reference::apply_token_bitmask(logits, mask);
  for (int id = 0; id < vocab; ++id) {
    EXPECT_EQ(token_allowed(mask.data(), id), allowed[id]) << "id " << id;
    if (allowed[id]) EXPECT_EQ(logits[id], original[id]) << "id " << id;
    else EXPECT_EQ(logits[id], -std::numeric_limits<float>::infinity()) << "id " << id;
  }
  // No processor brings a left-out id back: every draw under every filter is an allowed id.
  SamplingParams params;
  params.temperature = 1.5f, params.top_k = 50, params.top_p = 0.99f;
  for (uint64_t step = 0; step < 200; ++step) EXPECT_TRUE(allowed[reference::sample(logits, params, {}, step)]);
  EXPECT_TRUE(allowed[reference::sample(logits, SamplingParams{}, {}, 0)]);
  EXPECT_THROW(reference::apply_token_bitmask(logits, std::span(mask).first(2)), Error);
}

TEST(ReferenceSampling, GreedyPicksArgmaxAndLowestIdOnTies) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  SamplingParams greedy;
  EXPECT_EQ(reference::sample(logits, greedy, {}, 0), 1);
  expect_probs_near(reference::sampling_distribution(logits, greedy, {}), {0, 1, 0, 0});
}

TEST(ReferenceSampling, TemperatureScalesLogits) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  SamplingParams params;
  params.temperature = 2.0f;
  const double z = 1 + std::exp(0.5) + std::exp(1.0);
  expect_probs_near(reference::sampling_distribution(logits, params, {}), {1 / z, std::exp(0.5) / z, std::exp(1.0) / z});
}

TEST(ReferenceSampling, RepetitionPenaltyFollowsTheHuggingFaceRule) {
  // 2 -> 2/2 = 1, -2 -> -2*2 = -4 (ids 0 and 1 seen; 0 twice but penalised once), 1 unchanged.
  const std::vector<float> logits = {2.0f, -2.0f, 1.0f};
  const std::vector<int32_t> previous = {0, 1, 0};
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  EXPECT_EQ(reference::sample(logits, params, previous, 0), 0);  // tie 1 vs 1: lowest id
  params.temperature = 1.0f;
  const double z = 2 * std::exp(1.0) + std::exp(-4.0);
  expect_probs_near(reference::sampling_distribution(logits, params, previous),
                    {std::exp(1.0) / z, std::exp(-4.0) / z, std::exp(1.0) / z});
}

TEST(ReferenceSampling, TopKKeepsTheKLargestAndTiesWithTheKth) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f, 1.0f};
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 2;
  const double z2 = std::exp(3.0) + std::exp(2.0);
  expect_probs_near(reference::sampling_distribution(logits, params, {}), {0, std::exp(3.0) / z2, 0, std::exp(2.0) / z2, 0});
  params.top_k = 3;  // the 3rd largest (1.0) is shared by ids 2 and 4: both stay
  const auto probs = reference::sampling_distribution(logits, params, {});
  EXPECT_EQ(probs[0], 0.0);
  EXPECT_GT(probs[2], 0.0);
  EXPECT_GT(probs[4], 0.0);
}

TEST(ReferenceSampling, TopPDropsTheUnlikelyTail) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_p = 0.7f;  // tail 0.05 + 0.15 = 0.2 <= 0.3 goes; adding 0.3 would exceed it
  expect_probs_near(reference::sampling_distribution(logits, params, {}), {0.625, 0.375, 0, 0});
  params.top_p = 0.01f;  // the most likely token always stays
  expect_probs_near(reference::sampling_distribution(logits, params, {}), {1, 0, 0, 0});
}

TEST(ReferenceSampling, MinPDropsTokensBelowAFractionOfTheBest) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams params;
  params.temperature = 1.0f;
  params.min_p = 0.2f;  // threshold 0.1: only 0.05 goes
  expect_probs_near(reference::sampling_distribution(logits, params, {}), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
}

TEST(ReferenceSampling, DistributionSumsToOneUnderEveryFilter) {
  auto rng = testing::make_rng(31);
  const auto logits = testing::random_uniform(rng, 1000, 8.0f);
  std::vector<int32_t> previous = {5, 17, 5, 999};
  SamplingParams params;
  params.temperature = 0.7f;
  params.top_k = 50;
  params.top_p = 0.9f;
  params.min_p = 0.05f;
  params.repetition_penalty = 1.3f;
  const auto probs = reference::sampling_distribution(logits, params, previous);
  EXPECT_NEAR(std::accumulate(probs.begin(), probs.end(), 0.0), 1.0, 1e-12);
  int nonzero = 0;
  for (double p : probs) {
    EXPECT_GE(p, 0.0);
    nonzero += p > 0;
  }
  EXPECT_GE(nonzero, 1);
  EXPECT_LE(nonzero, 50);
}

TEST(ReferenceSampling, UniformIsSplitmix64) {
  // The first output of splitmix64 seeded with 0 is 0xe220a8397b1dcdaf (the published test vector).
  EXPECT_EQ(reference::sampling_uniform(0, 0), static_cast<double>(0xe220a8397b1dcdafull >> 11) * 0x1.0p-53);
  EXPECT_EQ(reference::sampling_uniform(42, 7), reference::sampling_uniform(42, 7));
  EXPECT_NE(reference::sampling_uniform(42, 7), reference::sampling_uniform(42, 8));
  EXPECT_NE(reference::sampling_uniform(42, 7), reference::sampling_uniform(43, 7));
  double sum = 0;
  const int draws = 100000;
  for (int step = 0; step < draws; ++step) {
    const double u = reference::sampling_uniform(1234, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / draws, 0.5, 0.005);  // standard error ~0.0009
}

TEST(ReferenceSampling, SampleFrequenciesFollowTheDistribution) {
  auto rng = testing::make_rng(32);
  const auto logits = testing::random_uniform(rng, 6, 1.5f);
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 4;
  params.seed = rng();
  const auto probs = reference::sampling_distribution(logits, params, {});
  std::vector<int> counts(6, 0);
  const int draws = 40000;
  for (int step = 0; step < draws; ++step) ++counts[reference::sample(logits, params, {}, step)];
  for (int id = 0; id < 6; ++id) {
    if (probs[id] == 0) EXPECT_EQ(counts[id], 0) << "id " << id;
    EXPECT_NEAR(counts[id] / static_cast<double>(draws), probs[id], 0.015) << "id " << id;  // ~6 sigma
  }
}

}  // namespace
}  // namespace deepfuse
