// Access to the parity fixtures made by scripts/fixtures/make_tokenizer_fixtures.py with the real Hugging
// Face tokenizers library (tests/fixtures/tokenizers/<name>/).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse::testing {

inline std::filesystem::path tokenizer_fixture_dir(const std::string& name) {
  return std::filesystem::path(DEEPFUSE_TOKENIZER_FIXTURES) / name;
}

inline nlohmann::ordered_json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::ordered_json::parse(text.str());
}

inline const std::vector<std::string>& tokenizer_fixture_names() {
  static const std::vector<std::string> names = {"llama3_bytelevel", "qwen2_bytelevel", "llama2_sentencepiece",
                                                 "mistral_metaspace"};
  return names;
}

}  // namespace deepfuse::testing
