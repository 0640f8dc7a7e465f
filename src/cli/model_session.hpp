// What generate and score share: the prompt (ids, text or chat messages) turned into token ids,
// and the model (a checkpoint directory, or random weights of a named architecture on the GPU)
// loaded onto a backend, every input checked before any work.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/engine_options.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {

// The options every model-running command takes. The model is --model DIR or --random-weights
// --arch NAME; exactly one of the three prompts is given.
struct ModelArgs {
  std::string model_dir;
  bool random_weights = false;
  std::string random_arch;                   // one of random_arch_names()
  std::string backend = "auto";
  EngineArgs engine;
  std::vector<int64_t> prompt_ids;
  std::optional<std::string> prompt_text;    // tokenized with the directory's tokenizer.json
  std::optional<std::string> chat_messages;  // rendered through its chat template; "-" reads stdin
};

// Adds --model, --random-weights, --arch, --backend, the prompt flags (--prompt-ids, --prompt,
// --chat) and the CUDA engine's flags to `command`.
void add_model_options(CLI::App& command, ModelArgs& args);

// Adds --model, --backend and the CUDA engine's flags alone (chat: a checkpoint, no prompt flags).
void add_checkpoint_options(CLI::App& command, ModelArgs& args);

// A model ready to run: its config, its tokenizer when loaded, the backend, and once the
// weights are loaded, that backend's decoder (reference) or engine (cuda).
struct LoadedModel {
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  Backend backend = Backend::reference;
  int max_context = 0;  // longest sequence the backend runs, prompt and generated tokens together
  std::unique_ptr<reference::Decoder> decoder;
  std::unique_ptr<Engine> engine;
  // Under --backend auto on a GPU, why the kernels cannot run this model (it then runs on the
  // reference backend); empty otherwise.
  std::string cuda_fallback;
};

// Whether an ids-only prompt still loads the tokenizer (when the directory has one): generate
// does, to print text; score does not need it.
enum class TokenizerUse { when_prompt_is_text, whenever_present };

// Step 1, no weights touched: resolves the backend, reads the config, turns the prompt into ids
// and checks them (length, id range), so every input error surfaces before any work or output.
LoadedModel prepare_model(const ModelArgs& args, std::vector<int32_t>& prompt,
                          TokenizerUse use = TokenizerUse::when_prompt_is_text);

// Step 1 without a prompt: the model source checked, the backend resolved, the config read and
// the tensor-parallel split checked (prepare_model's first part; chat loads the tokenizer itself).
LoadedModel resolve_model(const ModelArgs& args);

// The note on stderr when --backend auto fell back to the reference backend (model.cuda_fallback).
void print_backend_fallback(const LoadedModel& model);

// Step 2: loads the weights onto the backend prepare_model chose (the CUDA engine draws a
// progress bar on a terminal's stderr while it loads).
void load_weights(const ModelArgs& args, LoadedModel& model);

// Teacher-forced logits [ids.size(), vocab] of `ids` on whichever backend `model` runs.
std::vector<float> score_logits(LoadedModel& model, std::span<const int32_t> ids);

}  // namespace deepfuse::cli
