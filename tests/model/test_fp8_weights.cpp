// FP8 checkpoints: the e4m3 codec against the OCP spec, quantization_config parsing and its
// refusals, FP8 checkpoints (compressed-tensors per channel / per tensor, fp8 128x128 blocks)
// loading on the reference backend exactly as their dequantized F32 twins, every bad FP8 input as
// one line naming the tensor, and FP8 quantization at load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>

#include "deepfuse/bf16.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "core/float8.hpp"
#include "model/fp8_weights.hpp"
#include "model/fp8_test_util.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse {
namespace {

using testing::compressed_tensors;
using testing::config_json_with;
using testing::draw_fp8_pair;
using testing::expect_error;
using testing::fp8_cases;
using testing::Fp8Case;
using testing::Fp8Pair;
using testing::kBlockFp8;
using testing::kChannelWeights;
using testing::RawTensor;
using testing::write_raw_checkpoint;

TEST(Float8, E4m3DecodesTheSpecValues) {
  EXPECT_EQ(float8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(float8_e4m3_to_float(0x80)));
  EXPECT_EQ(float8_e4m3_to_float(0x38), 1.0f);                     // exponent 7 = bias
  EXPECT_EQ(float8_e4m3_to_float(0x7e), 448.0f);                   // largest finite: 1.75 * 2^8
  EXPECT_EQ(float8_e4m3_to_float(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(float8_e4m3_to_float(0x7f)));             // the only NaNs, no infinities
  EXPECT_TRUE(std::isnan(float8_e4m3_to_float(0xff)));
  EXPECT_EQ(float8_e4m3_to_float(0x78), 256.0f);                   // exponent 15 is finite in e4m3
  EXPECT_EQ(float8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));     // smallest normal
  EXPECT_EQ(float8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));     // smallest subnormal
  EXPECT_EQ(float8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(float8_e4m3_to_float(0x3b), 1.375f);
}

TEST(Float8, E4m3EncodeRoundsToNearestEvenAndSaturates) {
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7f) == 0x7f) continue;
    ASSERT_EQ(float_to_float8_e4m3(float8_e4m3_to_float(static_cast<uint8_t>(bits))), bits) << bits;
  }
  EXPECT_EQ(float_to_float8_e4m3(1.0625f), 0x38);   // tie between 1 and 1.125 -> even (down)
  EXPECT_EQ(float_to_float8_e4m3(1.1875f), 0x3a);   // tie between 1.125 and 1.25 -> even (up)
  EXPECT_EQ(float_to_float8_e4m3(1.07f), 0x39);
  EXPECT_EQ(float_to_float8_e4m3(15.5f * std::ldexp(1.0f, -9)), 0x10);   // tie of 2^-9 steps -> even 16: 2^-5
  EXPECT_EQ(float_to_float8_e4m3(std::ldexp(1.0f, -10)), 0x00);          // half the smallest subnormal -> even 0
  EXPECT_EQ(float_to_float8_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);      // 1.5 steps -> even 2
  EXPECT_EQ(float_to_float8_e4m3(7.5f * std::ldexp(1.0f, -9)), 0x08);    // rounds up into the normals
  EXPECT_EQ(float_to_float8_e4m3(464.0f), 0x7e);                         // past 448: saturate
  EXPECT_EQ(float_to_float8_e4m3(1e9f), 0x7e);
  EXPECT_EQ(float_to_float8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_float8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(float_to_float8_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xff);
}

// The nearest e4m3 value by search over all of them (ties to the even code, beyond 448 the
// largest): the spec, against which the encoder's bit arithmetic is checked.
uint8_t nearest_e4m3(float value) {
  static const std::vector<float> positive = [] {
    std::vector<float> v;
    for (int code = 0; code <= 0x7e; ++code) v.push_back(float8_e4m3_to_float(static_cast<uint8_t>(code)));
    return v;
  }();
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  if (magnitude >= positive.back()) return sign | 0x7e;
  const size_t above = static_cast<size_t>(std::upper_bound(positive.begin(), positive.end(), magnitude) - positive.begin());
  const size_t below = above - 1;  // positive[0] = 0 <= magnitude
  const float down = magnitude - positive[below], up = positive[above] - magnitude;
  const size_t code = down < up ? below : up < down ? above : (below % 2 == 0 ? below : above);
  return sign | static_cast<uint8_t>(code);
}

TEST(Float8, E4m3EncodeIsTheNearestValueEverywhere) {
  std::vector<float> values;
  auto add = [&](uint32_t bits) {
    float v = 0;
    std::memcpy(&v, &bits, sizeof v);
    values.push_back(v);
    values.push_back(-v);
  };
  for (uint32_t bits = 0; bits < 0x44000000u; bits += 4099) add(bits);                 // 0 .. 512, sampled
  for (uint32_t bits = 0; bits < 0x44000000u; bits += 0x10000) add(bits);              // every bf16 value there
  for (int code = 0; code < 0x7e; ++code) {  // every tie between neighbours, and a few ulps around it
    const float mid = (float8_e4m3_to_float(static_cast<uint8_t>(code)) +
                       float8_e4m3_to_float(static_cast<uint8_t>(code + 1))) / 2;
    uint32_t bits = 0;
    std::memcpy(&bits, &mid, sizeof bits);
    for (uint32_t d = 0; d <= 3; ++d) add(bits + d), add(bits - d);
  }
  for (float v : values) ASSERT_EQ(float_to_float8_e4m3(v), nearest_e4m3(v)) << v;
}

TEST(Float8, E5m2DecodesTheSpecValues) {
  EXPECT_EQ(float8_e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(float8_e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(float8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(float8_e5m2_to_float(0x7c)));
  EXPECT_TRUE(std::isnan(float8_e5m2_to_float(0x7d)));
}

TEST(Float8, QuantizeRowsKeepsEachRowsAbsmaxExactly) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(4 * 64);
  for (float& v : w) v = normal(rng);
  std::fill(w.begin() + 64, w.begin() + 128, 0.0f);  // an all-zero row
  const std::vector<float> original = w;
  quantize_rows_fp8(w, 4, 64);
  for (int r = 0; r < 4; ++r) {
    float absmax = 0;
    for (int c = 0; c < 64; ++c) absmax = std::max(absmax, std::fabs(original[r * 64 + c]));
    for (int c = 0; c < 64; ++c) {
      const float v = original[r * 64 + c], q = w[r * 64 + c];
      if (std::fabs(v) == absmax) EXPECT_FLOAT_EQ(q, v);
      // Half an e4m3 step: 2^-4 relative for normals, 2^-10 of the row's absmax for subnormals.
      EXPECT_LE(std::fabs(q - v), std::max(std::fabs(v) / 16, absmax / 448 * std::ldexp(1.0f, -10)) * 1.0001f);
    }
  }
}

// Per block what quantize_rows_fp8 does per row: each block's absmax / 448 is its scale (1 for an
// all-zero block), its absmax element exact, every element within half an e4m3 step.
TEST(Float8, QuantizeBlocksKeepsEachBlocksAbsmaxExactly) {
  constexpr int64_t kRows = 256, kColumns = 384, kSide = 128;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(kRows * kColumns);
  for (int64_t o = 0; o < kRows; ++o)
    for (int64_t i = 0; i < kColumns; ++i)  // a different magnitude per block
      w[o * kColumns + i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(o / kSide * 3 + i / kSide) - 8);
  for (int64_t o = 128; o < 256; ++o)
    for (int64_t i = 256; i < 384; ++i) w[o * kColumns + i] = 0.0f;  // block (1, 2): all zero
  std::vector<uint8_t> bytes(w.size(), 0x7f);
  const std::vector<float> scales = quantize_blocks_fp8(w, kRows, kColumns, kSide, bytes);
  ASSERT_EQ(scales.size(), 6u);
  std::vector<float> rounded = w;
  round_through_fp8(rounded, kRows, kColumns, WeightFormat::fp8_e4m3_block128);
  for (int b = 0; b < 6; ++b) {
    const int64_t row0 = b / 3 * kSide, column0 = b % 3 * kSide;
    float absmax = 0;
    for (int64_t o = row0; o < row0 + kSide; ++o)
      for (int64_t i = column0; i < column0 + kSide; ++i) absmax = std::max(absmax, std::fabs(w[o * kColumns + i]));
    EXPECT_EQ(scales[b], absmax > 0 ? absmax / kFloat8E4m3Max : 1.0f) << "block " << b;
    for (int64_t o = row0; o < row0 + kSide; ++o)
      for (int64_t i = column0; i < column0 + kSide; ++i) {
        const size_t k = static_cast<size_t>(o * kColumns + i);
        const float q = float8_e4m3_to_float(bytes[k]) * scales[b];
        ASSERT_EQ(rounded[k], q) << o << ", " << i;
        if (std::fabs(w[k]) == absmax) ASSERT_EQ(q, w[k]) << o << ", " << i;
        ASSERT_LE(std::fabs(q - w[k]), std::max(std::fabs(w[k]) / 16, absmax / 448 * std::ldexp(1.0f, -10)) * 1.0001f)
            << o << ", " << i;
      }
  }
  // Per-channel formats round by rows.
  std::vector<float> by_rows = w, expected = w;
  round_through_fp8(by_rows, kRows, kColumns, WeightFormat::fp8_e4m3);
  quantize_rows_fp8(expected, kRows, kColumns);
  EXPECT_EQ(by_rows, expected);
  expect_error([&] { quantize_blocks_fp8(w, kRows, kColumns - 1, kSide, bytes); }, {"not whole"});
}

// --- quantization_config --------------------------------------------------------------------

ModelConfig parse_with(const std::string& quantization_config) {
  const std::string base = model_config_json(model_preset("tiny"), SafetensorsDType::BF16);
  nlohmann::json config = nlohmann::json::parse(base);
  config["quantization_config"] = nlohmann::json::parse(quantization_config);
  return parse_model_config(config.dump(), "config.json");
}

TEST(QuantizationConfig, CompressedTensorsAndBlockFp8Parse) {
  const WeightQuantization channel = parse_with(compressed_tensors(kChannelWeights)).quantization;
  EXPECT_EQ(channel.method, QuantizationMethod::compressed_tensors);
  EXPECT_EQ(channel.format, WeightFormat::fp8_e4m3);
  EXPECT_EQ(channel.scale_scope, ScaleScope::channel);
  EXPECT_EQ(channel.scale_name, "weight_scale");
  EXPECT_FALSE(quantizes_module(channel, "lm_head"));
  EXPECT_TRUE(quantizes_module(channel, "model.layers.0.mlp.down_proj"));
  const WeightQuantization tensor =
      parse_with(compressed_tensors(R"({"num_bits": 8, "type": "float", "strategy": "tensor"})", "", "null")).quantization;
  EXPECT_EQ(tensor.scale_scope, ScaleScope::tensor);
  const WeightQuantization block = parse_with(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                                  "weight_block_size": [128, 128],
                                                  "modules_to_not_convert": ["lm_head", "down_proj"]})")
                                       .quantization;
  EXPECT_EQ(block.format, WeightFormat::fp8_e4m3_block128);
  EXPECT_EQ(block.scale_name, "weight_scale_inv");
  EXPECT_FALSE(quantizes_module(block, "model.layers.3.mlp.down_proj"));  // HF matches substrings
  EXPECT_TRUE(quantizes_module(block, "model.layers.3.mlp.up_proj"));
  // compressed-tensors' "re:" entries match from the start of the module name.
  WeightQuantization regex = channel;
  regex.ignore = {"re:.*mlp\\.down_proj$"};
  EXPECT_FALSE(quantizes_module(regex, "model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(quantizes_module(regex, "model.layers.0.mlp.up_proj"));
  // fp8 without a block size: per-tensor weight_scale (AutoFP8's checkpoints).
  EXPECT_EQ(parse_with(R"({"quant_method": "fp8"})").quantization.scale_scope, ScaleScope::tensor);
  // Qwen's and DeepSeek's FP8 releases list no modules: lm_head stays 16-bit all the same.
  const WeightQuantization released = parse_with(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                                     "weight_block_size": [128, 128]})")
                                          .quantization;
  EXPECT_EQ(released.format, WeightFormat::fp8_e4m3_block128);
  EXPECT_FALSE(quantizes_module(released, "lm_head"));
  EXPECT_TRUE(quantizes_module(released, "model.layers.0.self_attn.q_proj"));
}

TEST(QuantizationConfig, EverythingElseIsRefusedNamingTheField) {
  const std::string qc = "field 'quantization_config.";
  for (const char* method : {"awq", "gptq", "bitsandbytes", "marlin"})
    expect_error([&] { parse_with(std::string(R"({"quant_method": ")") + method + R"(", "bits": 4})"); },
                 {"config.json", qc + "quant_method'", method});
  expect_error([&] { parse_with(R"({"load_in_4bit": true})"); }, {qc + "quant_method' is missing"});
  expect_error([&] { parse_with(compressed_tensors(R"({"num_bits": 8, "type": "int", "strategy": "channel"})")); },
               {qc + "config_groups.group_0.weights.type'", "int"});
  expect_error([&] { parse_with(compressed_tensors(R"({"num_bits": 4, "type": "float"})")); },
               {qc + "config_groups.group_0.weights.num_bits'"});
  expect_error([&] { parse_with(compressed_tensors(R"({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128})")); },
               {qc + "config_groups.group_0.weights.group_size'"});
  expect_error([&] {
    parse_with(compressed_tensors(kChannelWeights, "", R"({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false})"));
  }, {qc + "config_groups.group_0.input_activations.dynamic'", "input_scale"});
  expect_error([&] { parse_with(compressed_tensors(kChannelWeights, R"(, "format": "pack-quantized")")); },
               {qc + "format'"});
  std::string kv = compressed_tensors(kChannelWeights);
  kv.replace(kv.find("\"kv_cache_scheme\": null"), 23, R"("kv_cache_scheme": {"num_bits": 8, "type": "float"})");
  expect_error([&] { parse_with(kv); }, {qc + "kv_cache_scheme'"});
  expect_error([&] { parse_with(R"({"quant_method": "fp8", "weight_block_size": [64, 64]})"); },
               {qc + "weight_block_size'", "128x128"});
  expect_error([&] { parse_with(R"({"quant_method": "fp8", "activation_scheme": "static"})"); },
               {qc + "activation_scheme'"});
  expect_error([&] { parse_with(R"({"quant_method": "fp8", "fmt": "e5m2"})"); }, {qc + "fmt'"});
}

// --- FP8 checkpoints ------------------------------------------------------------------------

class Fp8Checkpoint : public ::testing::TestWithParam<int> {};

// The reference backend is the FP8 kernels' oracle: an FP8 checkpoint must decode exactly as the
// F32 checkpoint of its dequantized weights.
TEST_P(Fp8Checkpoint, DecodesExactlyAsItsDequantizedTwin) {
  const Fp8Case c = fp8_cases()[GetParam()];
  const ModelConfig config = testing::block_friendly_config();
  const Fp8Pair pair = draw_fp8_pair(config, c.scope, c.scale_name, 11 + GetParam());
  testing::ScratchDir fp8_dir, f32_dir;
  write_raw_checkpoint(fp8_dir.path(), config_json_with(config, c.quantization_config), pair.fp8);
  write_raw_checkpoint(f32_dir.path(), config_json_with(config, ""), pair.f32);
  const ModelConfig fp8_config = load_model_config(fp8_dir.path());
  ASSERT_TRUE(fp8_config.quantization.quantized()) << c.name;
  const reference::DecoderWeights fp8 = load_reference_weights(Checkpoint(fp8_dir.path()), fp8_config);
  const reference::DecoderWeights f32 = load_reference_weights(Checkpoint(f32_dir.path()), config);
  EXPECT_EQ(fp8.layers[0][TensorRole::down_proj], f32.layers[0][TensorRole::down_proj]) << c.name;
  const reference::Decoder fp8_decoder(fp8_config, fp8), f32_decoder(config, f32);
  const std::vector<int32_t> ids = {1, 7, 3, 39, 12};
  reference::KvCache a = fp8_decoder.new_cache(), b = f32_decoder.new_cache();
  const std::vector<float> logits = fp8_decoder.forward(ids, a);
  EXPECT_EQ(logits, f32_decoder.forward(ids, b)) << c.name;
  float spread = 0;
  for (float v : logits) spread = std::max(spread, std::fabs(v));
  EXPECT_GT(spread, 0.0f);  // not a degenerate all-zero model
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Checkpoint, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return std::string(fp8_cases()[info.param].name); });

RawTensor& find(std::vector<RawTensor>& tensors, const std::string& name) {
  for (RawTensor& t : tensors)
    if (t.name == name) return t;
  throw Error("test: no tensor " + name);
}

// Bad FP8 input: one line naming the tensor (the CLI exits 2 on it).
TEST(Fp8Checkpoint, BadInputIsOneLineNamingTheTensor) {
  const ModelConfig config = testing::block_friendly_config();
  const std::string q_proj = "model.layers.0.self_attn.q_proj.weight", scale = "model.layers.0.self_attn.q_proj.weight_scale";
  const std::string json = config_json_with(config, compressed_tensors(kChannelWeights));
  testing::ScratchDir dir;
  auto expect_refused = [&](std::vector<RawTensor> tensors, std::initializer_list<std::string> parts,
                            const std::string& config_json) {
    write_raw_checkpoint(dir.path(), config_json, tensors);
    expect_error([&] { load_reference_weights(Checkpoint(dir.path()), load_model_config(dir.path())); }, parts);
  };
  const Fp8Pair good = draw_fp8_pair(config, ScaleScope::channel, "weight_scale", 5);
  auto refused = [&](auto change, std::initializer_list<std::string> parts, const std::string& j) {
    std::vector<RawTensor> tensors = good.fp8;
    change(tensors);
    expect_refused(tensors, parts, j);
  };
  refused([&](auto& t) { t.erase(t.begin() + 3); }, {"missing tensor '" + scale + "'", q_proj}, json);
  refused([&](auto& t) { find(t, scale).shape = {config.q_size()}; find(t, scale).bytes.resize(config.q_size() * 2); },
          {"tensor '" + scale + "'", "shape [256]", "[256, 1]"}, json);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    refused([&](auto& t) {
      const uint16_t bits = float_to_bf16_bits(bad);
      std::memcpy(find(t, scale).bytes.data() + 2 * 17, &bits, 2);
    }, {"tensor '" + scale + "'", "non-finite scale", "element 17"}, json);
  }
  refused([&](auto& t) { find(t, scale).dtype = "F8_E4M3"; find(t, scale).bytes.resize(config.q_size()); },
          {"tensor '" + scale + "'", "dtype F8_E4M3", "scales must be"}, json);
  refused([&](auto& t) { find(t, q_proj).dtype = "F8_E5M2"; }, {"tensor '" + q_proj + "'", "F8_E5M2"}, json);
  refused([&](auto& t) { find(t, q_proj).dtype = "U8"; }, {"tensor '" + q_proj + "'", "U8"}, json);
  // A 16-bit weight the config quantizes, and an FP8 one its ignore list keeps 16-bit.
  const std::string down = "model.layers.0.mlp.down_proj.weight";
  refused([&](auto& t) { find(t, down).dtype = "BF16"; find(t, down).bytes.resize(find(t, down).bytes.size() * 2); },
          {"tensor '" + down + "'", "BF16", "fp8_e4m3"}, json);
  std::string ignoring = compressed_tensors(kChannelWeights);
  ignoring.replace(ignoring.find("[\"lm_head\"]"), 11, R"(["lm_head", "model.layers.0.mlp.down_proj"])");
  refused([](auto&) {}, {"tensor '" + down + "'", "ignore list"}, config_json_with(config, ignoring));
  // Static activation scales in the files are tensors nothing reads: refused as unexpected.
  refused([&](auto& t) { t.push_back({"model.layers.0.self_attn.q_proj.input_scale", "F32", {1}, std::string(4, '\0')}); },
          {"unexpected tensor 'model.layers.0.self_attn.q_proj.input_scale'"}, json);
  // 128x128 blocks that do not divide the shape (the tiny preset's 64-wide hidden size).
  ModelConfig narrow = model_preset("tiny");
  narrow.num_hidden_layers = 1;
  testing::ScratchDir narrow_dir;
  std::vector<RawTensor> narrow_tensors;
  for (const ExpectedTensor& t : expected_tensors(narrow)) {
    int64_t count = 1;
    for (int64_t e : t.shape) count *= e;
    const bool fp8 = t.spec->init == TensorInit::linear && t.spec->role != TensorRole::lm_head;
    narrow_tensors.push_back({t.name, fp8 ? "F8_E4M3" : "F32", t.shape, std::string(count * (fp8 ? 1 : 4), '\0')});
    if (fp8)
      narrow_tensors.push_back({t.name + "_scale_inv", "F32", {1, 1}, std::string(4, '\0')});
  }
  write_raw_checkpoint(narrow_dir.path(), config_json_with(narrow, kBlockFp8), narrow_tensors);
  expect_error([&] { validate_checkpoint(Checkpoint(narrow_dir.path()), load_model_config(narrow_dir.path())); },
               {"tensor 'model.layers.0.self_attn.q_proj.weight'", "shape [64, 64]", "128x128"});
}

TEST(Fp8Checkpoint, QuantizeAtLoadRoundsTheProjectionsOnly) {
  testing::ScratchDir dir;
  ModelConfig config = testing::block_friendly_config();
  MakeModelOptions options;
  options.dtype = SafetensorsDType::F32;
  write_random_checkpoint(config, dir.path(), options);
  const Checkpoint checkpoint(dir.path());
  const reference::DecoderWeights original = load_reference_weights(checkpoint, config);
  WeightLoadOptions fp8;
  fp8.quantize = WeightFormat::fp8_e4m3;
  const reference::DecoderWeights quantized = load_reference_weights(checkpoint, config, fp8);
  std::vector<float> expected = original.layers[0][TensorRole::gate_proj];
  quantize_rows_fp8(expected, config.intermediate_size, config.hidden_size);
  EXPECT_EQ(quantized.layers[0][TensorRole::gate_proj], expected);
  EXPECT_NE(quantized.layers[0][TensorRole::gate_proj], original.layers[0][TensorRole::gate_proj]);
  EXPECT_EQ(quantized.layers[0][TensorRole::input_norm], original.layers[0][TensorRole::input_norm]);
  EXPECT_EQ(quantized.model[TensorRole::lm_head], original.model[TensorRole::lm_head]);  // kept 16-bit
  EXPECT_EQ(quantized.model[TensorRole::embed_tokens], original.model[TensorRole::embed_tokens]);
  // Blocks: each 128x128 block's absmax sets its scale.
  const reference::DecoderWeights blocks =
      load_reference_weights(checkpoint, config, {.quantize = WeightFormat::fp8_e4m3_block128});
  expected = original.layers[0][TensorRole::gate_proj];
  round_through_fp8(expected, config.intermediate_size, config.hidden_size, WeightFormat::fp8_e4m3_block128);
  EXPECT_EQ(blocks.layers[0][TensorRole::gate_proj], expected);
  EXPECT_NE(blocks.layers[0][TensorRole::gate_proj], quantized.layers[0][TensorRole::gate_proj]);
  EXPECT_EQ(blocks.model[TensorRole::lm_head], original.model[TensorRole::lm_head]);
  fp8.quantize_lm_head = true;
  EXPECT_NE(load_reference_weights(checkpoint, config, fp8).model[TensorRole::lm_head],
            original.model[TensorRole::lm_head]);
  config.tie_word_embeddings = true;
  testing::ScratchDir tied;
  write_random_checkpoint(config, tied.path(), options);
  expect_error([&] { load_reference_weights(Checkpoint(tied.path()), config, fp8); },
               {"--quantize-lm-head", "ties"});
}

// make-model --dtype fp8: the same draws as the 16-bit checkpoint of that seed, each projection
// row stored as e4m3 times a BF16 absmax scale, lm_head and vectors as in the BF16 checkpoint.
TEST(Fp8Checkpoint, MakeModelWritesCompressedTensorsFp8) {
  ModelConfig config = model_preset("tiny");
  config.num_hidden_layers = 1;
  MakeModelOptions options;
  options.seed = 9;
  options.shards = 2;
  testing::ScratchDir bf16_dir, fp8_dir;
  write_random_checkpoint(config, bf16_dir.path(), options);
  config.quantization = fp8_checkpoint_quantization();
  write_random_checkpoint(config, fp8_dir.path(), options);
  const ModelConfig loaded = load_model_config(fp8_dir.path());
  ASSERT_EQ(loaded.quantization.method, QuantizationMethod::compressed_tensors);
  EXPECT_EQ(loaded.quantization.ignore, std::vector<std::string>{"lm_head"});
  const Checkpoint checkpoint(fp8_dir.path());
  EXPECT_EQ(checkpoint.find("model.layers.0.mlp.up_proj.weight")->info->dtype, SafetensorsDType::F8_E4M3);
  EXPECT_EQ(checkpoint.find("model.layers.0.mlp.up_proj.weight_scale")->info->shape,
            (std::vector<int64_t>{config.intermediate_size, 1}));
  EXPECT_EQ(checkpoint.find("lm_head.weight")->info->dtype, SafetensorsDType::BF16);
  const reference::DecoderWeights fp8 = load_reference_weights(checkpoint, loaded);
  const reference::DecoderWeights bf16 = load_reference_weights(Checkpoint(bf16_dir.path()), load_model_config(bf16_dir.path()));
  EXPECT_EQ(fp8.model[TensorRole::lm_head], bf16.model[TensorRole::lm_head]);
  EXPECT_EQ(fp8.layers[0][TensorRole::input_norm], bf16.layers[0][TensorRole::input_norm]);
  const std::vector<float>& q = fp8.layers[0][TensorRole::up_proj];
  const std::vector<float>& w = bf16.layers[0][TensorRole::up_proj];
  ASSERT_EQ(q.size(), w.size());
  const float bound = std::sqrt(3.0f / static_cast<float>(config.hidden_size));  // the draw's range
  size_t differ = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    // e4m3's half step (2^-4 relative) plus the BF16 rounding of the 16-bit twin (2^-8).
    EXPECT_LE(std::fabs(q[i] - w[i]), std::fabs(w[i]) / 16 + bound / 448 + std::fabs(w[i]) / 256) << i;
    differ += q[i] != w[i];
  }
  EXPECT_GT(differ, q.size() / 2);  // it really is 8-bit
}

// make-model --dtype fp8-block128: a checkpoint as Qwen's and DeepSeek's FP8 releases are (their
// quantization_config exactly, F8_E4M3 weights, F32 weight_scale_inv per 128x128 block, lm_head
// 16-bit), whose every projection is the 16-bit checkpoint of that seed rounded through e4m3 with
// each block's absmax / 448 as its scale; the reference backend runs it.
TEST(Fp8Checkpoint, MakeModelWritesBlockFp8AsHuggingFaceReleasesDo) {
  ModelConfig config = testing::block_friendly_config();
  config.num_hidden_layers = 2;
  MakeModelOptions options;
  options.dtype = SafetensorsDType::F32;  // the twin's numbers exactly as drawn
  options.seed = 12;
  options.shards = 3;
  testing::ScratchDir f32_dir, fp8_dir;
  write_random_checkpoint(config, f32_dir.path(), options);
  config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3_block128);
  write_random_checkpoint(config, fp8_dir.path(), options);
  std::ifstream config_file(fp8_dir.path() / "config.json");
  EXPECT_EQ(nlohmann::json::parse(config_file)["quantization_config"],
            nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                      "weight_block_size": [128, 128]})"));
  const ModelConfig loaded = load_model_config(fp8_dir.path());
  ASSERT_EQ(loaded.quantization.format, WeightFormat::fp8_e4m3_block128);
  const Checkpoint checkpoint(fp8_dir.path());
  EXPECT_EQ(checkpoint.find("lm_head.weight")->info->dtype, SafetensorsDType::F32);
  EXPECT_EQ(checkpoint.find("lm_head.weight_scale_inv"), nullptr);
  const reference::DecoderWeights fp8 = load_reference_weights(checkpoint, loaded);
  const reference::DecoderWeights f32 = load_reference_weights(Checkpoint(f32_dir.path()), load_model_config(f32_dir.path()));
  EXPECT_EQ(fp8.model[TensorRole::lm_head], f32.model[TensorRole::lm_head]);
  int projections = 0;
  for (const ExpectedTensor& tensor : expected_tensors(loaded)) {
    if (stored_weight_format(loaded, tensor) == WeightFormat::bf16) continue;
    ++projections;
    const Checkpoint::Entry& weight = *checkpoint.find(tensor.name);
    const Checkpoint::Entry& scale = *checkpoint.find(tensor.name + "_scale_inv");
    const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
    EXPECT_EQ(weight.info->dtype, SafetensorsDType::F8_E4M3) << tensor.name;
    EXPECT_EQ(scale.info->dtype, SafetensorsDType::F32) << tensor.name;
    ASSERT_EQ(scale.info->shape, (std::vector<int64_t>{rows / 128, columns / 128})) << tensor.name;
    const std::vector<float> scales = to_float32(checkpoint.data(scale), SafetensorsDType::F32);
    const std::vector<float>& w = f32.layers[tensor.layer][tensor.spec->role];
    const std::vector<float>& q = fp8.layers[tensor.layer][tensor.spec->role];
    ASSERT_EQ(q.size(), w.size());
    std::vector<float> absmax(scales.size(), 0.0f);
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < columns; ++i) {
        float& m = absmax[(o / 128) * (columns / 128) + i / 128];
        m = std::max(m, std::fabs(w[o * columns + i]));
      }
    for (size_t b = 0; b < scales.size(); ++b) ASSERT_EQ(scales[b], absmax[b] / kFloat8E4m3Max) << tensor.name << " block " << b;
    size_t differ = 0;
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < columns; ++i) {
        const size_t k = static_cast<size_t>(o * columns + i);
        const float s = scales[(o / 128) * (columns / 128) + i / 128];
        ASSERT_EQ(q[k], float8_e4m3_to_float(float_to_float8_e4m3(w[k] / s)) * s) << tensor.name << " " << o << ", " << i;
        differ += q[k] != w[k];
      }
    EXPECT_GT(differ, q.size() / 2) << tensor.name;  // it really is 8-bit
  }
  EXPECT_EQ(projections, 7 * config.num_hidden_layers);
  const reference::Decoder decoder(loaded, fp8);
  reference::KvCache cache = decoder.new_cache();
  const std::vector<int32_t> ids = {1, 7, 3, 39, 12};
  const std::vector<float> logits = decoder.forward(ids, cache);
  float spread = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    spread = std::max(spread, std::fabs(v));
  }
  EXPECT_GT(spread, 0.0f);
}

// A block format needs whole blocks: the first projection that is not is named, nothing written.
TEST(Fp8Checkpoint, MakeModelRefusesProjectionsThatAreNotWholeBlocks) {
  ModelConfig config = model_preset("tiny");  // hidden 64
  config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3_block128);
  testing::ScratchDir dir;
  expect_error([&] { write_random_checkpoint(config, dir.path() / "out", {}); },
               {"make-model", "model.layers.0.self_attn.q_proj.weight", "[64, 64]", "128x128", "multiples of 128"});
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out"));
  config = testing::block_friendly_config();
  config.num_key_value_heads = 1;  // k and v: 64 rows
  config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3_block128);
  expect_error([&] { write_random_checkpoint(config, dir.path() / "out", {}); },
               {"model.layers.0.self_attn.k_proj.weight", "[64, 256]"});
  expect_error([&] { fp8_checkpoint_quantization(WeightFormat::bf16); }, {"bf16"});
}

// Bad block FP8 input: one line naming the tensor (the CLI exits 2 on it).
TEST(Fp8Checkpoint, BadBlockInputIsOneLineNamingTheTensor) {
  const ModelConfig config = testing::block_friendly_config();
  const std::string gate = "model.layers.0.mlp.gate_proj.weight", scale = gate + "_scale_inv";
  const std::string json = config_json_with(config, kBlockFp8);
  const Fp8Pair good = draw_fp8_pair(config, ScaleScope::block, "weight_scale_inv", 8);
  testing::ScratchDir dir;
  auto refused = [&](auto change, std::initializer_list<std::string> parts) {
    std::vector<RawTensor> tensors = good.fp8;
    change(tensors);
    write_raw_checkpoint(dir.path(), json, tensors);
    expect_error([&] { load_reference_weights(Checkpoint(dir.path()), load_model_config(dir.path())); }, parts);
  };
  refused([&](auto& t) { t.erase(std::find_if(t.begin(), t.end(), [&](const RawTensor& r) { return r.name == scale; })); },
          {"missing tensor '" + scale + "'", gate});
  // [I / 128, H / 128] = [4, 2]; the transposed [2, 4] holds as many scales.
  refused([&](auto& t) { find(t, scale).shape = {2, 4}; }, {"tensor '" + scale + "'", "shape [2, 4]", "[4, 2]"});
  refused([&](auto& t) { find(t, scale).shape = {4, 1}; find(t, scale).bytes.resize(16); },
          {"tensor '" + scale + "'", "shape [4, 1]", "[4, 2]"});
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    refused([&](auto& t) { std::memcpy(find(t, scale).bytes.data() + 4 * 5, &bad, 4); },
            {"tensor '" + scale + "'", "non-finite scale", "element 5"});
  }
  refused([&](auto& t) { find(t, gate).dtype = "F8_E5M2"; }, {"tensor '" + gate + "'", "F8_E5M2"});
}

// The decode plan's weight format: the blocks' quantized format wherever one loads FP8.
TEST(Fp8Checkpoint, BlockWeightFormatAndLoadOptions) {
  ModelConfig config = model_preset("tiny");
  const WeightLoadOptions plain, fp8{.quantize = WeightFormat::fp8_e4m3};
  EXPECT_EQ(block_weight_format(config, plain), WeightFormat::bf16);
  EXPECT_EQ(block_weight_format(config, fp8), WeightFormat::fp8_e4m3);
  EXPECT_NO_THROW(check_weight_load_options(config, fp8));
  expect_error([&] { check_weight_load_options(config, {.quantize_lm_head = true}); }, {"--quantize-lm-head", "--quantize fp8"});
  // Blocks need whole blocks: the tiny preset's 64-wide hidden size is not.
  const WeightLoadOptions blocks{.quantize = WeightFormat::fp8_e4m3_block128};
  expect_error([&] { check_weight_load_options(config, blocks); },
               {"--quantize fp8_e4m3_block128", "model.layers.0.self_attn.q_proj.weight", "[64, 64]", "128x128"});
  EXPECT_NO_THROW(check_weight_load_options(testing::block_friendly_config(), blocks));
  EXPECT_EQ(block_weight_format(testing::block_friendly_config(), blocks), WeightFormat::fp8_e4m3_block128);
  expect_error([&] { check_weight_load_options(testing::block_friendly_config(), {.quantize = WeightFormat::fp8_e4m3_block128,
                                                                                  .quantize_lm_head = true}); },
               {"lm_head.weight", "[40, 256]", "128x128"});
  config.tie_word_embeddings = true;
  expect_error([&] { check_weight_load_options(config, {.quantize = WeightFormat::fp8_e4m3, .quantize_lm_head = true}); },
               {"--quantize-lm-head", "ties"});
  config.tie_word_embeddings = false;
  config.quantization = fp8_checkpoint_quantization();
  EXPECT_EQ(block_weight_format(config, plain), WeightFormat::fp8_e4m3);
  expect_error([&] { check_weight_load_options(config, fp8); }, {"already quantized", "compressed-tensors"});
  // Every block projection in the ignore list: the blocks stay 16-bit.
  config.quantization.ignore = {"lm_head", "re:.*layers.*"};
  EXPECT_EQ(block_weight_format(config, plain), WeightFormat::bf16);
}

}  // namespace
}  // namespace deepfuse
