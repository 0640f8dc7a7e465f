// `deepfuse generate`: a prompt (text, chat messages or ids) in, generated tokens streamed out as
// they are sampled (text when the model has a tokenizer, ids otherwise), then one line of counts
// and speed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "cli/model_session.hpp"
#include "deepfuse/reference.hpp"

namespace deepfuse::cli {

namespace {

struct GenerateArgs {
  ModelArgs model;
  int max_tokens = 32;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
  bool ignore_eos = false;
};

// Flags win; otherwise generation_config.json's values when it asks to sample; otherwise greedy.
reference::SamplingParams resolve_sampling(const GenerateArgs& args, const GenerationDefaults& defaults) {
  const bool sample = defaults.do_sample.value_or(false);
  reference::SamplingParams p;
  p.temperature = args.temperature.value_or(sample ? defaults.temperature.value_or(1.0f) : 0.0f);
  p.top_k = args.top_k.value_or(sample ? defaults.top_k.value_or(50) : 0);  // transformers' default 50
  p.top_p = args.top_p.value_or(sample ? defaults.top_p.value_or(1.0f) : 1.0f);
  p.min_p = args.min_p.value_or(sample ? defaults.min_p.value_or(0.0f) : 0.0f);
  p.repetition_penalty = args.repetition_penalty.value_or(defaults.repetition_penalty.value_or(1.0f));
  p.seed = args.seed;
  return p;
}

// Every id that ends generation: the config's EOS (generation_config.json's when it names any)
// and the tokenizer's stop tokens.
std::vector<int32_t> stop_ids(const LoadedModel& model) {
  const ModelConfig& config = model.config;
  std::vector<int32_t> stops =
      config.generation.eos_token_ids.empty() ? config.eos_token_ids : config.generation.eos_token_ids;
  if (model.tokenizer)
    for (const TokenId id : model.tokenizer->stop_ids())
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  return stops;
}

// Writes tokens to stdout as they come: their text through a StreamDecoder (never half a UTF-8
// character; special tokens left out) when there is a tokenizer, space-separated ids otherwise.
class TokenPrinter {
 public:
  explicit TokenPrinter(const std::optional<Tokenizer>& tokenizer) {
    if (tokenizer) stream_.emplace(*tokenizer, /*skip_special_tokens=*/true);
  }
  void print(int32_t id) {
    if (stream_) write(stream_->push(id));
    else write((printed_any_ ? " " : "") + std::to_string(id));
    printed_any_ = true;
  }
  // Whatever the stream still holds back (an incomplete character at the very end).
  void finish() {
    if (stream_) write(stream_->flush());
  }

 private:
  static void write(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  std::optional<StreamDecoder> stream_;
  bool printed_any_ = false;
};

int run_generate(const GenerateArgs& args) {
  std::vector<int32_t> tokens;
  const LoadedModel model = load_model_for_prompt(args.model, tokens, TokenizerUse::whenever_present);
  const ModelConfig& config = model.config;
  const reference::SamplingParams sampling = resolve_sampling(args, config.generation);
  const std::vector<int32_t> stops = stop_ids(model);
  TokenPrinter printer(model.tokenizer);
  const size_t prompt_tokens = tokens.size();
  // Generation stops at the model's context length rather than running past what it was built for.
  const int budget = std::min<int>(args.max_tokens, config.max_position_embeddings - static_cast<int>(prompt_tokens));

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point first_token_at = start;
  reference::KvCache cache = model.decoder->new_cache();
  std::vector<float> logits = model.decoder->forward(tokens, cache);
  int generated = 0;
  for (; generated < budget; ++generated) {
    const size_t vocab = config.vocab_size;
    const std::span<const float> last(logits.data() + logits.size() - vocab, vocab);
    const int32_t next = reference::sample(last, sampling, tokens, static_cast<uint64_t>(generated));
    if (generated == 0) first_token_at = Clock::now();
    tokens.push_back(next);
    printer.print(next);
    if (!args.ignore_eos && std::find(stops.begin(), stops.end(), next) != stops.end()) {
      ++generated;
      break;
    }
    if (generated + 1 < budget) logits = model.decoder->forward(std::span(&tokens.back(), 1), cache);
  }
  printer.finish();
  const auto end = Clock::now();
  const double ttft_ms = std::chrono::duration<double, std::milli>(first_token_at - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token_at).count();
  std::printf("\nprompt tokens: %zu, generated tokens: %d, time to first token: %.1f ms, decode: ", prompt_tokens,
              generated, ttft_ms);
  if (generated > 1 && decode_s > 0) std::printf("%.1f tokens/s\n", (generated - 1) / decode_s);
  else std::printf("n/a tokens/s\n");
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("generate", "Generate text (or token ids) from a prompt, streamed as it comes");
  auto args = std::make_shared<GenerateArgs>();
  add_model_options(*command, args->model);
  command->add_option("--max-tokens", args->max_tokens, "tokens to generate (default 32)")->check(CLI::PositiveNumber);
  command->add_option("--temperature", args->temperature, "0: greedy (default from generation_config.json)");
  command->add_option("--top-k", args->top_k, "keep the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  command->add_option("--top-p", args->top_p, "nucleus sampling threshold (1: off)")->check(CLI::Range(0.0, 1.0));
  command->add_option("--min-p", args->min_p, "drop tokens below min-p x the best (0: off)")->check(CLI::Range(0.0, 1.0));
  command->add_option("--repetition-penalty", args->repetition_penalty, "HF repetition penalty (1: off)")
      ->check(CLI::PositiveNumber);
  command->add_option("--seed", args->seed, "sampling seed (default 0)");
  command->add_flag("--ignore-eos", args->ignore_eos, "keep generating past end-of-sequence and stop tokens");
  command->callback([args, &action] { action = [args] { return run_generate(*args); }; });
}

}  // namespace deepfuse::cli
