// libFuzzer target over everything that parses untrusted checkpoint bytes: the safetensors header,
// config.json, generation_config.json and the sharded index. Each input goes through every parser;
// the only acceptable failure is a deepfuse::Error (any other exception, crash or sanitizer
// report is a bug).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/safetensors.hpp"

namespace {

template <typename Parse>
void expect_value_or_error(Parse parse) {
  try {
    parse();
  } catch (const deepfuse::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const std::string text(reinterpret_cast<const char*>(data), size);
  expect_value_or_error([&] {
    const deepfuse::SafetensorsHeader header = deepfuse::parse_safetensors(bytes, "fuzz.safetensors");
    for (const auto& tensor : header.tensors)  // what readers do next must stay in bounds
      if (header.data_start + tensor.data_end > size) __builtin_trap();
  });
  expect_value_or_error([&] {
    deepfuse::ModelConfig config = deepfuse::parse_model_config(text, "config.json");
    deepfuse::parse_generation_config(text, "generation_config.json", config);
  });
  expect_value_or_error([&] {
    deepfuse::ModelConfig config;
    deepfuse::parse_generation_config(text, "generation_config.json", config);
  });
  expect_value_or_error([&] { deepfuse::parse_safetensors_index(text, "model.safetensors.index.json"); });
  return 0;
}
