// The reference decoder on random weights: the KV cache path equals the full forward, and the
// sliding window really limits what a position sees.
#include <gtest/gtest.h>

#include "deepfuse/error.hpp"
#include "deepfuse/reference_decoder.hpp"
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
