// The reference decoder on random weights: the KV cache path equals the full forward, and the
// sliding window really limits what a position sees.
#include <gtest/gtest.h>

#include "deepfuse/error.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

ModelConfig small_config(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = 50;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 10;  // != hidden / heads
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope.head_dim = c.head_dim;
  c.qkv_bias = architecture == Architecture::qwen2;
  c.tie_word_embeddings = architecture == Architecture::qwen2;
  c.sliding_window = architecture == Architecture::mistral ? 3 : 0;
  if (architecture == Architecture::llama) {
    c.rope.llama3_scaling = true;
    c.rope.factor = 4;
    c.rope.original_max_position = 16;
  }
  return c;
}

// Every tensor the model table asks of `c`, in its shape: norms around 1, the embedding ±1,
// the rest ±0.3.
reference::DecoderWeights random_weights(const ModelConfig& c, std::mt19937_64& rng) {
  auto draw = [&](const TensorSpec& spec) {
    const std::vector<int64_t> shape = tensor_shape(spec, c);
    const size_t count = static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1));
    const float scale = spec.init == TensorInit::norm ? 0.2f : spec.init == TensorInit::embedding ? 1.0f : 0.3f;
    auto w = testing::random_uniform(rng, count, scale);
    if (spec.init == TensorInit::norm)
      for (float& v : w) v += 1.0f;
    return w;
  };
  reference::DecoderWeights w;
  w.layers.resize(c.num_hidden_layers);
  for (const TensorSpec& spec : kModelTensors) {
    if (!spec.present(c)) continue;
    if (spec.scope != TensorScope::layer) w.model[spec.role] = draw(spec);
    else
      for (auto& layer : w.layers) layer[spec.role] = draw(spec);
  }
  return w;
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int count, int vocab) {
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

class DecoderPerArchitecture : public ::testing::TestWithParam<Architecture> {};

TEST_P(DecoderPerArchitecture, IncrementalDecodeEqualsFullForward) {
  auto rng = testing::make_rng(41 + static_cast<int>(GetParam()));
  const ModelConfig config = small_config(GetParam());
  const reference::Decoder decoder(config, random_weights(config, rng));
  const auto ids = random_ids(rng, 11, config.vocab_size);

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

TEST(ReferenceDecoder, SlidingWindowHidesOldTokens) {
  auto rng = testing::make_rng(45);
  ModelConfig config = small_config(Architecture::mistral);
  config.num_hidden_layers = 1;  // one layer: position t sees exactly tokens t-2 .. t (window 3)
  const reference::Decoder decoder(config, random_weights(config, rng));
  auto ids = random_ids(rng, 6, config.vocab_size);
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
  const ModelConfig config = small_config(Architecture::llama);
  const reference::Decoder decoder(config, random_weights(config, rng));
  auto cache = decoder.new_cache();
  const std::vector<int32_t> too_long(config.max_position_embeddings + 1, 3);
  EXPECT_THROW(decoder.forward(too_long, cache), Error);
  EXPECT_EQ(cache.length, 0);
}

}  // namespace
}  // namespace deepfuse
