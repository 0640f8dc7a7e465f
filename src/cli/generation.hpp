// What generate and chat share: the sampling flags, the stop tokens, the token printer, and the
// loop that runs one sequence on either backend and hands each token to the caller as it comes.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/model_session.hpp"
#include "deepfuse/sampling_params.hpp"
#include "deepfuse/speculative.hpp"
#include "speculative/suffix_cache.hpp"

namespace deepfuse::cli {

// The sampling flags as given; unset ones come from generation_config.json, else greedy.
struct SamplingArgs {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  uint64_t seed = 0;
  bool ignore_eos = false;
};

// Adds --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --seed and --ignore-eos.
void add_sampling_options(CLI::App& command, SamplingArgs& args);

// The sampling the backend runs: flags, else the checkpoint's defaults. The cuda backend has no
// repetition penalty: asking for one is an error, a generation_config.json default is dropped
// with a note on stderr.
SamplingParams backend_sampling(const SamplingArgs& args, const LoadedModel& model);

// Every id that ends generation (none with --ignore-eos): the config's EOS (generation_config.json's
// when it names any) and the tokenizer's stop tokens.
std::vector<int32_t> stop_ids(const SamplingArgs& args, const LoadedModel& model);

// Writes tokens to stdout as they come: their text through a StreamDecoder (never half a UTF-8
// character; special tokens left out) when there is a tokenizer, space-separated ids otherwise.
class TokenPrinter {
 public:
  explicit TokenPrinter(const std::optional<Tokenizer>& tokenizer);
  void print(int32_t id);
  // Whatever the stream still holds back (an incomplete character at the very end).
  void finish();
  // Everything printed so far.
  const std::string& text() const { return text_; }

 private:
  void write(const std::string& text);
  std::optional<StreamDecoder> stream_;
  std::string text_;
};

// What the summary line reports.
struct GenerationResult {
  int generated = 0;
  double time_to_first_token_ms = 0;
  double decode_seconds = 0;  // from the first token to the last
  bool stopped = false;       // the caller's on_token asked to stop
  long drafted = 0;           // speculative: draft tokens verified, and of those accepted
  long accepted = 0;
};

// Speculative decoding for generate_tokens on the reference backend: the drafter, and the suffix
// drafter's cache of earlier generations, which outlives one call (chat's turns). The CUDA engine
// keeps both itself (EngineOptions::speculative, set from the same flag).
struct Speculation {
  SpeculativeChoice choice = kDefaultSpeculative;
  speculative::SuffixCache cache;
};

// Called with each generated token as soon as it is sampled; returning false ends the sequence
// there (chat's Ctrl-C).
using OnToken = std::function<bool(int32_t id)>;

// Generates up to `budget` tokens after `prompt` on the backend `model` runs, ending at a stop id;
// with `speculation` (not off) verifying drafts each step; the result counts the drafts either way.
GenerationResult generate_tokens(LoadedModel& model, const std::vector<int32_t>& prompt, const SamplingParams& sampling,
                                 int budget, const std::vector<int32_t>& stops, const OnToken& on_token,
                                 Speculation* speculation = nullptr);

}  // namespace deepfuse::cli
