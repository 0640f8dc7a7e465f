// Helpers for model-layer tests: hand-made safetensors images and scratch directories.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"

namespace deepfuse::testing {

// 8-byte little-endian length (the header's own unless overridden), the header, then `data_bytes`
// bytes of data.
inline std::string safetensors_image(const std::string& header, size_t data_bytes,
                                     uint64_t header_length = UINT64_MAX) {
  if (header_length == UINT64_MAX) header_length = header.size();
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>(header_length >> (8 * i) & 0xff);
  return image + header + std::string(data_bytes, '\x01');
}

inline std::span<const std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

inline void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// A fresh directory under the system temp dir, removed with the object.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("deepfuse_" + std::string(test->test_suite_name()) + "_" + test->name() + "_" +
             std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs `body`, expecting a deepfuse::Error whose one-line message contains every `part`.
template <typename Body>
void expect_error(Body body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected a deepfuse::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

// A checkpoint directory for `config` whose model.safetensors holds exactly `tensors`, in `dtype`
// except those `dtype_of` names.
inline void write_checkpoint_with(const std::filesystem::path& dir, const ModelConfig& config,
                           const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors,
                           const std::string& all_dtype = "F32",
                           const std::map<std::string, std::string>& dtype_of = {}) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    const std::string dtype = dtype_of.count(name) ? dtype_of.at(name) : all_dtype;
    uint64_t bytes = dtype == "I32" || dtype == "F32" ? 4 : dtype.rfind("F8", 0) == 0 ? 1 : 2;
    for (int64_t e : shape) bytes *= e;
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  write_file(dir / "config.json", model_config_json(config, SafetensorsDType::F32));
  write_file(dir / "model.safetensors", safetensors_image(header.dump(), offset));
}

// A one-block Llama whose projections are all whole 128x128 blocks (FP8 block scales, and two
// tensor-parallel ranks of them); its 40-row lm_head is not, and stays 16-bit in FP8 tests.
inline ModelConfig block_friendly_config() {
  ModelConfig c{.architecture = Architecture::llama, .vocab_size = 40, .hidden_size = 256, .intermediate_size = 512,
                .num_hidden_layers = 1, .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 64,
                .max_position_embeddings = 64, .rms_norm_eps = 1e-5};
  c.rope.head_dim = c.head_dim;
  return c;
}

inline std::vector<std::pair<std::string, std::vector<int64_t>>> expected_as_pairs(const ModelConfig& config) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> pairs;
  for (const auto& t : expected_tensors(config)) pairs.emplace_back(t.name, t.shape);
  return pairs;
}

}  // namespace deepfuse::testing
