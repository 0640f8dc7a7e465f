// The reference decoder on random weights: the KV cache path equals the full forward, and the
// sliding window really limits what a position sees.
#include <gtest/gtest.h>

#include "deepfuse/error.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "logits_check.hpp"
#include "reference/random_decoder.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

class DecoderPerArchitecture : public ::testing::TestWithParam<Architecture> {};

TEST_P(DecoderPerArchitecture, IncrementalDecodeEqualsFullForward) {
  auto rng = testing::make_rng(41 + static_cast<int>(GetParam()));
  const ModelConfig config = testing::small_decoder_config(GetParam());
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  const auto ids = testing::random_ids(rng, 11, config.vocab_size);

  auto full_cache = decoder.new_cache();
  const std::vector<float> full = decoder.forward(ids, full_cache);
  ASSERT_EQ(full.size(), ids.size() * config.vocab_size);
  EXPECT_EQ(full_cache.length, 11);

  // Prefill 4, then a chunk of 3, then one at a time.
  auto cache = decoder.new_cache();
  std::vector<float> pieces;
  auto run = [&](size_t begin, size_t end) {
    const auto logits = decoder.forward(std::span(ids).subspan(begin, end - begin), cache);
    pieces.insert(pieces.end(), logits.begin(), logits.end());
  };
  run(0, 4);
  run(4, 7);
  for (size_t t = 7; t < ids.size(); ++t) run(t, t + 1);
  const std::vector<double> reference(full.begin(), full.end());
  EXPECT_LT(testing::relative_error(pieces, reference), 1e-6);
  EXPECT_EQ(testing::count_nan(full), 0u);
}

INSTANTIATE_TEST_SUITE_P(Architectures, DecoderPerArchitecture,
                         ::testing::Values(Architecture::llama, Architecture::qwen2, Architecture::mistral));

// DecoderOptions::e4m3_activations (the FP8 GEMMs' per-token activation quantization): active
// (the logits move off the float-activation ones) but small next to the logits (e4m3 keeps ~2
// significant digits per element); per token, so a prompt run whole and one token at a time
// still agree (a per-tensor scale would couple the tokens).
TEST_P(DecoderPerArchitecture, E4m3ActivationsArePerTokenAndSmall) {
  auto rng = testing::make_rng(71 + static_cast<int>(GetParam()));
  const ModelConfig config = testing::small_decoder_config(GetParam());
  const reference::DecoderWeights weights = testing::random_decoder_weights(config, rng);
  const reference::Decoder plain(config, weights);
  const reference::Decoder emulating(config, weights, {.e4m3_activations = true});
  const auto ids = testing::random_ids(rng, 9, config.vocab_size);

  auto plain_cache = plain.new_cache(), full_cache = emulating.new_cache();
  const std::vector<float> exact = plain.forward(ids, plain_cache);
  const std::vector<float> full = emulating.forward(ids, full_cache);
  const double error = testing::relative_error(full, std::vector<double>(exact.begin(), exact.end()));
  EXPECT_GT(error, 1e-4);
  EXPECT_LT(error, 0.1);
  EXPECT_EQ(testing::count_nan(full), 0u);

  auto cache = emulating.new_cache();
  std::vector<float> pieces;
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto logits = emulating.forward(std::span(ids).subspan(t, 1), cache);
    pieces.insert(pieces.end(), logits.begin(), logits.end());
  }
  EXPECT_LT(testing::relative_error(pieces, std::vector<double>(full.begin(), full.end())), 1e-6);
}

// Why FP8-activation backends are checked against a tolerance (logits_check.hpp,
// rounding_tolerance) rather than against the emulation: the emulation on weights perturbed at
// bf16's resolution (what a GPU's bf16 arithmetic amounts to) is a second draw of the rounding, as
// far from the first draw as the first is from the plain decoder. The tolerance the first draw sets
// accepts that second draw, logits and top-1, and rejects a decoder whose one projection is twice
// what it should be (a scale applied twice).
TEST(E4m3ActivationRounding, ToleranceAcceptsAnotherDrawAndRejectsAWrongScale) {
  auto rng = testing::make_rng(79);
  ModelConfig config = testing::small_decoder_config(Architecture::llama);
  config.vocab_size = 512;
  config.hidden_size = 256;
  config.intermediate_size = 512;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.head_dim = config.rope.head_dim = 64;
  config.max_position_embeddings = 64;
  reference::DecoderWeights weights = testing::random_decoder_weights(config, rng);
  for (auto& layer : weights.layers)
    for (auto& tensor : layer.tensors)
      for (float& v : tensor) v *= 0.3f;  // keep 4 layers' activations in range (random ±0.3 grows them)
  reference::DecoderWeights perturbed = weights, wrong = weights;
  std::uniform_real_distribution<float> bf16_ulp(-1.0f / 256, 1.0f / 256);
  for (auto& layer : perturbed.layers)
    for (auto& tensor : layer.tensors)
      for (float& v : tensor) v *= 1.0f + bf16_ulp(rng);
  for (float& v : wrong.layers[1][TensorRole::down_proj]) v *= 2.0f;

  const auto ids = testing::random_ids(rng, 48, config.vocab_size);
  auto logits = [&](const reference::DecoderWeights& w, bool e4m3) {
    const reference::Decoder decoder(config, w, {.e4m3_activations = e4m3});
    auto cache = decoder.new_cache();
    return decoder.forward(ids, cache);
  };
  const std::vector<float> plain = logits(weights, false), first = logits(weights, true),
                           second = logits(perturbed, true), off = logits(wrong, true);
  const size_t vocab = config.vocab_size;
  const testing::LogitsComparison first_vs_plain = testing::compare_logits(first, plain, vocab);
  constexpr double kBf16Error = 2e-2;  // the engine tests' kMaxLogitsError
  const testing::RoundingTolerance tolerance = testing::rounding_tolerance(first_vs_plain, kBf16Error);
  ASSERT_GT(first_vs_plain.worst_error, 1e-3) << "the rounding must show at all";

  const testing::LogitsComparison draws = testing::compare_logits(second, first, vocab);
  EXPECT_GT(draws.worst_error, 0.5 * first_vs_plain.worst_error) << "the rounding stopped being chaotic: "
                                                                   << draws.describe();
  const testing::LogitsComparison accepted = testing::compare_logits(second, plain, vocab, tolerance.near_tie_fraction);
  EXPECT_LT(accepted.worst_error, tolerance.max_error) << accepted.describe();
  EXPECT_EQ(accepted.top1_wrong.size(), 0u) << accepted.describe();
  const testing::LogitsComparison rejected = testing::compare_logits(off, plain, vocab, tolerance.near_tie_fraction);
  EXPECT_GT(rejected.worst_error, tolerance.max_error) << rejected.describe();
  std::printf("first draw vs plain: %s\nsecond draw vs first: %s\nsecond vs plain: %s\nwrong scale vs plain: %s\n",
              first_vs_plain.describe().c_str(), draws.describe().c_str(), accepted.describe().c_str(),
              rejected.describe().c_str());
}

TEST(ReferenceDecoder, SlidingWindowHidesOldTokens) {
  auto rng = testing::make_rng(45);
  ModelConfig config = testing::small_decoder_config(Architecture::mistral);
  config.num_hidden_layers = 1;  // one layer: position t sees exactly tokens t-2 .. t (window 3)
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  auto ids = testing::random_ids(rng, 6, config.vocab_size);
  auto cache = decoder.new_cache();
  const auto before = decoder.forward(ids, cache);
  ids[0] = (ids[0] + 1) % config.vocab_size;
  cache = decoder.new_cache();
  const auto after = decoder.forward(ids, cache);
  const size_t vocab = config.vocab_size;
  for (size_t t = 0; t < 6; ++t) {
    const std::vector<float> row_before(before.begin() + t * vocab, before.begin() + (t + 1) * vocab);
    const std::vector<float> row_after(after.begin() + t * vocab, after.begin() + (t + 1) * vocab);
    if (t < 3) EXPECT_NE(row_before, row_after) << "position " << t << " should see token 0";
    else EXPECT_EQ(row_before, row_after) << "position " << t << " must not see token 0";
  }
}

TEST(ReferenceDecoder, RejectsSequencesPastMaxPositions) {
  auto rng = testing::make_rng(46);
  const ModelConfig config = testing::small_decoder_config(Architecture::llama);
  const reference::Decoder decoder(config, testing::random_decoder_weights(config, rng));
  auto cache = decoder.new_cache();
  const std::vector<int32_t> too_long(config.max_position_embeddings + 1, 3);
  EXPECT_THROW(decoder.forward(too_long, cache), Error);
  EXPECT_EQ(cache.length, 0);
}

}  // namespace
}  // namespace deepfuse
