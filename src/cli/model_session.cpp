#include "cli/model_session.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/chat_prompt.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "dist/tensor_split.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse::cli {

namespace {

namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Exactly one model source; --arch must name a preset the engine can make.
void check_model_source(const ModelArgs& args) {
  DF_CHECK(args.random_weights || args.random_arch.empty(), "--arch needs --random-weights");
  DF_CHECK(!args.model_dir.empty() || args.random_weights,
           "give a model: --model DIR, or --random-weights --arch NAME");
  DF_CHECK(args.model_dir.empty() || !args.random_weights, "--model and --random-weights exclude each other");
  if (!args.random_weights) return;
  const std::vector<std::string> names = random_arch_names();
  DF_CHECK(!args.random_arch.empty(), "--random-weights needs --arch NAME (" + join(names) + ")");
  DF_CHECK(std::find(names.begin(), names.end(), args.random_arch) != names.end(),
           "--arch '" + args.random_arch + "': unknown architecture preset (" + join(names) + ")");
}

// Random weights are made on the GPU, so they run on the cuda backend only.
Backend choose_backend(const ModelArgs& args) {
  if (args.random_weights) {
    DF_CHECK(args.backend != "reference", "--random-weights runs on the cuda backend only, not --backend reference");
    DF_CHECK(args.backend == "auto" || args.backend == "cuda",
             "--backend '" + args.backend + "': unknown backend (reference, cuda, auto)");
    DF_CHECK(cuda_device_available(), "--random-weights: no CUDA device found on this machine (random weights are "
                                      "made on the GPU)");
    return Backend::cuda;
  }
  return resolve_backend(args.backend);
}

// Where the config came from, for error messages.
std::string config_source(const ModelArgs& args) {
  if (args.random_weights) return "--arch " + args.random_arch;
  return (fs::path(args.model_dir) / "config.json").string();
}

// The flag that carries the prompt, after checking exactly one was given.
std::string prompt_flag(const ModelArgs& args) {
  const int given = !args.prompt_ids.empty() + args.prompt_text.has_value() + args.chat_messages.has_value();
  DF_CHECK(given == 1, "give exactly one prompt: --prompt TEXT, --chat MESSAGES or --prompt-ids 1,2,3");
  return args.prompt_text ? "--prompt" : args.chat_messages ? "--chat" : "--prompt-ids";
}

std::optional<Tokenizer> load_tokenizer(const ModelArgs& args, const std::string& flag, TokenizerUse use) {
  if (args.random_weights) {
    DF_CHECK(flag == "--prompt-ids", flag + ": --random-weights models have no tokenizer; pass --prompt-ids");
    return std::nullopt;
  }
  const fs::path path = fs::path(args.model_dir) / "tokenizer.json";
  if (flag == "--prompt-ids") {
    if (use == TokenizerUse::when_prompt_is_text || !fs::exists(path)) return std::nullopt;
    return Tokenizer::from_directory(args.model_dir);
  }
  DF_CHECK(fs::exists(path), flag + ": " + path.string() +
                                 " not found; text prompts need the model's tokenizer (or pass ids with --prompt-ids)");
  return Tokenizer::from_directory(args.model_dir);
}

std::string chat_messages_text(const std::string& value) {
  if (value != "-") return value;
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int64_t> prompt_to_ids(const ModelArgs& args, const std::optional<Tokenizer>& tokenizer) {
  std::vector<TokenId> ids;
  if (args.prompt_text) {
    ids = tokenizer->encode(*args.prompt_text, /*add_special_tokens=*/true);
  } else if (args.chat_messages) {
    const std::string rendered =
        render_chat(*tokenizer, chat_messages_text(*args.chat_messages), /*add_generation_prompt=*/true, args.model_dir);
    ids = tokenizer->encode_rendered_chat(rendered);  // the template decides about BOS
  } else {
    return args.prompt_ids;
  }
  return {ids.begin(), ids.end()};
}

}  // namespace

void add_checkpoint_options(CLI::App& command, ModelArgs& args) {
  command.add_option("--model", args.model_dir, "checkpoint directory (config.json + safetensors)");
  command.add_option("--backend", args.backend, "reference | cuda | auto (default auto: cuda when a GPU is present)");
  add_engine_options(command, args.engine);
}

void add_model_options(CLI::App& command, ModelArgs& args) {
  add_checkpoint_options(command, args);
  command.add_flag("--random-weights", args.random_weights,
                   "no checkpoint: seeded random weights made on the GPU (cuda backend), with --arch");
  command.add_option("--arch", args.random_arch, "the architecture preset for --random-weights (" +
                                                     join(random_arch_names()) + ")");
  command.add_option("--prompt-ids", args.prompt_ids, "prompt token ids, e.g. 1,2,3")->delimiter(',');
  command.add_option("--prompt", args.prompt_text, "prompt text, tokenized with the model's tokenizer.json");
  command.add_option("--chat", args.chat_messages,
                     "chat messages (JSON array of {role, content} or 'role: text' lines; - reads stdin), "
                     "rendered with the chat template");
}

LoadedModel resolve_model(const ModelArgs& args) {
  check_model_source(args);
  LoadedModel model;
  model.backend = choose_backend(args);
  const EngineOptions engine_flags = engine_options(args.engine);  // bad flag values fail here, before any work
  model.config = args.random_weights ? random_arch_config(args.random_arch) : load_model_config(args.model_dir);
  const ModelConfig& config = model.config;
  // auto on a GPU: models the kernels cannot run fall back to the reference backend.
  if (args.backend == "auto" && model.backend == Backend::cuda)
    model.cuda_fallback = cuda_unsupported_reason(config, args.engine);
  if (!model.cuda_fallback.empty()) model.backend = Backend::reference;
  check_quantize_backend(args.engine, model.backend);
  if (engine_flags.tensor_parallel > 1) {
    DF_CHECK(model.backend == Backend::cuda, "--tp " + std::to_string(engine_flags.tensor_parallel) +
                                                 " needs the cuda backend (the reference backend runs on one CPU)");
    const std::string why = dist::why_not_splittable(config, engine_flags.tensor_parallel);
    DF_CHECK(why.empty(), "cannot split " + config_source(args) + " over --tp " +
                              std::to_string(engine_flags.tensor_parallel) + " GPUs: " + why);
  }
  model.max_context = config.max_position_embeddings;
  if (model.backend == Backend::cuda && engine_flags.max_context > 0)
    model.max_context = std::min(model.max_context, engine_flags.max_context);
  return model;
}

void print_backend_fallback(const LoadedModel& model) {
  if (!model.cuda_fallback.empty())
    std::fprintf(stderr, "note: %s has no CUDA kernels; running on the reference backend\n",
                 model.cuda_fallback.c_str());
}

LoadedModel prepare_model(const ModelArgs& args, std::vector<int32_t>& prompt, TokenizerUse use) {
  LoadedModel model = resolve_model(args);
  const std::string flag = prompt_flag(args);
  const ModelConfig& config = model.config;
  model.tokenizer = load_tokenizer(args, flag, use);
  const std::vector<int64_t> ids = prompt_to_ids(args, model.tokenizer);
  DF_CHECK(!ids.empty(), flag + ": the prompt has no tokens");
  DF_CHECK(ids.size() <= static_cast<size_t>(config.max_position_embeddings),
           flag + ": prompt of " + std::to_string(ids.size()) + " tokens is longer than max_position_embeddings (" +
               std::to_string(config.max_position_embeddings) + ") in " + config_source(args));
  DF_CHECK(ids.size() <= static_cast<size_t>(model.max_context),
           flag + ": prompt of " + std::to_string(ids.size()) + " tokens is longer than --max-context (" +
               std::to_string(model.max_context) + ")");
  prompt.clear();
  for (int64_t id : ids) {
    DF_CHECK(id >= 0 && id < config.vocab_size, flag + ": token id " + std::to_string(id) +
                                                    " is outside the vocabulary [0, " +
                                                    std::to_string(config.vocab_size) + ")");
    prompt.push_back(static_cast<int32_t>(id));
  }
  // Said only now that every input passed, so an input error stays the one line on stderr.
  print_backend_fallback(model);
  return model;
}

void load_weights(const ModelArgs& args, LoadedModel& model) {
  if (model.backend == Backend::reference) {
    const Checkpoint checkpoint(args.model_dir);
    model.decoder = std::make_unique<reference::Decoder>(
        model.config, load_reference_weights(checkpoint, model.config, weight_load_options(args.engine)));
    return;
  }
  const EngineOptions options = engine_options(args.engine);
  if (args.random_weights) {
    model.engine = std::make_unique<Engine>(Engine::with_random_weights(model.config, options, /*seed=*/0));
    print_plan_notice(*model.engine);
    return;
  }
  try {
    model.engine = std::make_unique<Engine>(Engine::from_checkpoint(args.model_dir, options, stderr_progress_bar()));
    print_plan_notice(*model.engine);
  } catch (...) {
    clear_progress_bar();
    throw;
  }
}

std::vector<float> score_logits(LoadedModel& model, std::span<const int32_t> ids) {
  if (model.engine) return model.engine->score(ids, static_cast<int>(ids.size()));
  DF_CHECK(model.decoder != nullptr, "score: the model's weights are not loaded");
  reference::KvCache cache = model.decoder->new_cache();
  return model.decoder->forward(ids, cache);
}

}  // namespace deepfuse::cli
