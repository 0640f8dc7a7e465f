// Speculative verify on the reference decoder: greedy output equals non-speculative output token
// for token (every drafter, every architecture); a verify step emits the argmax prefix and rolls the
// cache back to exactly what a non-speculative run holds; sampled output is the same tokens for
// the same seed and the same distribution over seeds (chi-square), a test shown to catch a wrong
// acceptance rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "deepfuse/reference.hpp"
#include "reference/random_decoder.hpp"
#include "speculative/reference_sequence.hpp"
#include "speculative/chi_square.hpp"
#include "speculative/verify.hpp"
#include "test_util.hpp"

namespace deepfuse::speculative {
namespace {

// The reference tests' small model with a small vocabulary (drafts match often) and room for 256
// positions.
ModelConfig tiny_config(Architecture architecture, int vocab) {
  ModelConfig c = testing::small_decoder_config(architecture);
  c.vocab_size = vocab;
  c.max_position_embeddings = 256;
  if (architecture == Architecture::mistral) c.sliding_window = 7;
  return c;
}

// A prompt with a repeated stretch, so the drafters find matches from the start.
std::vector<int32_t> repetitive_prompt(std::mt19937_64& rng, int vocab) {
  std::vector<int32_t> prompt = testing::random_ids(rng, 12, vocab);
  prompt.insert(prompt.end(), prompt.begin() + 2, prompt.begin() + 10);
  return prompt;
}

std::vector<int32_t> generate(const reference::Decoder& decoder, const std::vector<int32_t>& prompt,
                              const SamplingParams& sampling, int count, SequenceDrafter* drafter) {
  ReferenceSequence sequence(decoder, prompt, sampling, drafter);
  while (sequence.generated() < count) sequence.step(count - sequence.generated());
  EXPECT_EQ(sequence.generated(), count);  // never past the limit
  return {sequence.tokens().begin() + prompt.size(), sequence.tokens().end()};
}

class GreedyPerArchitecture : public ::testing::TestWithParam<Architecture> {};

TEST_P(GreedyPerArchitecture, SpeculativeOutputEqualsNonSpeculative) {
  auto rng = testing::make_rng(5410 + static_cast<int>(GetParam()));
  const ModelConfig config = tiny_config(GetParam(), 12);
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  SuffixCache cache;
  long drafted = 0, accepted = 0;
  for (int prompt_index = 0; prompt_index < 3; ++prompt_index) {
    const std::vector<int32_t> prompt = repetitive_prompt(rng, config.vocab_size);
    const std::vector<int32_t> plain = generate(decoder, prompt, {}, 60, nullptr);
    for (const SpeculativeChoice choice : {SpeculativeChoice::ngram, SpeculativeChoice::suffix}) {
      SequenceDrafter drafter(choice, {}, &cache);
      ReferenceSequence sequence(decoder, prompt, {}, &drafter);
      while (sequence.generated() < 60) sequence.step(60 - sequence.generated());
      const std::vector<int32_t> speculative(sequence.tokens().begin() + prompt.size(), sequence.tokens().end());
      EXPECT_EQ(speculative, plain) << choice_name(choice) << ", prompt " << prompt_index;
      drafted += sequence.drafted();
      accepted += sequence.accepted();
    }
    cache.add(prompt, plain);
    // The same prompt again: the suffix cache proposes the whole earlier output, all accepted.
    SequenceDrafter repeat(SpeculativeChoice::suffix, {}, &cache);
    ReferenceSequence again(decoder, prompt, {}, &repeat);
    int steps = 0;
    for (; again.generated() < 60; ++steps) again.step(60 - again.generated());
    EXPECT_EQ(std::vector<int32_t>(again.tokens().begin() + prompt.size(), again.tokens().end()), plain);
    EXPECT_EQ(again.accepted(), again.drafted());
    EXPECT_LE(steps, 1 + (59 + 8) / 9) << "a repeat verifies 8 drafts a step";
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
}

INSTANTIATE_TEST_SUITE_P(Architectures, GreedyPerArchitecture,
                         ::testing::Values(Architecture::llama, Architecture::qwen2, Architecture::mistral));

// Drafts the true continuation, corrupted at a random place (or not), k from 0 to 6: each verify
// emits exactly the argmax prefix plus one, and the cache holds what a plain run's holds.
TEST(Verify, EmitsTheArgmaxPrefixAndRollsTheCacheBack) {
  auto rng = testing::make_rng(5420);
  const ModelConfig config = tiny_config(Architecture::llama, 16);
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  const std::vector<int32_t> prompt = testing::random_ids(rng, 9, config.vocab_size);
  const std::vector<int32_t> plain = generate(decoder, prompt, {}, 80, nullptr);
  std::vector<int32_t> tokens = prompt;
  tokens.push_back(plain[0]);
  reference::KvCache cache = decoder.new_cache();
  decoder.forward(std::span(prompt), cache);
  while (tokens.size() < prompt.size() + plain.size()) {
    const size_t done = tokens.size() - prompt.size();  // plain[0, done) emitted
    const int k = std::min<int>(static_cast<int>(rng() % 7), static_cast<int>(plain.size() - done) - 1);
    std::vector<int32_t> drafts(plain.begin() + done, plain.begin() + done + k);
    int want_accepted = k;
    if (k > 0 && rng() % 2) {
      want_accepted = static_cast<int>(rng() % k);
      drafts[want_accepted] = (drafts[want_accepted] + 1 + rng() % (config.vocab_size - 1)) % config.vocab_size;
    }
    const int length_before = cache.length;
    const std::vector<int32_t> emitted =
        verify_on_reference(decoder, cache, tokens.back(), drafts, [&](int, std::span<float> logits) {
          return reference::sample(logits, {}, tokens, 0);
        });
    ASSERT_EQ(accepted_count(emitted), want_accepted);
    ASSERT_EQ(emitted, std::vector<int32_t>(plain.begin() + done, plain.begin() + done + want_accepted + 1));
    ASSERT_EQ(cache.length, length_before + 1 + want_accepted);
    tokens.insert(tokens.end(), emitted.begin(), emitted.end());
  }
  // The rolled-back cache is exactly a plain run's: every position but the last token's.
  reference::KvCache fresh = decoder.new_cache();
  decoder.forward(std::span(tokens).first(tokens.size() - 1), fresh);
  ASSERT_EQ(cache.length, fresh.length);
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    EXPECT_EQ(cache.keys[layer], fresh.keys[layer]) << "layer " << layer;
    EXPECT_EQ(cache.values[layer], fresh.values[layer]) << "layer " << layer;
  }
}

SamplingParams sampled(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = seed;
  return p;
}

TEST(Verify, SampledOutputIsTheSameTokensForTheSameSeed) {
  auto rng = testing::make_rng(5430);
  const ModelConfig config = tiny_config(Architecture::qwen2, 8);
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  long accepted = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<int32_t> prompt = repetitive_prompt(rng, config.vocab_size);
    SamplingParams p = sampled(rng());
    p.top_k = 6;
    p.repetition_penalty = 1.1f;
    const std::vector<int32_t> plain = generate(decoder, prompt, p, 30, nullptr);
    SequenceDrafter drafter(SpeculativeChoice::ngram, {});
    ReferenceSequence sequence(decoder, prompt, p, &drafter);
    while (sequence.generated() < 30) sequence.step(30 - sequence.generated());
    EXPECT_EQ(std::vector<int32_t>(sequence.tokens().begin() + prompt.size(), sequence.tokens().end()), plain);
    accepted += sequence.accepted();
  }
  EXPECT_GT(accepted, 0);
}

TEST(Verify, SampledOutputHasTheNonSpeculativeDistribution) {
  auto rng = testing::make_rng(5440);
  ModelConfig config = tiny_config(Architecture::llama, 6);
  config.num_hidden_layers = 1;  // 3 x kRuns generations: kept cheap
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  const std::vector<int32_t> prompt = testing::random_ids(rng, 6, config.vocab_size);
  constexpr int kRuns = 1000, kTokens = 5;
  const uint64_t base = rng();
  // Drafts are random tokens of {0, 1}, 3 a step: accepted with probability p(draft), so both the
  // accepting and the rejecting branch run often. `accept_all` is a wrong rule, for the test's own
  // check: it confines positions 1-3 to {0, 1}.
  auto speculative = [&](uint64_t seed, bool accept_all) {
    ReferenceSequence sequence(decoder, prompt, sampled(seed), nullptr);
    sequence.step(1);
    std::vector<int32_t> tokens = sequence.tokens();
    reference::KvCache cache = decoder.new_cache();
    decoder.forward(std::span(prompt), cache);
    while (static_cast<int>(tokens.size() - prompt.size()) < kTokens) {
      const int k = std::min<int>(3, kTokens - static_cast<int>(tokens.size() - prompt.size()) - 1);
      const std::vector<int32_t> drafts = testing::random_ids(rng, k, 2);
      const std::vector<int32_t> emitted =
          verify_on_reference(decoder, cache, tokens.back(), drafts, [&](int row, std::span<float> logits) {
            if (accept_all && row < k) return drafts[row];
            const uint64_t step = tokens.size() - prompt.size() + row;
            std::vector<int32_t> previous = tokens;
            previous.insert(previous.end(), drafts.begin(), drafts.begin() + row);
            return reference::sample(logits, sampled(seed), previous, step);
          });
      tokens.insert(tokens.end(), emitted.begin(), emitted.end());
    }
    return std::vector<int32_t>(tokens.begin() + prompt.size(), tokens.end());
  };
  std::vector<std::vector<int32_t>> plain, spec, wrong;
  for (int run = 0; run < kRuns; ++run) {
    plain.push_back(generate(decoder, prompt, sampled(base + run), kTokens, nullptr));
    spec.push_back(speculative(base + kRuns + run, false));  // other seeds: a distribution test
    wrong.push_back(speculative(base + 2 * kRuns + run, true));
  }
  EXPECT_LT(testing::worst_chi_square_excess(spec, plain, config.vocab_size), 0.0);
  EXPECT_GT(testing::worst_chi_square_excess(wrong, plain, config.vocab_size), 0.0) << "the test cannot tell a wrong rule";
}

}  // namespace
}  // namespace deepfuse::speculative
