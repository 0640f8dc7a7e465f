// Checkpoints written by make-model load back; missing, extra, mis-shaped and non-float tensors
// are errors naming the tensor; F16 conversion is exact where it must be.
#include <gtest/gtest.h>

#include <cmath>

#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "model/float16.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse {
namespace {

using testing::expect_error;

TEST(Float16, EveryHalfRoundTripsAndRoundingIsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = half_bits_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(float_to_half_bits(value), bits) << "half bits " << bits;
  }
  EXPECT_EQ(half_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_bits_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_half_bits(70000.0f), 0x7c00);                          // overflow -> inf
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(NAN))));
}

ModelConfig small_llama() {
  ModelConfig c = model_preset("tiny");
  c.num_hidden_layers = 1;
  c.vocab_size = 40;
  return c;
}

class MakeModelRoundTrip : public ::testing::TestWithParam<std::tuple<SafetensorsDType, int>> {};

TEST_P(MakeModelRoundTrip, WrittenCheckpointLoadsWithTheConfigItWasMadeFor) {
  testing::ScratchDir dir;
  const ModelConfig config = small_llama();
  MakeModelOptions options;
  options.dtype = std::get<0>(GetParam());
  options.shards = std::get<1>(GetParam());
  options.seed = 7;
  write_random_checkpoint(config, dir.path(), options);
  const ModelConfig loaded = load_model_config(dir.path());
  EXPECT_EQ(loaded.hidden_size, config.hidden_size);
  EXPECT_EQ(loaded.vocab_size, 40);
  const Checkpoint checkpoint(dir.path());
  EXPECT_EQ(checkpoint.files().size(), static_cast<size_t>(options.shards));
  const auto weights = load_reference_weights(checkpoint, loaded);
  ASSERT_EQ(weights.layers.size(), 1u);
  // Norm weights sit around 1, projections around 0, nothing degenerate.
  for (float v : weights.layers[0].input_norm) EXPECT_NEAR(v, 1.0f, 0.11f);
  EXPECT_NE(weights.layers[0].q_proj[0], weights.layers[0].q_proj[1]);
  // Same seed, same weights.
  testing::ScratchDir again;
  write_random_checkpoint(config, again.path(), options);
  EXPECT_EQ(load_reference_weights(Checkpoint(again.path()), loaded).embed_tokens, weights.embed_tokens);
}

INSTANTIATE_TEST_SUITE_P(DtypesAndShards, MakeModelRoundTrip,
                         ::testing::Values(std::make_tuple(SafetensorsDType::BF16, 1),
                                           std::make_tuple(SafetensorsDType::F16, 3),
                                           std::make_tuple(SafetensorsDType::F32, 2)));

TEST(MakeModel, PresetsAreValidConfigs) {
  for (const auto& name : model_preset_names()) {
    const ModelConfig preset = model_preset(name);
    const ModelConfig parsed = parse_model_config(model_config_json(preset, SafetensorsDType::BF16), name);
    EXPECT_EQ(parsed.architecture, preset.architecture) << name;
    EXPECT_EQ(parsed.head_dim, preset.head_dim) << name;
    EXPECT_EQ(parsed.rope.llama3_scaling, preset.rope.llama3_scaling) << name;
    EXPECT_EQ(parsed.sliding_window, preset.sliding_window) << name;
    EXPECT_EQ(parsed.qkv_bias, preset.qkv_bias) << name;
  }
  EXPECT_EQ(model_preset("llama3-8b").num_key_value_heads, 8);
  EXPECT_THROW(model_preset("gpt5"), Error);
}

TEST(WeightValidation, MissingExtraMisShapedAndWrongDtype) {
  const ModelConfig config = small_llama();
  testing::ScratchDir dir;
  auto check = [&](const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                   std::initializer_list<std::string> parts, const std::string& dtype = "F32") {
    testing::write_checkpoint_with(dir.path(), config, tensors, dtype);
    expect_error([&] { validate_checkpoint(Checkpoint(dir.path()), load_model_config(dir.path())); }, parts);
  };
  auto tensors = testing::expected_as_pairs(config);
  testing::write_checkpoint_with(dir.path(), config, tensors);
  EXPECT_NO_THROW(validate_checkpoint(Checkpoint(dir.path()), config));

  auto missing = tensors;
  missing.erase(missing.begin() + 3);
  check(missing, {"missing tensor '" + tensors[3].first + "'"});
  auto extra = tensors;
  extra.push_back({"model.layers.7.mlp.gate_proj.weight", {4}});
  check(extra, {"model.safetensors", "unexpected tensor 'model.layers.7.mlp.gate_proj.weight'"});
  auto misshaped = tensors;
  misshaped[2].second = {config.q_size(), config.hidden_size + 1};
  check(misshaped, {"model.safetensors", "tensor '" + tensors[2].first + "'", "shape"});
  check(tensors, {"tensor 'model.embed_tokens.weight'", "dtype I32"}, "I32");
}

TEST(WeightValidation, ShardedIndexMustAgreeWithTheShards) {
  testing::ScratchDir dir;
  const ModelConfig config = small_llama();
  MakeModelOptions options;
  options.shards = 2;
  write_random_checkpoint(config, dir.path(), options);
  const auto index = dir.path() / "model.safetensors.index.json";
  const std::string good = read_text_file(index);
  testing::write_file(index, R"({"weight_map":{"model.norm.weight":"../elsewhere.safetensors"}})");
  expect_error([&] { Checkpoint{dir.path()}; }, {"model.safetensors.index.json", "same directory"});
  testing::write_file(index, R"({"weight_map":{"model.norm.weight":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { Checkpoint{dir.path()}; }, {"model-00001-of-00002.safetensors", "not listed"});
  testing::write_file(index, R"({"weight_map": [1]})");
  expect_error([&] { Checkpoint{dir.path()}; }, {"model.safetensors.index.json", "'weight_map'"});
  testing::write_file(index, good);
  EXPECT_NO_THROW(Checkpoint{dir.path()});
}

}  // namespace
}  // namespace deepfuse
