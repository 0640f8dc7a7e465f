// FP8 checkpoints for tests, written tensor by tensor: compressed-tensors per channel and per
// tensor, and fp8 128x128 blocks, each with its dequantized F32 twin (tests/model, tests/runtime).
#pragma once

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepfuse/bf16.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "core/float8.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse::testing {

inline std::string compressed_tensors(const std::string& weights, const std::string& extra = "",
                               const std::string& input = R"({"num_bits": 8, "type": "float", "strategy": "token",
                                                              "dynamic": true, "symmetric": true})") {
  return R"({"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": )" +
         weights + R"(, "input_activations": )" + input + R"(}}, "ignore": ["lm_head"], "kv_cache_scheme": null)" +
         extra + "}";
}

inline const std::string kChannelWeights =
    R"({"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false, "symmetric": true})";

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

inline void write_raw_checkpoint(const std::filesystem::path& dir, const std::string& config_json,
                          const std::vector<RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  const std::string text = header.dump();
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>(text.size() >> (8 * i) & 0xff);
  testing::write_file(dir / "config.json", config_json);
  testing::write_file(dir / "model.safetensors", image + text + data);
}

template <typename T>
inline std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

inline std::string config_json_with(const ModelConfig& config, const std::string& quantization_config) {
  nlohmann::json j = nlohmann::json::parse(model_config_json(config, SafetensorsDType::F32));
  if (!quantization_config.empty()) j["quantization_config"] = nlohmann::json::parse(quantization_config);
  return j.dump();
}

// One FP8 checkpoint and its dequantized F32 twin, drawn together.
struct Fp8Pair {
  std::vector<RawTensor> fp8, f32;
};

inline Fp8Pair draw_fp8_pair(const ModelConfig& config, ScaleScope scope, const std::string& scale_name, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Fp8Pair pair;
  for (const ExpectedTensor& t : expected_tensors(config)) {
    const bool quantized = t.spec->formats.has(WeightFormat::fp8_e4m3) && t.spec->role != TensorRole::lm_head;
    int64_t count = 1;
    for (int64_t e : t.shape) count *= e;
    if (!quantized) {
      std::vector<float> values(static_cast<size_t>(count));
      for (float& v : values) v = t.spec->init == TensorInit::norm ? 1.0f + 0.1f * uniform(rng) : 0.3f * uniform(rng);
      pair.fp8.push_back({t.name, "F32", t.shape, bytes_of(values)});
      pair.f32.push_back(pair.fp8.back());
      continue;
    }
    const int64_t rows = t.shape[0], columns = t.shape[1];
    std::vector<uint8_t> codes(static_cast<size_t>(count));
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % 0x7f) | (rng() % 2 ? 0x80 : 0);  // never NaN
    std::vector<int64_t> scale_shape = scope == ScaleScope::channel ? std::vector<int64_t>{rows, 1}
                                       : scope == ScaleScope::tensor ? std::vector<int64_t>{1}
                                                                     : std::vector<int64_t>{rows / 128, columns / 128};
    // BF16 scales (as compressed-tensors writes them) for per channel, F32 otherwise.
    const bool bf16_scales = scope == ScaleScope::channel;
    std::vector<float> scales(static_cast<size_t>(scale_shape.empty() ? 1 : scale_shape[0] * (scale_shape.size() > 1 ? scale_shape[1] : 1)));
    std::vector<uint16_t> scale_bits(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
      scale_bits[i] = float_to_bf16_bits(std::ldexp(1.0f + 0.5f * uniform(rng), -9));
      scales[i] = bf16_scales ? bf16_bits_to_float(scale_bits[i]) : std::ldexp(1.0f + 0.5f * uniform(rng), -9);
    }
    std::vector<float> dequantized(static_cast<size_t>(count));
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < columns; ++i) {
        const float s = scope == ScaleScope::channel ? scales[o]
                        : scope == ScaleScope::tensor ? scales[0]
                                                      : scales[(o / 128) * (columns / 128) + i / 128];
        dequantized[o * columns + i] = float8_e4m3_to_float(codes[o * columns + i]) * s;
      }
    pair.fp8.push_back({t.name, "F8_E4M3", t.shape, bytes_of(codes)});
    const std::string scale_tensor = t.name.substr(0, t.name.size() - 6) + scale_name;
    pair.fp8.push_back({scale_tensor, bf16_scales ? "BF16" : "F32", scale_shape,
                        bf16_scales ? bytes_of(scale_bits) : bytes_of(scales)});
    pair.f32.push_back({t.name, "F32", t.shape, bytes_of(dequantized)});
  }
  return pair;
}

inline const std::string kBlockFp8 = R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["lm_head"]})";

struct Fp8Case {
  const char* name;
  ScaleScope scope;
  std::string quantization_config, scale_name;
};

inline std::vector<Fp8Case> fp8_cases() {
  return {{"compressed_tensors_channel", ScaleScope::channel, compressed_tensors(kChannelWeights), "weight_scale"},
          {"compressed_tensors_tensor", ScaleScope::tensor,
           compressed_tensors(R"({"num_bits": 8, "type": "float", "strategy": "tensor"})"), "weight_scale"},
          {"fp8_block", ScaleScope::block, kBlockFp8, "weight_scale_inv"}};
}


}  // namespace deepfuse::testing
