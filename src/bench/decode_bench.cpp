#include "bench/decode_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>

#include <cuda_profiler_api.h>

#include "bench/power_cap.hpp"
#include "bench/speculative_bench.hpp"
#include "bench/timing.hpp"
#include "core/roofline.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "kernels/common/trace.hpp"
#include "runtime/engine_bench.hpp"
#include "runtime/rank_group.hpp"
#include "dist/tensor_split.hpp"
#include "scheduler/plan_json.hpp"

namespace deepfuse::bench {

std::vector<std::string> default_decode_bench_archs() { return {"llama3-8b", "llama3.2-1b", "qwen2.5-7b"}; }
std::vector<int> default_decode_bench_batches() { return {1, 8, 32}; }
std::vector<int> default_decode_bench_contexts() { return {512, 8192, 32768}; }
std::vector<int> default_decode_bench_ttft_prompts() { return {512, 4096}; }

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int pages_for(int tokens) { return (tokens + kernels::kKvPageSize - 1) / kernels::kKvPageSize; }

// Bytes of K and V one decode step reads: every sequence's keys and values in every layer, only
// the last sliding_window positions where the model has a window (Mistral).
// Per GPU: a tensor-parallel rank reads the key/value heads it holds (dist::shard_of).
size_t kv_bytes_read_per_step(const ModelConfig& c, int batch, int context, int tensor_parallel) {
  const int attended = c.sliding_window > 0 ? std::min(context, c.sliding_window) : context;
  const int kv_heads = dist::shard_of(c, 0, tensor_parallel).kv_heads;  // all of them for one GPU
  return static_cast<size_t>(batch) * attended * c.num_hidden_layers * 2 * kv_heads * c.head_dim * sizeof(uint16_t);
}

// The all-reduce timed at engine start for the bucket serving `batch` (tensor parallel), or null.
const runtime::AllReduceTiming* all_reduce_timing(const Engine& engine, int batch) {
  const auto& timings = runtime::EngineBench::all_reduce_timings(engine);
  const DecodePlan& plan = engine.plan();
  const BucketPlan& bucket = plan.bucket_for(batch);
  for (const runtime::AllReduceTiming& t : timings)
    if (t.batch == bucket.batch) return &t;
  return nullptr;
}

// The run's shared state: the table rows and JSON as they accumulate.
struct Report {
  Report(const DeviceInfo& device, double copy_bytes_per_s)
      : read_bw(read_ceiling(device, copy_bytes_per_s)), l2_bytes(device.l2_bytes) {}

  Table decode{{"arch", "batch", "context", "ms/step", "tok/s/seq", "tok/s", "roofline ms", "%roofline", "launches",
                "graph kernels", "GPU GB", "replay ms", "all-reduce"}};
  Table ttft{{"arch", "prompt", "TTFT ms"}};
  Table gemms{{"arch", "op", "M", "N", "K", "candidates", "chosen", "split-K", "heuristic us", "chosen us", "gain"}};
  nlohmann::json rows = nlohmann::json::array();
  PowerCapCounter power_cap;      // how much of each case's timed steps ran power-capped
  std::vector<std::string> capped;  // cases capped for more than kPowerCappedNote of their timed steps
  ImpossibleRows impossible{"decode"};
  SpeculativeReport speculative;  // --verify-drafts, --speculative
  double read_bw;   // bytes/s, the fastest any read goes on this GPU (core/roofline.hpp)
  size_t l2_bytes;

  void skip(const std::string& what, nlohmann::json row, const std::string& reason) {
    std::printf("  skipped %s: %s\n", what.c_str(), reason.c_str());
    row["skipped"] = reason;
    rows.push_back(row);
  }
};

// How tables name an engine's model: its arch, and its weights' format where not bf16
// ("llama3-8b fp8_e4m3"); the JSON rows say both apart ("arch", "weights").
std::string model_name(const std::string& arch, WeightFormat weights) {
  return weights == WeightFormat::bf16 ? arch : arch + " " + weight_format_name(weights);
}
std::string model_name(const std::string& arch, const Engine& engine) {
  return model_name(arch, engine.options().weights.quantize);
}

// Tokens each sequence of a case generates: warm-up, timed and traced steps, and one to spare.
int tokens_per_case(const DecodeBenchOptions& options) {
  return options.warmup + options.steps + (options.trace_path.empty() ? 0 : 1) + 1;
}

// Tokens the longest case needs in one sequence: a decode case's context and steps, or a prompt
// and its first token.
int longest_case(const DecodeBenchOptions& options) {
  const int largest_context = *std::max_element(options.contexts.begin(), options.contexts.end());
  const int largest_prompt =
      options.ttft_prompts.empty() ? 0 : *std::max_element(options.ttft_prompts.begin(), options.ttft_prompts.end());
  const int request = options.speculative == SpeculativeChoice::off ? 0 : options.request_prompt + options.request_tokens;
  const int verify = options.verify_drafts > 0 ? largest_context + 1 + verify_case_tokens(options) : 0;
  return std::max({largest_context + tokens_per_case(options), largest_prompt + 1, request, verify});
}

// Events per traced step: a few marks per block of every traced kernel, with room to spare.
constexpr unsigned kTraceCapacity = 1u << 22;

// One decode step of the case's batch: every sequence must advance by one token; one that
// finishes here (KV cache full, context length) breaks the case.
void step_all(Engine& engine, int batch) {
  const std::vector<StepToken> produced = engine.step();
  DF_CHECK(static_cast<int>(produced.size()) == batch,
           "a step produced " + std::to_string(produced.size()) + " tokens for " + std::to_string(batch) + " sequences");
  for (const StepToken& token : produced)
    DF_CHECK(token.finish == FinishReason::none,
             std::string("a sequence finished while timing (") + finish_reason_name(token.finish) + ")");
}

// Frees the case's sequences. One that finished was already removed by the engine itself, so a
// failure to remove it is expected and ignored.
void remove_all(Engine& engine, const std::vector<SequenceId>& sequences) {
  for (SequenceId id : sequences) {
    try {
      engine.remove_sequence(id);
    } catch (const Error&) {
    }
  }
}

// One more step with the kernels' timeline marks on, appended to the trace CSV (see
// scripts/profile/summarize_trace.py): arch, batch, context, then one row per block mark.
void trace_one_step(Engine& engine, const std::string& arch, int batch, int context, const std::string& path) {
  namespace trace = kernels::trace;
  trace::begin(kTraceCapacity);
  const auto start = Clock::now();
  step_all(engine, batch);
  const double step_ms = ms_since(start);
  const std::vector<trace::Event> events = trace::collect();
  DF_CHECK(events.size() < kTraceCapacity, "bench decode --trace: the step overflowed the trace buffer");
  append_trace_csv(path, arch, batch, context, step_ms, events);
}

void run_decode_case(Engine& engine, const std::string& arch, int batch, int context, const DecodeBenchOptions& options,
                     double copy_bytes_per_s, Report& report) {
  const ModelConfig& config = engine.config();
  nlohmann::json row = {{"kind", "decode"}, {"arch", arch},
                        {"weights", weight_format_name(engine.options().weights.quantize)}, {"batch", batch},
                        {"context", context}, {"max_context", engine.options().max_context}};
  const int tokens_per_sequence = tokens_per_case(options);
  const int pages_needed = batch * pages_for(context + tokens_per_sequence);
  const std::string model = model_name(arch, engine);
  const std::string label = model + " batch " + std::to_string(batch) + " context " + std::to_string(context);
  const EngineStats before = engine.stats();
  if (pages_needed > before.kv_pages_free) {
    report.skip(label, row, "needs " + std::to_string(pages_needed) + " KV pages, the cache has " +
                         std::to_string(before.kv_pages_free) + " free (" +
                         format_fixed(before.kv_cache_bytes / 1e9, 1) + " GB pool)");
    return;
  }
  std::vector<SequenceId> sequences;
  double ms = 0.0;         // wall time per step over the timed steps
  double replay_ms = 0.0;  // the captured step replayed back to back: the GPU's time without host gaps
  std::optional<double> power_capped;
  try {
    for (int b = 0; b < batch; ++b)
      sequences.push_back(runtime::EngineBench::add_prefilled(engine, context, tokens_per_sequence));
    warm_up_clocks();
    for (int s = 0; s < options.warmup; ++s) step_all(engine, batch);
    // One interval around all the timed steps, from an idle GPU until the last step launched is
    // done. Not one per step() call: with overlap_steps a call launches the next step and then
    // reads back the one before, so the gap between two calls is not a step (a call can return
    // microseconds after the previous one when the step it reads back ended while the host was
    // busy; such gaps were once reported as a 1.28 ms "minimum" for an 8B step of 3.6 ms
    // roofline). In this window the GPU runs exactly `steps` launched steps, so the mean per
    // step cannot beat the GPU.
    engine.wait_for_launched_steps();
    cudaProfilerStart();  // a profiler started with --profile-from-start off sees the timed steps only
    const PowerCapWindow capped(report.power_cap);
    const auto start = Clock::now();
    for (int s = 0; s < options.steps; ++s) step_all(engine, batch);
    engine.wait_for_launched_steps();
    ms = ms_since(start) / options.steps;
    power_capped = capped.fraction();
    cudaProfilerStop();
    replay_ms = runtime::EngineBench::decode_replay_ms(engine, options.steps);
    if (!options.trace_path.empty()) trace_one_step(engine, model, batch, context, options.trace_path);
  } catch (const Error& e) {
    remove_all(engine, sequences);
    report.skip(label, row, e.what());
    return;
  }
  remove_all(engine, sequences);

  const EngineStats stats = engine.stats(batch);
  const int tp = engine.options().tensor_parallel;
  const size_t kv_bytes = kv_bytes_read_per_step(config, batch, context, tp);
  const double step_bytes = static_cast<double>(stats.weight_bytes + kv_bytes);
  const double roofline_ms = step_bytes / copy_bytes_per_s * 1e3;
  const double percent = 100.0 * roofline_ms / ms;
  // Both timings against the physical floor: a step below it is a timing bug, not a result.
  const double fastest_ms = fastest_read_seconds(step_bytes, report.read_bw, report.l2_bytes) * 1e3;
  const bool possible = report.impossible.check(
      physically_possible(step_bytes, ms * 1e-3, report.read_bw, report.l2_bytes) &&
          (replay_ms == 0.0 || physically_possible(step_bytes, replay_ms * 1e-3, report.read_bw, report.l2_bytes)),
      label + ": " + format_fixed(ms, 3) + " ms per step, replay " + format_fixed(replay_ms, 3) + " ms, floor " +
          format_fixed(fastest_ms, 3) + " ms");
  // Tensor parallel: the chosen all-reduce kernel's µs per call (timed at engine start, alone in a
  // graph) and the share of the step its calls would take: 2 x layers, or with epilogue (the fused
  // MLP sums in its own finish) the attention block's one-shot kernel, once a layer; with in_mlp
  // (the fused MLP sums its input too) none.
  std::string all_reduce_text = "-";
  nlohmann::json all_reduce_json = nullptr;
  if (const runtime::AllReduceTiming* t = all_reduce_timing(engine, batch); t && tp > 1) {
    const BucketPlan& bucket = engine.plan().bucket_for(batch);
    const AllReduceChoice choice = bucket.all_reduce;
    const double us = t->us(choice);
    const int calls = (2 - sums_in_mlp(bucket.mlp, choice)) * config.num_hidden_layers;
    const double share = us > 0 ? 100.0 * calls * us / (ms * 1e3) : 0.0;
    all_reduce_text = us > 0 && calls > 0 ? std::string(choice_name(choice)) + " " + format_fixed(us, 1) + "us x" +
                                   std::to_string(calls) + " " + format_fixed(share, 1) + "%"
                             : choice_name(choice);
    all_reduce_json = {{"choice", choice_name(choice)},   {"us_per_call", us},
                       {"kernel_calls_per_step", calls},  {"nccl_us", t->nccl_us},
                       {"one_shot_flag_us", t->flag_us},  {"one_shot_lines_us", t->lines_us},
                       {"share_of_step_pct", share}};
  }
  report.decode.add({model, std::to_string(batch), std::to_string(context), format_fixed(ms, 3),
                     format_fixed(1e3 / ms, 1), format_fixed(batch * 1e3 / ms, 1), format_fixed(roofline_ms, 3),
                     format_fixed(percent, 1), std::to_string(stats.launches_per_decode_step),
                     stats.kernels_per_decode_step > 0 ? std::to_string(stats.kernels_per_decode_step) : "-",
                     format_fixed(stats.gpu_memory_used / 1e9, 1), replay_ms > 0 ? format_fixed(replay_ms, 3) : "-",
                     all_reduce_text});
  row.update({{"ms_per_step", ms},
              {"replay_ms_per_step", replay_ms},
              {"fastest_possible_ms", fastest_ms},
              {"physically_possible", possible},
              {"tokens_per_s_per_sequence", 1e3 / ms},
              {"tokens_per_s", batch * 1e3 / ms},
              {"weight_bytes", stats.weight_bytes},
              {"kv_bytes_per_step", kv_bytes},
              {"roofline_ms", roofline_ms},
              {"pct_roofline", percent},
              {"launches_per_step", stats.launches_per_decode_step},
              {"launches_per_layer", stats.launches_per_layer},
              {"graph_kernels_per_step", stats.kernels_per_decode_step},
              {"gpu_memory_bytes", stats.gpu_memory_used},
              {"power_capped_fraction", power_capped_json(power_capped)},
              {"tensor_parallel", tp},
              {"all_reduce", all_reduce_json}});
  if (power_capped_noteworthy(power_capped)) report.capped.push_back(label);
  report.rows.push_back(row);
}

// add_sequence + step() until the sequence's first token, at batch 1 (the engine is otherwise idle).
double time_to_first_token_ms(Engine& engine, const std::vector<int32_t>& prompt) {
  SequenceRequest request;
  request.prompt = prompt;
  request.max_new_tokens = 1;  // finishes with its first token and leaves the engine by itself
  engine.wait_for_launched_steps();  // from an idle GPU: no decode step launched ahead still running
  const auto start = Clock::now();
  const SequenceId sequence = engine.add_sequence(request);
  for (int idle = 0;; ++idle) {
    for (const StepToken& token : engine.step())
      if (token.sequence == sequence) return ms_since(start);
    DF_CHECK(idle < 16, "no first token after 16 steps");
  }
}

void run_ttft_case(Engine& engine, const std::string& arch, int prompt_tokens, const DecodeBenchOptions& options,
                   std::mt19937_64& rng, Report& report) {
  nlohmann::json row = {{"kind", "ttft"}, {"arch", arch},
                        {"weights", weight_format_name(engine.options().weights.quantize)},
                        {"prompt_tokens", prompt_tokens}};
  const std::string model = model_name(arch, engine);
  const std::string label = model + " time to first token at " + std::to_string(prompt_tokens) + " tokens";
  const EngineStats stats = engine.stats();
  if (pages_for(prompt_tokens + 1) > stats.kv_pages_free) {
    report.skip(label, row, "the prompt needs more KV pages than the cache has free");
    return;
  }
  std::uniform_int_distribution<int32_t> any_id(0, engine.config().vocab_size - 1);
  std::vector<int32_t> prompt(prompt_tokens);
  for (int32_t& id : prompt) id = any_id(rng);
  std::vector<double> ms;
  try {
    time_to_first_token_ms(engine, prompt);  // warm-up: first prefill at this length
    for (int rep = 0; rep < options.ttft_repetitions; ++rep) ms.push_back(time_to_first_token_ms(engine, prompt));
  } catch (const Error& e) {
    report.skip(label, row, e.what());
    return;
  }
  report.ttft.add({model, std::to_string(prompt_tokens), format_fixed(median(ms), 2)});
  row.update({{"ms", median(ms)}, {"ms_min", *std::min_element(ms.begin(), ms.end())}});
  report.rows.push_back(row);
}

void run_arch(const std::string& arch, WeightFormat weights, const DecodeBenchOptions& options, double copy_bytes_per_s,
              Report& report) {
  const std::string model = model_name(arch, weights);
  EngineOptions engine_options;
  engine_options.weights.quantize = weights;  // random weights drawn in bf16, then quantized: one model
  engine_options.max_batch = *std::max_element(options.batches.begin(), options.batches.end());
  // The attention's plans (splits per sequence) are made for max_context, so a step's speed at a
  // given length depends on it: --max-context measures an engine planned as a server would be.
  engine_options.max_context = pages_for(std::max(longest_case(options), options.max_context)) * kernels::kKvPageSize;
  engine_options.kv_cache_bytes = options.kv_cache_bytes;
  engine_options.cuda_graphs = options.cuda_graphs;
  engine_options.overlap_steps = options.overlap_steps;
  engine_options.plan_overrides = options.plan_overrides;
  engine_options.tuning_cache = options.tuning_cache;
  engine_options.keep_mlp_copy = options.keep_mlp_copy;
  engine_options.tune_gemms = options.tune_gemms;
  engine_options.tensor_parallel = options.tensor_parallel;

  ModelConfig config = random_arch_config(arch);
  if (config.max_position_embeddings < engine_options.max_context) {
    // Random weights: positions past the trained length cost the same and only speed is measured.
    std::printf("  %s: max_position_embeddings %d raised to %d for the planned context\n", model.c_str(),
                config.max_position_embeddings, engine_options.max_context);
    config.max_position_embeddings = engine_options.max_context;
  }
  std::optional<Engine> engine;
  try {
    engine.emplace(Engine::with_random_weights(config, engine_options, options.seed));
  } catch (const Error& e) {
    report.skip(model, {{"kind", "engine"}, {"arch", arch}, {"weights", weight_format_name(weights)}}, e.what());
    return;
  }
  for (const GemmTuning& t : engine->gemm_tunings()) {
    const double gain = t.heuristic_us > 0 ? 100.0 * (t.heuristic_us - t.chosen_us) / t.heuristic_us : 0.0;
    report.gemms.add({model, t.op, std::to_string(t.m), std::to_string(t.n), std::to_string(t.k),
                      std::to_string(t.candidates), std::to_string(t.chosen), std::to_string(t.chosen_splits),
                      format_fixed(t.heuristic_us, 2),
                      format_fixed(t.chosen_us, 2), format_fixed(gain, 1) + "%"});
    report.rows.push_back({{"kind", "gemm_tuning"}, {"arch", arch}, {"weights", weight_format_name(weights)}, {"op", t.op}, {"m", t.m}, {"n", t.n}, {"k", t.k},
                           {"candidates", t.candidates}, {"chosen", t.chosen}, {"split_k", t.chosen_splits},
                           {"heuristic_us", t.heuristic_us},
                           {"chosen_us", t.chosen_us}});
  }
  if (!engine->plan_notice().empty()) std::fprintf(stderr, "  %s: %s\n", model.c_str(), engine->plan_notice().c_str());
  if (options.print_plan) std::printf("  %s decode plan:\n%s", model.c_str(), describe(engine->plan()).c_str());
  report.rows.push_back({{"kind", "plan"}, {"arch", arch}, {"weights", weight_format_name(weights)},
                         {"plan", scheduler::plan_json(engine->plan())}});
  const EngineStats stats = engine->stats();
  std::fprintf(stderr, "  %s: %.2f GB of weights, %.1f GB KV pool (%d pages), %d launches per step, planned for %d tokens\n",
               model.c_str(), stats.weight_bytes / 1e9, stats.kv_cache_bytes / 1e9, stats.kv_pages_total,
               stats.launches_per_decode_step, engine->options().max_context);
  for (int context : options.contexts)
    for (int batch : options.batches) {
      run_decode_case(*engine, arch, batch, context, options, copy_bytes_per_s, report);
      std::fprintf(stderr, "  measured %s batch %d context %d\n", model.c_str(), batch, context);
    }
  std::mt19937_64 rng(options.seed);
  for (int prompt_tokens : options.ttft_prompts) run_ttft_case(*engine, arch, prompt_tokens, options, rng, report);
  engine.reset();  // its memory, for the speculative rows' engines
  try {
    run_speculative_arch(model, config, engine_options, options, report.speculative);
  } catch (const Error& e) {
    report.skip(model + " speculative rows", {{"kind", "verify"}, {"arch", arch}}, e.what());
  }
}

void check_options(const DecodeBenchOptions& options) {
  DF_CHECK(!options.archs.empty() && !options.batches.empty() && !options.contexts.empty() && !options.weights.empty(),
           "bench decode: give at least one arch, batch, context and weight format");
  for (int b : options.batches) DF_CHECK(b >= 1, "bench decode: --batches must be at least 1");
  for (int c : options.contexts) DF_CHECK(c >= 1, "bench decode: --contexts must be at least 1");
  for (int p : options.ttft_prompts) DF_CHECK(p >= 1, "bench decode: --ttft-prompts must be at least 1");
  DF_CHECK(options.steps >= 1 && options.warmup >= 0 && options.ttft_repetitions >= 1,
           "bench decode: --steps and --ttft-reps must be at least 1, --warmup at least 0");
  const std::vector<std::string> known = random_arch_names();
  for (const auto& arch : options.archs)
    DF_CHECK(std::find(known.begin(), known.end(), arch) != known.end(), "bench decode: unknown arch '" + arch + "'");
  DF_CHECK(options.max_context >= 0, "bench decode: --max-context must not be negative");
  DF_CHECK(options.verify_drafts >= 0 && options.verify_drafts <= 15, "bench decode: --verify-drafts must be in [0, 15]");
  DF_CHECK(options.request_prompt >= 1 && options.request_tokens >= 2,
           "bench decode: --request-prompt must be at least 1 and --request-tokens at least 2");
  DF_CHECK(options.max_context == 0 || options.max_context >= longest_case(options),
           "bench decode: --max-context " + std::to_string(options.max_context) + " is below the " +
               std::to_string(longest_case(options)) + " tokens the longest case needs");
}

}  // namespace

int run_decode_bench(const DecodeBenchOptions& options) {
  check_options(options);
  DF_CHECK(cuda_device_available(), "bench decode: no CUDA device found (the decode benchmark runs the CUDA engine)");
  const DeviceInfo device = query_device();
  if (!options.trace_path.empty()) {
    start_trace_csv("decode", options.trace_path);
    kernels::trace::begin(kTraceCapacity);  // before the engines' first launches: see trace::begin
  }
  const double copy_bw = measure_copy_bandwidth();
  std::printf(
      "GPU: %s, %d SMs; measured copy bandwidth %.3f TB/s (read+write); CUDA graphs %s, steps overlapped %s, plan "
      "%s%s%s, cuBLASLt GEMMs %s\n",
      device.name.c_str(), device.sm_count, copy_bw / 1e12, options.cuda_graphs ? "on" : "off",
      options.overlap_steps ? "on" : "off",
      options.tuning_cache.empty() ? "built-in" : "from the tuning cache where it has an entry, else built-in",
      options.plan_override_text.empty() ? "" : " + overrides ", options.plan_override_text.c_str(),
      options.tune_gemms ? "timed at construction" : "as cuBLASLt's heuristic ranks them");
  Report report(device, copy_bw);
  // Each arch in every format asked, one after the other in this run: bf16 and FP8 of the same
  // random weights against the same copy bandwidth.
  for (const auto& arch : options.archs)
    for (WeightFormat weights : options.weights) run_arch(arch, weights, options, copy_bw, report);

  std::printf("\ndecode step (ms/step: wall time of %d steps from an idle GPU until the last is done, per step; "
              "roofline = (weights + KV read) / copy bandwidth%s)\n",
              options.steps, options.tensor_parallel > 1 ? ", per GPU: one rank's slices" : "");
  std::fputs(report.decode.render().c_str(), stdout);
  for (const std::string& label : report.capped)
    std::printf("note: %s ran power-capped for more than %.0f%% of its timed steps (JSON power_capped_fraction)\n",
                label.c_str(), 100.0 * kPowerCappedNote);
  if (!options.ttft_prompts.empty()) {
    std::printf("\ntime to first token (batch 1, median of %d)\n", options.ttft_repetitions);
    std::fputs(report.ttft.render().c_str(), stdout);
  }
  if (options.verify_drafts > 0) {
    std::printf("\nspeculative verify step (every sequence verifies %d random drafts; ms/step of %d steps, each "
                "read back before the next, against one-token steps of the same engine)\n",
                options.verify_drafts, options.steps);
    std::fputs(report.speculative.verify.render().c_str(), stdout);
  }
  if (options.speculative != SpeculativeChoice::off) {
    std::printf("\nspeculative requests (greedy, %d random prompt tokens, %d new; decode tokens/s after the first "
                "step; plain: no speculation, steps launched ahead; repeat: the second of two identical rounds)\n",
                options.request_prompt, options.request_tokens);
    std::fputs(report.speculative.requests.render().c_str(), stdout);
  }
  if (options.tune_gemms) {
    std::printf("\ncuBLASLt GEMMs timed at construction (µs per call in a graph, weights from HBM; chosen 0: the "
                "heuristic's first choice kept; past its suggestions, the split-K ones unsplit)\n");
    std::fputs(report.gemms.render().c_str(), stdout);
  }
  if (!options.json_path.empty()) {
    nlohmann::json json = run_header(device, copy_bw);
    json.update({{"suite", "decode"}, {"cuda_graphs", options.cuda_graphs}, {"overlap_steps", options.overlap_steps},
                 {"plan_override", options.plan_override_text}, {"tuning_cache", options.tuning_cache.string()},
                 {"keep_mlp_copy", options.keep_mlp_copy}, {"tune_gemms", options.tune_gemms},
                 {"tensor_parallel", options.tensor_parallel},
                 {"steps", options.steps},
                 {"warmup", options.warmup}, {"verify_drafts", options.verify_drafts},
                 {"speculative", choice_name(options.speculative)}, {"rows", report.rows}});
    for (const nlohmann::json& row : report.speculative.rows) json["rows"].push_back(row);
    write_json(options.json_path, json);
  }
  return report.impossible.finish();
}

}  // namespace deepfuse::bench
