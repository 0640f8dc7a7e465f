// `deepfuse generate`: a prompt (text, chat messages or ids) in, generated tokens streamed out as
// they are sampled (text when the model has a tokenizer, ids otherwise), then one line of counts
// and speed. Runs on the CPU reference decoder or the CUDA engine (one sequence, one token per
// step()).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "cli/commands.hpp"
#include "cli/model_session.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
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
SamplingParams resolve_sampling(const GenerateArgs& args, const GenerationDefaults& defaults) {
  const bool sample = defaults.do_sample.value_or(false);
  SamplingParams p;
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

// What the summary line reports.
struct GenerationResult {
  int generated = 0;
  double time_to_first_token_ms = 0;
  double decode_seconds = 0;  // from the first token to the last
};

using Clock = std::chrono::steady_clock;

double milliseconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

GenerationResult generate_on_reference(const LoadedModel& model, std::vector<int32_t> tokens,
                                       const SamplingParams& sampling, int budget,
                                       const std::vector<int32_t>& stops, TokenPrinter& printer) {
  const auto start = Clock::now();
  Clock::time_point first_token_at = start;
  reference::KvCache cache = model.decoder->new_cache();
  std::vector<float> logits = model.decoder->forward(tokens, cache);
  int generated = 0;
  for (; generated < budget; ++generated) {
    const size_t vocab = model.config.vocab_size;
    const std::span<const float> last(logits.data() + logits.size() - vocab, vocab);
    const int32_t next = reference::sample(last, sampling, tokens, static_cast<uint64_t>(generated));
    if (generated == 0) first_token_at = Clock::now();
    tokens.push_back(next);
    printer.print(next);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      ++generated;
      break;
    }
    if (generated + 1 < budget) logits = model.decoder->forward(std::span(&tokens.back(), 1), cache);
  }
  const auto end = Clock::now();
  return {generated, milliseconds_between(start, first_token_at), milliseconds_between(first_token_at, end) / 1e3};
}

// One sequence through the CUDA engine: every step() returns its next token, printed at once.
GenerationResult generate_on_engine(Engine& engine, const std::vector<int32_t>& prompt,
                                    const SamplingParams& sampling, int budget,
                                    const std::vector<int32_t>& stops, TokenPrinter& printer) {
  const auto start = Clock::now();
  Clock::time_point first_token_at = start;
  GenerationResult result;
  if (budget <= 0) return result;
  SequenceRequest request;
  request.prompt = prompt;
  request.sampling = sampling;
  request.max_new_tokens = budget;
  request.stop_ids = stops;
  const SequenceId sequence = engine.add_sequence(request);
  FinishReason finish = FinishReason::none;
  // A step always advances a running sequence; this bound only turns a stuck engine into an error.
  const size_t max_idle_steps = prompt.size() + 16;
  size_t idle_steps = 0;
  while (finish == FinishReason::none) {
    bool advanced = false;
    for (const StepToken& token : engine.step()) {
      if (token.sequence != sequence) continue;
      advanced = true;
      finish = token.finish;
      if (token.id < 0) continue;  // ended before sampling (KV cache full)
      if (result.generated == 0) first_token_at = Clock::now();
      printer.print(token.id);
      ++result.generated;
    }
    idle_steps = advanced ? 0 : idle_steps + 1;
    DF_CHECK(idle_steps < max_idle_steps, "cuda backend: the engine stopped producing tokens for the sequence");
  }
  const auto end = Clock::now();
  if (finish == FinishReason::kv_cache_full)
    std::fprintf(stderr, "\nnote: generation ended early: the KV cache is full (raise --kv-cache-mb)\n");
  result.time_to_first_token_ms = milliseconds_between(start, first_token_at);
  result.decode_seconds = milliseconds_between(first_token_at, end) / 1e3;
  return result;
}

// The sampling the backend runs. The cuda backend has no repetition penalty: asking for one is an
// error, while a checkpoint's generation_config.json default is dropped with a note.
SamplingParams backend_sampling(const GenerateArgs& args, const LoadedModel& model) {
  SamplingParams sampling = resolve_sampling(args, model.config.generation);
  if (model.backend != Backend::cuda || sampling.repetition_penalty == 1.0f) return sampling;
  DF_CHECK(!args.repetition_penalty,
           "--repetition-penalty: the cuda backend does not apply a repetition penalty; use --backend reference");
  std::fprintf(stderr, "note: generation_config.json's repetition_penalty %g is not applied on the cuda backend\n",
               sampling.repetition_penalty);
  sampling.repetition_penalty = 1.0f;
  return sampling;
}

int run_generate(const GenerateArgs& args) {
  std::vector<int32_t> prompt;
  LoadedModel model = prepare_model(args.model, prompt, TokenizerUse::whenever_present);
  const SamplingParams sampling = backend_sampling(args, model);
  const std::vector<int32_t> stops = args.ignore_eos ? std::vector<int32_t>{} : stop_ids(model);
  // Generation stops at the context length rather than running past what the model was built for.
  const int budget = std::min<int>(args.max_tokens, model.max_context - static_cast<int>(prompt.size()));
  load_weights(args.model, model);

  TokenPrinter printer(model.tokenizer);
  const GenerationResult result = model.engine
                                      ? generate_on_engine(*model.engine, prompt, sampling, budget, stops, printer)
                                      : generate_on_reference(model, prompt, sampling, budget, stops, printer);
  printer.finish();
  std::printf("\nprompt tokens: %zu, generated tokens: %d, time to first token: %.1f ms, decode: ", prompt.size(),
              result.generated, result.time_to_first_token_ms);
  if (result.generated > 1 && result.decode_seconds > 0)
    std::printf("%.1f tokens/s\n", (result.generated - 1) / result.decode_seconds);
  else
    std::printf("n/a tokens/s\n");
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
