// Checkpoints written by make-model load back; missing, extra, mis-shaped and non-float tensors
// are errors naming the tensor; F16 conversion is exact where it must be.
#include <gtest/gtest.h>

#include <cmath>

#include "deepfuse/make_model.hpp"
#include "deepfuse/model_tensors.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/weight_format.hpp"
#include "core/float16.hpp"
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
  for (float v : weights.layers[0][TensorRole::input_norm]) EXPECT_NEAR(v, 1.0f, 0.11f);
  EXPECT_NE(weights.layers[0][TensorRole::q_proj][0], weights.layers[0][TensorRole::q_proj][1]);
  // Same seed, same weights.
  testing::ScratchDir again;
  write_random_checkpoint(config, again.path(), options);
  EXPECT_EQ(load_reference_weights(Checkpoint(again.path()), loaded).model[TensorRole::embed_tokens],
            weights.model[TensorRole::embed_tokens]);
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

// Formats come from the model table and quantization_config: an FP8 projection without a
// quantization_config, an FP8 norm (never allowed) and an E5M2 projection are one line naming it
// (tests/model/test_fp8_weights.cpp covers the FP8 checkpoints that load).
TEST(WeightValidation, WeightFormatsFollowTheTable) {
  const ModelConfig config = small_llama();
  testing::ScratchDir dir;
  const auto tensors = testing::expected_as_pairs(config);
  const std::string q_proj = "model.layers.0.self_attn.q_proj.weight", norm = "model.layers.0.input_layernorm.weight";
  testing::write_checkpoint_with(dir.path(), config, tensors, "F32", {{q_proj, "F8_E4M3"}});
  expect_error([&] { validate_checkpoint(Checkpoint(dir.path()), config); },
               {"tensor '" + q_proj + "'", "F8_E4M3", "no quantization_config"});
  testing::write_checkpoint_with(dir.path(), config, tensors, "F32", {{norm, "F8_E4M3"}});
  expect_error([&] { validate_checkpoint(Checkpoint(dir.path()), config); },
               {"tensor '" + norm + "'", "F8_E4M3"});
  testing::write_checkpoint_with(dir.path(), config, tensors, "F32", {{q_proj, "F8_E5M2"}});
  expect_error([&] { validate_checkpoint(Checkpoint(dir.path()), config); }, {"tensor '" + q_proj + "'", "F8_E5M2"});
}

// The table's rows, in checkpoint order: what each architecture's checkpoints hold.
TEST(ModelTensors, ExpectedTensorsFollowTheConfig) {
  ModelConfig c = model_preset("qwen2.5-7b");
  c.num_hidden_layers = 2;
  const std::vector<ExpectedTensor> qwen = expected_tensors(c);
  ASSERT_EQ(qwen.size(), 1 + 2 * 12 + 2u);  // embedding, 12 per block (q/k/v biases), norm, lm_head
  EXPECT_EQ(qwen[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(qwen[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(qwen[5].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(qwen[5].shape, std::vector<int64_t>{c.q_size()});
  EXPECT_EQ(qwen[13].name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(qwen.back().name, "lm_head.weight");
  EXPECT_EQ(qwen.back().shape, (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  for (const ExpectedTensor& t : qwen) EXPECT_EQ(tensor_name(*t.spec, t.layer), t.name);

  ModelConfig llama = model_preset("llama3.2-1b");  // tied, no biases; then Llama attention_bias
  llama.num_hidden_layers = 1;
  EXPECT_EQ(expected_tensors(llama).size(), 1 + 9 + 1u);
  llama.qkv_bias = llama.o_proj_bias = true;
  EXPECT_EQ(expected_tensors(llama).size(), 1 + 13 + 1u);
}

TEST(ModelTensors, GroupsConcatenateRowsInTableOrder) {
  const ModelConfig c = model_preset("llama3-8b");
  EXPECT_EQ(group_rows(TensorGroup::qkv, c), c.q_size() + 2 * c.kv_size());
  EXPECT_EQ(group_columns(TensorGroup::qkv, c), c.hidden_size);
  EXPECT_EQ(row_in_group(tensor_spec(TensorRole::q_proj), c), 0);
  EXPECT_EQ(row_in_group(tensor_spec(TensorRole::k_proj), c), c.q_size());
  EXPECT_EQ(row_in_group(tensor_spec(TensorRole::v_proj), c), c.q_size() + c.kv_size());
  EXPECT_EQ(group_rows(TensorGroup::qkv_bias, c), 0);  // Llama 3 has none
  EXPECT_EQ(group_columns(TensorGroup::input_norm, c), 1);
  EXPECT_EQ(group_rows(TensorGroup::down, c), c.hidden_size);
  EXPECT_EQ(group_columns(TensorGroup::down, c), c.intermediate_size);
  // Every linear weight may be FP8; vectors and the embedding stay 16-bit.
  for (const TensorSpec& spec : kModelTensors) {
    const bool linear = spec.init == TensorInit::linear;
    EXPECT_EQ(spec.formats.has(WeightFormat::fp8_e4m3), linear) << spec.name;
    EXPECT_TRUE(spec.formats.has(WeightFormat::bf16)) << spec.name;
    EXPECT_EQ(spec.columns == Extent::none, spec.init == TensorInit::norm || spec.init == TensorInit::bias) << spec.name;
  }
}

TEST(WeightFormat, TableNamesAndBytes) {
  for (const WeightFormatInfo& info : kWeightFormats) EXPECT_EQ(parse_weight_format(info.name), info.format);
  EXPECT_EQ(linear_weight_bytes(WeightFormat::bf16, 4096, 1024), size_t{4096} * 1024 * 2);
  EXPECT_EQ(linear_weight_bytes(WeightFormat::fp8_e4m3, 4096, 1024), size_t{4096} * 1024 + 4096 * 4);
  EXPECT_EQ(linear_weight_bytes(WeightFormat::fp8_e4m3_block128, 4096, 1024), size_t{4096} * 1024 + 32 * 8 * 4);
  expect_error([] { parse_weight_format("int4"); }, {"unknown weight format 'int4'", "bf16", "fp8_e4m3"});
  EXPECT_NO_THROW(require_implemented(WeightFormat::bf16, "test"));
  // A format the CUDA backend does not take yet is refused in one line naming it.
  for (const WeightFormatInfo& info : kWeightFormats) {
    if (info.implemented)
      EXPECT_NO_THROW(require_implemented(info.format, "test"));
    else
      expect_error([&] { require_implemented(info.format, "the fused MLP"); }, {"the fused MLP", info.name, "not implemented"});
  }
  // The dispatch refuses a weight it cannot read: another format, another layout, no data.
  const int dummy = 0;
  LinearWeight w{WeightFormat::bf16, WeightLayout::row_major, &dummy, nullptr, nullptr, 16, 16};
  EXPECT_EQ(static_cast<const void*>(w.bf16("gemm")), &dummy);
  expect_error([&] { w.bf16_tiles("the GEMV"); }, {"the GEMV", "packed", "row-major"});
  w.format = WeightFormat::fp8_e4m3;
  expect_error([&] { w.bf16("the QKV GEMM"); }, {"the QKV GEMM", "fp8_e4m3"});
  w = {WeightFormat::bf16, WeightLayout::fragments, nullptr, nullptr, nullptr, 16, 16};
  expect_error([&] { w.bf16_tiles("the fused front"); }, {"the fused front", "no fragment-packed copy"});
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
