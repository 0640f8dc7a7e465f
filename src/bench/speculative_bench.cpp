#include "bench/speculative_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "runtime/engine_bench.hpp"

namespace deepfuse::bench {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int pages_for(int tokens) { return (tokens + kernels::kKvPageSize - 1) / kernels::kKvPageSize; }

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int count, int vocab) {
  std::uniform_int_distribution<int32_t> any(0, vocab - 1);
  std::vector<int32_t> ids(count);
  for (int32_t& id : ids) id = any(rng);
  return ids;
}

// One step of prefilled sequences: each advances (by one token or, verifying, more) and none ends.
void step_every_sequence(Engine& engine, int batch) {
  const std::vector<StepToken> produced = engine.step();
  DF_CHECK(static_cast<int>(produced.size()) >= batch,
           "a step produced " + std::to_string(produced.size()) + " tokens for " + std::to_string(batch) + " sequences");
  for (const StepToken& token : produced)
    DF_CHECK(token.finish == FinishReason::none,
             std::string("a sequence finished while timing (") + finish_reason_name(token.finish) + ")");
}

// Milliseconds per step over `steps` steps after `warmup`, from an idle GPU until the last is done.
double ms_per_step(Engine& engine, int batch, int warmup, int steps) {
  for (int s = 0; s < warmup; ++s) step_every_sequence(engine, batch);
  engine.wait_for_launched_steps();
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) step_every_sequence(engine, batch);
  engine.wait_for_launched_steps();
  return seconds_since(start) * 1e3 / steps;
}

void run_verify_case(Engine& engine, const std::string& arch, int batch, int context,
                     const DecodeBenchOptions& options, SpeculativeReport& report) {
  const int drafts = options.verify_drafts;
  nlohmann::json row = {{"kind", "verify"}, {"arch", arch}, {"batch", batch}, {"context", context}, {"drafts", drafts}};
  const int tokens = verify_case_tokens(options);
  const int pages = batch * pages_for(context + 1 + tokens);
  auto skip = [&](const std::string& reason) {
    std::printf("  skipped verify %s batch %d context %d: %s\n", arch.c_str(), batch, context, reason.c_str());
    row["skipped"] = reason;
    report.rows.push_back(row);
  };
  if (pages > engine.stats().kv_pages_free) return skip("needs " + std::to_string(pages) + " KV pages");
  std::vector<SequenceId> sequences;
  double one_token_ms = 0, verify_ms = 0;
  try {
    for (int b = 0; b < batch; ++b) sequences.push_back(runtime::EngineBench::add_prefilled(engine, context, tokens));
    std::mt19937_64 rng(options.seed);
    const int vocab = engine.config().vocab_size;
    runtime::EngineBench::set_draft_source(engine, [](SequenceId, std::span<const int32_t>, int) {
      return std::vector<int32_t>{};
    });
    warm_up_clocks();
    one_token_ms = ms_per_step(engine, batch, options.warmup, options.steps);
    runtime::EngineBench::set_draft_source(engine, [&rng, drafts, vocab](SequenceId, std::span<const int32_t>, int limit) {
      return random_tokens(rng, std::min(drafts, limit), vocab);
    });
    verify_ms = ms_per_step(engine, batch, options.warmup, options.steps);
  } catch (const Error& e) {
    skip(e.what());
  }
  runtime::EngineBench::set_draft_source(engine, {});
  for (SequenceId id : sequences) {
    try {
      engine.remove_sequence(id);
    } catch (const Error&) {  // it finished: the engine removed it already
    }
  }
  if (verify_ms == 0) return;
  const double ratio = verify_ms / one_token_ms;
  report.verify.add({arch, std::to_string(batch), std::to_string(context), std::to_string(drafts),
                     format_fixed(one_token_ms, 3), format_fixed(verify_ms, 3), format_fixed(ratio, 3) + "x"});
  row.update({{"one_token_ms_per_step", one_token_ms}, {"verify_ms_per_step", verify_ms}, {"ratio", ratio}});
  report.rows.push_back(row);
}

struct RequestTiming {
  double tokens_per_s = 0;
  uint64_t drafted = 0, accepted = 0;
  uint64_t steps = 0, launched_ahead = 0;  // step() calls; of their steps, those launched ahead
};

// Greedy requests for `prompts`, decoded together: tokens/s after the first step() (which prefills
// them), until the last finishes.
RequestTiming time_requests(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int new_tokens) {
  const Engine::SpeculativeCounts before = engine.speculative_counts();
  for (const std::vector<int32_t>& prompt : prompts) {
    SequenceRequest request;
    request.prompt = prompt;
    request.max_new_tokens = new_tokens;
    engine.add_sequence(request);
  }
  engine.step();
  const auto start = Clock::now();
  size_t tokens = 0;
  uint64_t steps = 1;  // step() calls, the untimed first one included
  for (; engine.running_sequences() > 0; ++steps) {
    DF_CHECK(steps <= 4 * static_cast<uint64_t>(new_tokens), "bench decode: requests stopped producing tokens");
    tokens += engine.step().size();
  }
  const Engine::SpeculativeCounts after = engine.speculative_counts();
  return {static_cast<double>(tokens) / seconds_since(start), after.draft_tokens - before.draft_tokens,
          after.accepted_draft_tokens - before.accepted_draft_tokens, steps,
          after.launched_ahead_steps - before.launched_ahead_steps};
}

// Per batch: a request round and its repeat (the repeat timed), then fresh prompts.
struct Workload {
  int batch = 0;
  std::vector<std::vector<int32_t>> repeated, fresh;
};

std::map<std::string, RequestTiming> time_workload(Engine& engine, const Workload& w, int new_tokens) {
  time_requests(engine, w.repeated, new_tokens);  // the suffix drafter's cache takes these outputs
  return {{"repeat", time_requests(engine, w.repeated, new_tokens)}, {"fresh", time_requests(engine, w.fresh, new_tokens)}};
}

}  // namespace

// Random drafts almost never match, so a step emits one token; room for twice that.
int verify_case_tokens(const DecodeBenchOptions& options) {
  return 2 * (2 * (options.warmup + options.steps)) + options.verify_drafts + 2;
}

void run_speculative_arch(const std::string& arch, const ModelConfig& config, const EngineOptions& base,
                          const DecodeBenchOptions& options, SpeculativeReport& report) {
  if (options.verify_drafts <= 0 && options.speculative == SpeculativeChoice::off) return;
  std::mt19937_64 rng(options.seed + 54);
  std::vector<Workload> workloads;
  std::vector<std::map<std::string, RequestTiming>> plain;
  if (options.speculative != SpeculativeChoice::off) {
    for (int batch : options.batches) {
      Workload w{batch, {}, {}};
      for (int b = 0; b < batch; ++b) w.repeated.push_back(random_tokens(rng, options.request_prompt, config.vocab_size));
      for (int b = 0; b < batch; ++b) w.fresh.push_back(random_tokens(rng, options.request_prompt, config.vocab_size));
      workloads.push_back(std::move(w));
    }
    Engine engine = Engine::with_random_weights(config, base, options.seed);
    for (const Workload& w : workloads) plain.push_back(time_workload(engine, w, options.request_tokens));
  }
  EngineOptions speculative = base;
  speculative.speculative = options.speculative == SpeculativeChoice::off ? SpeculativeChoice::ngram : options.speculative;
  speculative.max_draft = std::max(base.max_draft, options.verify_drafts);
  Engine engine = Engine::with_random_weights(config, speculative, options.seed);
  if (options.verify_drafts > 0)
    for (int context : options.contexts)
      for (int batch : options.batches) run_verify_case(engine, arch, batch, context, options, report);
  for (size_t i = 0; i < workloads.size(); ++i) {
    const std::map<std::string, RequestTiming> timed = time_workload(engine, workloads[i], options.request_tokens);
    for (const auto& [scenario, spec] : timed) {
      const RequestTiming& off = plain[i].at(scenario);
      const double speedup = spec.tokens_per_s / off.tokens_per_s;
      const std::string accepted = std::to_string(spec.accepted) + " of " + std::to_string(spec.drafted);
      const std::string ahead = std::to_string(spec.launched_ahead) + " of " + std::to_string(spec.steps);
      report.requests.add({arch, std::to_string(workloads[i].batch), scenario, choice_name(options.speculative),
                           format_fixed(off.tokens_per_s, 1), format_fixed(spec.tokens_per_s, 1),
                           format_fixed(speedup, 2) + "x", accepted, ahead});
      report.rows.push_back({{"kind", "speculative_request"}, {"arch", arch}, {"batch", workloads[i].batch},
                             {"scenario", scenario}, {"drafter", choice_name(options.speculative)},
                             {"prompt_tokens", options.request_prompt}, {"new_tokens", options.request_tokens},
                             {"plain_tokens_per_s", off.tokens_per_s}, {"speculative_tokens_per_s", spec.tokens_per_s},
                             {"speedup", speedup}, {"draft_tokens", spec.drafted},
                             {"accepted_draft_tokens", spec.accepted}, {"steps", spec.steps},
                             {"launched_ahead_steps", spec.launched_ahead}});
    }
  }
}

}  // namespace deepfuse::bench
