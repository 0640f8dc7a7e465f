#include "cli/model_session.hpp"

#include <iostream>
#include <iterator>

#include "cli/chat_prompt.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse::cli {

namespace {

namespace fs = std::filesystem;

// Only the reference backend exists so far; "auto" will prefer CUDA once it is built.
void check_backend(const std::string& backend) {
  if (backend == "reference" || backend == "auto") return;
  DF_CHECK(backend != "cuda", "--backend cuda: the CUDA backend is not built yet; use --backend reference");
  throw Error("--backend '" + backend + "': unknown backend (reference, cuda, auto)");
}

// The flag that carries the prompt, after checking exactly one was given.
std::string prompt_flag(const ModelArgs& args) {
  const int given = !args.prompt_ids.empty() + args.prompt_text.has_value() + args.chat_messages.has_value();
  DF_CHECK(given == 1, "give exactly one prompt: --prompt TEXT, --chat MESSAGES or --prompt-ids 1,2,3");
  return args.prompt_text ? "--prompt" : args.chat_messages ? "--chat" : "--prompt-ids";
}

std::optional<Tokenizer> load_tokenizer(const ModelArgs& args, const std::string& flag, TokenizerUse use) {
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

void add_model_options(CLI::App& command, ModelArgs& args) {
  command.add_option("--model", args.model_dir, "checkpoint directory (config.json + safetensors)")->required();
  command.add_option("--backend", args.backend, "reference | cuda | auto (default auto)");
  command.add_option("--prompt-ids", args.prompt_ids, "prompt token ids, e.g. 1,2,3")->delimiter(',');
  command.add_option("--prompt", args.prompt_text, "prompt text, tokenized with the model's tokenizer.json");
  command.add_option("--chat", args.chat_messages,
                     "chat messages (JSON array of {role, content} or 'role: text' lines; - reads stdin), "
                     "rendered with the chat template");
}

LoadedModel load_model_for_prompt(const ModelArgs& args, std::vector<int32_t>& prompt, TokenizerUse use) {
  check_backend(args.backend);
  const std::string flag = prompt_flag(args);
  LoadedModel model;
  model.config = load_model_config(args.model_dir);
  const ModelConfig& config = model.config;
  model.tokenizer = load_tokenizer(args, flag, use);
  const std::vector<int64_t> ids = prompt_to_ids(args, model.tokenizer);
  DF_CHECK(!ids.empty(), flag + ": the prompt has no tokens");
  DF_CHECK(ids.size() <= static_cast<size_t>(config.max_position_embeddings),
           flag + ": prompt of " + std::to_string(ids.size()) + " tokens is longer than max_position_embeddings (" +
               std::to_string(config.max_position_embeddings) + ") in " +
               (fs::path(args.model_dir) / "config.json").string());
  prompt.clear();
  for (int64_t id : ids) {
    DF_CHECK(id >= 0 && id < config.vocab_size, flag + ": token id " + std::to_string(id) +
                                                    " is outside the vocabulary [0, " +
                                                    std::to_string(config.vocab_size) + ")");
    prompt.push_back(static_cast<int32_t>(id));
  }
  const Checkpoint checkpoint(args.model_dir);
  model.decoder = std::make_unique<reference::Decoder>(config, load_reference_weights(checkpoint, config));
  return model;
}

}  // namespace deepfuse::cli
