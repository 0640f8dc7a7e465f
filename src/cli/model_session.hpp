// What generate and score share: the model directory loaded onto a backend, and prompt checks.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/reference_decoder.hpp"

namespace deepfuse::cli {

// The options every model-running command takes.
struct ModelArgs {
  std::string model_dir;
  std::string backend = "auto";
  std::vector<int64_t> prompt_ids;
  std::string prompt_text;  // needs the tokenizer; rejected with a clear message until it lands
};

// Adds --model, --backend, --prompt-ids and --prompt to `command`.
void add_model_options(CLI::App& command, ModelArgs& args);

// A checkpoint ready to run: its config and the backend's decoder.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<reference::Decoder> decoder;
};

// Checks the backend name and the prompt against the config (length, id range) before touching
// the weights, then loads them: every input error surfaces before any work or output.
LoadedModel load_model_for_prompt(const ModelArgs& args, std::vector<int32_t>& prompt);

}  // namespace deepfuse::cli
