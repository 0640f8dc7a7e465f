#include "cli/generation.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "speculative/reference_sequence.hpp"

namespace deepfuse::cli {

namespace {

// Flags win; otherwise generation_config.json's values when it asks to sample; otherwise greedy.
SamplingParams resolve_sampling(const SamplingArgs& args, const GenerationDefaults& defaults) {
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

using Clock = std::chrono::steady_clock;

double milliseconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

bool is_stop(const std::vector<int32_t>& stops, int32_t id) {
  return std::find(stops.begin(), stops.end(), id) != stops.end();
}

GenerationResult generate_on_reference(const LoadedModel& model, const std::vector<int32_t>& prompt,
                                       const SamplingParams& sampling, int budget,
                                       const std::vector<int32_t>& stops, const OnToken& on_token,
                                       Speculation* speculation) {
  const auto start = Clock::now();
  Clock::time_point first_token_at = start;
  GenerationResult result;
  std::optional<speculative::SequenceDrafter> drafter;
  if (speculation && speculation->choice != SpeculativeChoice::off)
    drafter.emplace(speculation->choice, speculative::DrafterOptions{}, &speculation->cache);
  speculative::ReferenceSequence sequence(*model.decoder, prompt, sampling, drafter ? &*drafter : nullptr);
  // A step emits one token, or a verify's accepted drafts and one more.
  for (bool done = budget <= 0; !done;) {
    for (const int32_t id : sequence.step(budget - result.generated)) {
      if (result.generated == 0) first_token_at = Clock::now();
      ++result.generated;
      result.stopped = !on_token(id);
      done = result.stopped || is_stop(stops, id) || result.generated == budget;
      if (done) break;
    }
  }
  result.drafted = sequence.drafted();
  result.accepted = sequence.accepted();
  if (speculation && speculation->choice == SpeculativeChoice::suffix)
    speculation->cache.add(prompt, std::span(sequence.tokens()).subspan(prompt.size(), result.generated));
  const auto end = Clock::now();
  result.time_to_first_token_ms = milliseconds_between(start, first_token_at);
  result.decode_seconds = milliseconds_between(first_token_at, end) / 1e3;
  return result;
}

// One sequence through the CUDA engine: every step() returns its next token, handed on at once.
GenerationResult generate_on_engine(Engine& engine, const std::vector<int32_t>& prompt,
                                    const SamplingParams& sampling, int budget,
                                    const std::vector<int32_t>& stops, const OnToken& on_token) {
  const auto start = Clock::now();
  Clock::time_point first_token_at = start;
  GenerationResult result;
  if (budget <= 0) return result;
  SequenceRequest request;
  request.prompt = prompt;
  request.sampling = sampling;
  request.max_new_tokens = budget;
  request.stop_ids = stops;
  const Engine::SpeculativeCounts counts_before = engine.speculative_counts();
  const SequenceId sequence = engine.add_sequence(request);
  FinishReason finish = FinishReason::none;
  // A step always advances a running sequence; this bound only turns a stuck engine into an error.
  const size_t max_idle_steps = prompt.size() + 16;
  size_t idle_steps = 0;
  while (finish == FinishReason::none && !result.stopped) {
    bool advanced = false;
    for (const StepToken& token : engine.step()) {
      if (token.sequence != sequence || result.stopped) continue;
      advanced = true;
      finish = token.finish;
      if (token.id < 0) continue;  // ended before sampling (KV cache full)
      if (result.generated == 0) first_token_at = Clock::now();
      ++result.generated;
      result.stopped = !on_token(token.id);
    }
    idle_steps = advanced ? 0 : idle_steps + 1;
    DF_CHECK(idle_steps < max_idle_steps, "cuda backend: the engine stopped producing tokens for the sequence");
  }
  // Stopped by the caller while still running: its pages go back now, not when it would have ended.
  if (finish == FinishReason::none) engine.remove_sequence(sequence);
  const Engine::SpeculativeCounts counts = engine.speculative_counts();  // EngineOptions::speculative
  result.drafted = static_cast<long>(counts.draft_tokens - counts_before.draft_tokens);
  result.accepted = static_cast<long>(counts.accepted_draft_tokens - counts_before.accepted_draft_tokens);
  const auto end = Clock::now();
  if (finish == FinishReason::kv_cache_full)
    std::fprintf(stderr, "\nnote: generation ended early: the KV cache is full (raise --kv-cache-mb)\n");
  result.time_to_first_token_ms = milliseconds_between(start, first_token_at);
  result.decode_seconds = milliseconds_between(first_token_at, end) / 1e3;
  return result;
}

}  // namespace

void add_sampling_options(CLI::App& command, SamplingArgs& args) {
  command.add_option("--temperature", args.temperature, "0: greedy (default from generation_config.json)");
  command.add_option("--top-k", args.top_k, "keep the k most likely tokens (0: off)")->check(CLI::NonNegativeNumber);
  command.add_option("--top-p", args.top_p, "nucleus sampling threshold (1: off)")->check(CLI::Range(0.0, 1.0));
  command.add_option("--min-p", args.min_p, "drop tokens below min-p x the best (0: off)")->check(CLI::Range(0.0, 1.0));
  command.add_option("--repetition-penalty", args.repetition_penalty, "HF repetition penalty (1: off)")
      ->check(CLI::PositiveNumber);
  command.add_option("--seed", args.seed, "sampling seed (default 0)");
  command.add_flag("--ignore-eos", args.ignore_eos, "keep generating past end-of-sequence and stop tokens");
}

SamplingParams backend_sampling(const SamplingArgs& args, const LoadedModel& model) {
  SamplingParams sampling = resolve_sampling(args, model.config.generation);
  if (model.backend != Backend::cuda || sampling.repetition_penalty == 1.0f) return sampling;
  DF_CHECK(!args.repetition_penalty,
           "--repetition-penalty: the cuda backend does not apply a repetition penalty; use --backend reference");
  std::fprintf(stderr, "note: generation_config.json's repetition_penalty %g is not applied on the cuda backend\n",
               sampling.repetition_penalty);
  sampling.repetition_penalty = 1.0f;
  return sampling;
}

std::vector<int32_t> stop_ids(const SamplingArgs& args, const LoadedModel& model) {
  if (args.ignore_eos) return {};
  const ModelConfig& config = model.config;
  std::vector<int32_t> stops =
      config.generation.eos_token_ids.empty() ? config.eos_token_ids : config.generation.eos_token_ids;
  if (model.tokenizer)
    for (const TokenId id : model.tokenizer->stop_ids())
      if (!is_stop(stops, id)) stops.push_back(id);
  return stops;
}

TokenPrinter::TokenPrinter(const std::optional<Tokenizer>& tokenizer) {
  if (tokenizer) stream_.emplace(*tokenizer, /*skip_special_tokens=*/true);
}

void TokenPrinter::print(int32_t id) {
  if (stream_) write(stream_->push(id));
  else write((text_.empty() ? "" : " ") + std::to_string(id));
}

void TokenPrinter::finish() {
  if (stream_) write(stream_->flush());
}

void TokenPrinter::write(const std::string& text) {
  text_ += text;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

GenerationResult generate_tokens(LoadedModel& model, const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                                 int budget, const std::vector<int32_t>& stops, const OnToken& on_token,
                                 Speculation* speculation) {
  if (model.engine) {
    return generate_on_engine(*model.engine, prompt, sampling, budget, stops, on_token);
  }
  return generate_on_reference(model, prompt, sampling, budget, stops, on_token, speculation);
}

}  // namespace deepfuse::cli
