#include "cli/model_session.hpp"

#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse::cli {

namespace {

// Only the reference backend exists so far; "auto" will prefer CUDA once it is built.
void check_backend(const std::string& backend) {
  if (backend == "reference" || backend == "auto") return;
  DF_CHECK(backend != "cuda", "--backend cuda: the CUDA backend is not built yet; use --backend reference");
  throw Error("--backend '" + backend + "': unknown backend (reference, cuda, auto)");
}

}  // namespace

void add_model_options(CLI::App& command, ModelArgs& args) {
  command.add_option("--model", args.model_dir, "checkpoint directory (config.json + safetensors)")->required();
  command.add_option("--backend", args.backend, "reference | cuda | auto (default auto)");
  command.add_option("--prompt-ids", args.prompt_ids, "prompt token ids, e.g. 1,2,3")->delimiter(',');
  command.add_option("--prompt", args.prompt_text, "prompt text (needs the tokenizer)");
}

LoadedModel load_model_for_prompt(const ModelArgs& args, std::vector<int32_t>& prompt) {
  check_backend(args.backend);
  DF_CHECK(args.prompt_text.empty(),
           "--prompt: text prompts need the tokenizer, which is not built yet; pass token ids with --prompt-ids");
  DF_CHECK(!args.prompt_ids.empty(), "--prompt-ids: give at least one token id");
  LoadedModel model;
  model.config = load_model_config(args.model_dir);
  const ModelConfig& config = model.config;
  DF_CHECK(args.prompt_ids.size() <= static_cast<size_t>(config.max_position_embeddings),
           "--prompt-ids: prompt of " + std::to_string(args.prompt_ids.size()) +
               " tokens is longer than max_position_embeddings (" + std::to_string(config.max_position_embeddings) +
               ") in " + (std::filesystem::path(args.model_dir) / "config.json").string());
  prompt.clear();
  for (int64_t id : args.prompt_ids) {
    DF_CHECK(id >= 0 && id < config.vocab_size, "--prompt-ids: token id " + std::to_string(id) +
                                                    " is outside the vocabulary [0, " +
                                                    std::to_string(config.vocab_size) + ")");
    prompt.push_back(static_cast<int32_t>(id));
  }
  const Checkpoint checkpoint(args.model_dir);
  model.decoder = std::make_unique<reference::Decoder>(config, load_reference_weights(checkpoint, config));
  return model;
}

}  // namespace deepfuse::cli
