// `deepfuse tune`: measures every supported variant of each decode op per batch bucket on this
// GPU (scheduler/profiler.hpp), confirms the combination end to end, and saves the winning plan
// in the tuning cache, where engines for this GPU and model find it.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "cli/commands.hpp"
#include "cli/engine_options.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "dist/tensor_split.hpp"
#include "runtime/engine_tuning.hpp"
#include "runtime/tuner.hpp"
#include "scheduler/plan_json.hpp"
#include "scheduler/tuning_cache.hpp"

namespace deepfuse::cli {

namespace {

struct TuneArgs {
  std::string model_dir;
  bool random_weights = false;
  std::string arch;
  std::string weights;  // --weights: the random weights' format
  EngineArgs engine;
  int context = 1024;
  int long_context = 16384;
  int replays = 20;
  std::string json_path;
};

// "tuning [##########          ]  52%  29 / 56 timings" on a terminal's stderr.
std::function<void(int, int)> progress_bar() {
  if (!isatty(STDERR_FILENO)) return {};
  return [](int done, int total) {
    constexpr int kWidth = 30;
    const int filled = total == 0 ? kWidth : done * kWidth / total;
    std::fprintf(stderr, "\rtuning [%.*s%*s] %3d%%  %d / %d timings", filled, "##############################",
                 kWidth - filled, "", total == 0 ? 100 : 100 * done / total, done, total);
    if (done >= total) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  };
}

int run_tune(const TuneArgs& args) {
  DF_CHECK(args.random_weights != !args.model_dir.empty(), "give a model: --model DIR, or --random-weights --arch NAME");
  DF_CHECK(!args.random_weights || !args.arch.empty(), "--random-weights needs --arch NAME");
  DF_CHECK(args.weights.empty() || args.random_weights,
           "--weights is the random weights' format; a checkpoint loads in its own (or --quantize fp8)");
  EngineOptions options = engine_options(args.engine);  // bad flags fail here, before any GPU work
  if (!args.weights.empty()) {
    DF_CHECK(args.engine.quantize.empty(), "give --weights or --quantize, not both");
    options.weights.quantize = parse_weights_flag(args.weights);
  }
  check_quantize_backend(args.engine, Backend::cuda);
  const std::filesystem::path cache = options.tuning_cache;
  DF_CHECK(!cache.empty(), "tune: no tuning cache to write (give --tuning-cache PATH, or set HOME)");
  check_tuning_cache_writable(cache);
  DF_CHECK(cuda_device_available(), "tune: no CUDA device found on this machine");
  const auto start = std::chrono::steady_clock::now();
  std::optional<Engine> engine;
  const int tp = options.tensor_parallel;
  if (tp > 1) {
    // A tensor-parallel rank runs an ordinary model of its slice's shape (dist::rank_config): the
    // plan is tuned for that shape on one GPU, with random weights (timings do not depend on the
    // values), and tensor-parallel engines of this model find it under that shape.
    ModelConfig config = args.random_weights ? random_arch_config(args.arch) : load_model_config(args.model_dir);
    if (const std::string why = dist::why_not_splittable(config, tp); !why.empty())
      throw Error("tune --tp " + std::to_string(tp) + ": cannot split the model: " + why);
    config = dist::rank_config(config, dist::shard_of(config, 0, tp));
    config.max_position_embeddings = std::max(config.max_position_embeddings, options.max_context);
    options.tensor_parallel = 1;
    std::fprintf(stderr, "note: tuning one rank's slice of --tp %d: %d heads, %d key/value heads, intermediate %d\n", tp,
                 config.num_attention_heads, config.num_key_value_heads, config.intermediate_size);
    engine.emplace(runtime::EngineTuning::with_random_weights(config, options, /*seed=*/1));
  } else if (args.random_weights) {
    ModelConfig config = random_arch_config(args.arch);
    // Random weights: positions past the trained length cost the same, as bench decode has it.
    if (options.max_context > config.max_position_embeddings) {
      std::fprintf(stderr, "note: %s: max_position_embeddings %d raised to --max-context %d\n", args.arch.c_str(),
                   config.max_position_embeddings, options.max_context);
      config.max_position_embeddings = options.max_context;
    }
    engine.emplace(runtime::EngineTuning::with_random_weights(config, options, /*seed=*/1));
  } else {
    engine.emplace(runtime::EngineTuning::from_checkpoint(args.model_dir, options, stderr_progress_bar()));
  }
  runtime::TuneOptions tune_options;
  tune_options.context = args.context;
  tune_options.long_context = args.long_context;
  tune_options.replays = args.replays;
  tune_options.progress = progress_bar();
  const runtime::TuneOutcome outcome = runtime::tune(*engine, tune_options);
  scheduler::save_tuned_plan(cache, runtime::EngineTuning::key(*engine), outcome.tuned);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("%s", runtime::trials_table(outcome.trials).c_str());
  std::printf("\nbuilt-in plan:\n%s", describe(outcome.builtin).c_str());
  std::printf("\ntuned plan:\n%s", describe(outcome.tuned).c_str());
  std::printf("\nsaved to %s (%.1f s)\n", cache.string().c_str(), seconds);
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    DF_CHECK(out.good(), "--json: cannot write " + args.json_path);
    const nlohmann::json json = {{"builtin", scheduler::plan_json(outcome.builtin)},
                                 {"tuned", scheduler::plan_json(outcome.tuned)},
                                 {"seconds", seconds}};
    out << json.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

void register_tune(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand(
      "tune", "Measure each decode op's variants per batch bucket on this GPU and save the fastest plan");
  auto args = std::make_shared<TuneArgs>();
  args->engine.max_batch = 64;  // buckets 1..64
  command->add_option("--model", args->model_dir, "checkpoint directory");
  command->add_flag("--random-weights", args->random_weights, "random weights of --arch's shape, made on the GPU");
  command->add_option("--arch", args->arch, "the architecture preset for --random-weights");
  command->add_option("--weights", args->weights,
                      "with --random-weights: the linear weights' format, bf16 (default), fp8 (per-channel FP8 "
                      "e4m3) or fp8-block128 (a scale per 128x128 block); plans are cached per format");
  add_engine_options(*command, args->engine);
  command->add_option("--context", args->context, "keys in each timed sequence's cache (default 1024)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--long-context", args->long_context,
                   "each candidate is also timed at this many keys, or as many as the bucket's sequences fit "
                   "(default 16384); its time is the sum of both")
      ->check(CLI::PositiveNumber);
  command->add_option("--replays", args->replays, "graph replays per timing (default 20)")->check(CLI::PositiveNumber);
  command->add_option("--json", args->json_path, "write the built-in and tuned plans as JSON");
  command->callback([args, &action] { action = [args] { return run_tune(*args); }; });
}

}  // namespace deepfuse::cli
