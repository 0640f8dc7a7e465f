// What generate and score share: the prompt (ids, text or chat messages) turned into token ids,
// and the model directory loaded onto a backend, every input checked before any work.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {

// The options every model-running command takes. Exactly one of the three prompts is given.
struct ModelArgs {
  std::string model_dir;
  std::string backend = "auto";
  std::vector<int64_t> prompt_ids;
  std::optional<std::string> prompt_text;    // tokenized with the directory's tokenizer.json
  std::optional<std::string> chat_messages;  // rendered through its chat template; "-" reads stdin
};

// Adds --model, --backend, --prompt-ids, --prompt and --chat to `command`.
void add_model_options(CLI::App& command, ModelArgs& args);

// A checkpoint ready to run: its config, its tokenizer when loaded, and the backend's decoder.
struct LoadedModel {
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<reference::Decoder> decoder;
};

// Whether an ids-only prompt still loads the tokenizer (when the directory has one): generate
// does, to print text; score does not need it.
enum class TokenizerUse { when_prompt_is_text, whenever_present };

// Checks the backend, turns the prompt into ids and checks them against the config (length, id
// range) before touching the weights, then loads them: every input error surfaces before any work
// or output.
LoadedModel load_model_for_prompt(const ModelArgs& args, std::vector<int32_t>& prompt,
                                  TokenizerUse use = TokenizerUse::when_prompt_is_text);

}  // namespace deepfuse::cli
