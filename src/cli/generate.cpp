// `deepfuse generate`: a prompt (text, chat messages or ids) in, generated tokens streamed out as
// they are sampled (text when the model has a tokenizer, ids otherwise), then one line of counts
// and speed. Runs on the CPU reference decoder or the CUDA engine (one sequence, one token per
// step(), or with --speculative the tokens a verify step emits; on the reference decoder the same).
#include <algorithm>
#include <cstdio>

#include "cli/commands.hpp"
#include "cli/generation.hpp"
#include "cli/model_session.hpp"

namespace deepfuse::cli {

namespace {

struct GenerateArgs {
  ModelArgs model;
  SamplingArgs sampling;
  int max_tokens = 32;
  std::string speculative = choice_name(kDefaultSpeculative);
};

int run_generate(const GenerateArgs& args) {
  std::vector<int32_t> prompt;
  LoadedModel model = prepare_model(args.model, prompt, TokenizerUse::whenever_present);
  const SamplingParams sampling = backend_sampling(args.sampling, model);
  const std::vector<int32_t> stops = stop_ids(args.sampling, model);
  const SpeculativeChoice speculative = speculative_choice(args.speculative);
  // Generation stops at the context length rather than running past what the model was built for.
  const int budget = std::min<int>(args.max_tokens, model.max_context - static_cast<int>(prompt.size()));
  ModelArgs model_args = args.model;
  model_args.engine.speculative = speculative;  // the CUDA engine verifies drafts itself
  load_weights(model_args, model);

  TokenPrinter printer(model.tokenizer);
  Speculation speculation;
  speculation.choice = speculative;
  const GenerationResult result = generate_tokens(
      model, prompt, sampling, budget, stops,
      [&](int32_t id) {
        printer.print(id);
        return true;
      },
      &speculation);
  printer.finish();
  std::printf("\nprompt tokens: %zu, generated tokens: %d, time to first token: %.1f ms, decode: ", prompt.size(),
              result.generated, result.time_to_first_token_ms);
  if (result.generated > 1 && result.decode_seconds > 0)
    std::printf("%.1f tokens/s\n", (result.generated - 1) / result.decode_seconds);
  else
    std::printf("n/a tokens/s\n");
  if (speculative != SpeculativeChoice::off)
    std::printf("speculative %s: %ld of %ld draft tokens accepted\n", choice_name(speculative), result.accepted,
                result.drafted);
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("generate", "Generate text (or token ids) from a prompt, streamed as it comes");
  auto args = std::make_shared<GenerateArgs>();
  add_model_options(*command, args->model);
  command->add_option("--max-tokens", args->max_tokens, "tokens to generate (default 32)")->check(CLI::PositiveNumber);
  add_sampling_options(*command, args->sampling);
  add_speculative_option(*command, args->speculative);
  command->callback([args, &action] { action = [args] { return run_generate(*args); }; });
}

}  // namespace deepfuse::cli
