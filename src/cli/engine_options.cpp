#include "cli/engine_options.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <optional>

#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::cli {

const char* backend_name(Backend backend) { return backend == Backend::cuda ? "cuda" : "reference"; }

Backend resolve_backend(const std::string& name) {
  if (name == "reference") return Backend::reference;
  if (name == "auto") return cuda_device_available() ? Backend::cuda : Backend::reference;
  DF_CHECK(name == "cuda", "--backend '" + name + "': unknown backend (reference, cuda, auto)");
  DF_CHECK(cuda_device_available(), "--backend cuda: no CUDA device found on this machine; use --backend reference");
  return Backend::cuda;
}

std::string cuda_unsupported_reason(const ModelConfig& config, const EngineArgs& args) {
  if (!format_info(config.quantization.format).implemented)
    return std::string("a ") + quantization_method_name(config.quantization.method) + " " +
           weight_format_name(config.quantization.format) + " checkpoint";
  if (!format_info(weight_load_options(args).quantize).implemented) return "--quantize " + args.quantize;
  if (config.head_dim != 64 && config.head_dim != 128)
    return "head_dim " + std::to_string(config.head_dim) + " (the CUDA kernels take 64 or 128)";
  if (config.hidden_size % 64 != 0 || config.intermediate_size % 64 != 0)
    return "hidden " + std::to_string(config.hidden_size) + " / intermediate " +
           std::to_string(config.intermediate_size) + " (the CUDA kernels need multiples of 64)";
  return "";
}

void add_engine_options(CLI::App& command, EngineArgs& args) {
  const std::string group = "CUDA backend";
  command
      .add_option("--max-batch", args.max_batch,
                  "largest decode batch the engine is built for (default " + std::to_string(args.max_batch) + ")")
      ->check(CLI::PositiveNumber)
      ->group(group);
  command.add_option("--max-context", args.max_context, "tokens per sequence (default: max_position_embeddings)")
      ->check(CLI::PositiveNumber)
      ->group(group);
  command.add_option("--kv-cache-mb", args.kv_cache_mb, "KV cache pool in MiB (default: 90% of free GPU memory)")
      ->check(CLI::PositiveNumber)
      ->group(group);
  command.add_flag("--no-cuda-graphs", args.no_cuda_graphs, "launch every kernel eagerly (debugging)")->group(group);
  command
      .add_flag("--no-overlap-steps", args.no_overlap_steps,
                "read each decode step's tokens back before launching the next (debugging)")
      ->group(group);
  command
      .add_flag("--mixed-steps,!--no-mixed-steps", args.mixed_steps,
                std::string("run a step's prompt chunks and decode rows in one forward pass (default ") +
                    (args.mixed_steps ? "on" : "off") + ")")
      ->group(group);
  add_plan_options(command, args);
  command
      .add_option("--quantize", args.quantize,
                  "fp8: round the 16-bit linear weights through FP8 e4m3 at load, one absmax scale per output "
                  "channel (reference backend; lm_head stays 16-bit)")
      ->group("Weights");
  command.add_flag("--quantize-lm-head", args.quantize_lm_head, "with --quantize: quantize lm_head too")
      ->group("Weights");
  command
      .add_flag("--tune-gemms", args.tune_gemms,
                "time cuBLASLt's suggested algorithms for the decode GEMMs at start-up and keep the fastest")
      ->group(group);
}

void add_plan_options(CLI::App& command, EngineArgs& args) {
  const std::string group = "CUDA backend";
  command
      .add_option("--plan-override", args.plan_overrides,
                  "OP[@BUCKET]=VARIANT[,...]: override the decode plan (all buckets and prefill, or one bucket: "
                  "mlp@16=unfused): " +
                      plan_override_help())
      ->group(group);
  command
      .add_option("--tuning-cache", args.tuning_cache,
                  "plans measured by `deepfuse tune` (default $XDG_CACHE_HOME/deepfuse/tuning.json)")
      ->group(group);
  command.add_flag("--no-tuning-cache", args.no_tuning_cache, "use the built-in plan, ignoring any tuning cache")
      ->group(group);
  command
      .add_option("--tp", args.tensor_parallel,
                  "tensor parallelism: split the model over N GPUs (0..N-1), two all-reduces per block (default 1)")
      ->check(CLI::Range(1, 8))
      ->group(group);
}

WeightLoadOptions weight_load_options(const EngineArgs& args) {
  WeightLoadOptions options;
  DF_CHECK(!args.quantize_lm_head || !args.quantize.empty(), "--quantize-lm-head needs --quantize fp8");
  if (args.quantize.empty()) return options;
  DF_CHECK(args.quantize == "fp8", "--quantize '" + args.quantize + "': unknown (fp8)");
  options.quantize = WeightFormat::fp8_e4m3;
  options.quantize_lm_head = args.quantize_lm_head;
  return options;
}

WeightFormat parse_weights_flag(const std::string& value) {
  if (value == "fp8") return WeightFormat::fp8_e4m3;
  if (value == "fp8-block128") return WeightFormat::fp8_e4m3_block128;
  try {
    return parse_weight_format(value);
  } catch (const Error&) {
    throw Error("--weights '" + value + "': unknown (bf16, fp8, fp8-block128)");
  }
}

void check_quantize_backend(const EngineArgs& args, Backend backend) {
  const WeightLoadOptions options = weight_load_options(args);
  DF_CHECK(backend == Backend::reference || format_info(options.quantize).implemented,
           "--quantize " + args.quantize + ": the CUDA backend has no FP8 kernels for " +
               weight_format_name(options.quantize) + " yet; use --backend reference");
}

void add_speculative_option(CLI::App& command, std::string& name) {
  std::string help = "speculative decoding without a draft model, verifying drafts in each decode step:";
  for (const auto& row : choice_rows<SpeculativeChoice>()) help += std::string("\n  ") + row.name + ": " + row.about;
  help += std::string("\n(default ") + choice_name(kDefaultSpeculative) + ")";
  command.add_option("--speculative", name, help);
}

SpeculativeChoice speculative_choice(const std::string& name) {
  if (const std::optional<SpeculativeChoice> choice = parse_choice<SpeculativeChoice>(name)) return *choice;
  throw Error("--speculative '" + name + "': unknown drafter (" + choice_names<SpeculativeChoice>() + ")");
}

void check_tuning_cache_writable(const std::filesystem::path& path) {
  std::error_code error;
  std::filesystem::create_directories(path.parent_path().empty() ? "." : path.parent_path(), error);
  const std::filesystem::path probe = path.string() + ".probe";
  {
    std::ofstream out(probe);
    DF_CHECK(!error && out.good(), "--tuning-cache " + path.string() + ": cannot write there" +
                                       (error ? " (" + error.message() + ")" : ""));
  }
  std::filesystem::remove(probe, error);
}

std::filesystem::path default_tuning_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::filesystem::path(xdg) / "deepfuse" / "tuning.json";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "deepfuse" / "tuning.json";
  return {};
}

void print_plan_notice(const Engine& engine) {
  if (!engine.plan_notice().empty()) std::fprintf(stderr, "%s\n", engine.plan_notice().c_str());
}

EngineOptions engine_options(const EngineArgs& args) {
  EngineOptions options;
  options.max_batch = args.max_batch;
  options.max_context = args.max_context;
  options.kv_cache_bytes = args.kv_cache_mb << 20;
  options.cuda_graphs = !args.no_cuda_graphs;
  options.overlap_steps = !args.no_overlap_steps;
  options.tune_gemms = args.tune_gemms;
  options.mixed_steps = args.mixed_steps;
  options.tensor_parallel = args.tensor_parallel;
  options.speculative = args.speculative;
  options.weights = weight_load_options(args);
  if (args.tensor_parallel > 1) {
    const int gpus = cuda_device_count();
    DF_CHECK(args.tensor_parallel <= gpus, "--tp " + std::to_string(args.tensor_parallel) + " needs " +
                                               std::to_string(args.tensor_parallel) + " GPUs; this machine has " +
                                               std::to_string(gpus));
  }
  for (const std::string& text : args.plan_overrides) {
    try {
      for (PlanOverride& o : parse_plan_overrides(text)) options.plan_overrides.push_back(std::move(o));
    } catch (const Error& e) {
      throw Error("--plan-override '" + text + "': " + e.what());
    }
  }
  if (!args.no_tuning_cache)
    options.tuning_cache = args.tuning_cache.empty() ? default_tuning_cache() : std::filesystem::path(args.tuning_cache);
  // A cache named on the command line must be a readable file where it exists (a corrupt one is
  // only ignored, with a notice, by the engine).
  if (!args.tuning_cache.empty() && std::filesystem::exists(options.tuning_cache)) {
    std::ifstream in(options.tuning_cache);
    DF_CHECK(std::filesystem::is_regular_file(options.tuning_cache) && in.good(),
             "--tuning-cache " + options.tuning_cache.string() + ": not a readable file");
  }
  return options;
}

std::string describe_steps(const EngineOptions& options) {
  const std::string chunk = std::to_string(options.prefill_chunk);
  if (options.mixed_steps)
    return "steps: mixed (prompt chunks and the decode rows in one eager pass, at most " + chunk +
           " prompt tokens per step; decode rows alone: the bucket's graph)";
  return "steps: separate (prompt chunks in passes of up to " + chunk +
         " tokens the decode rows sit out, then the decode step; --mixed-steps joins them)";
}

LoadProgress stderr_progress_bar() {
  if (!isatty(STDERR_FILENO)) return {};
  struct State {
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    int drawn_percent = -1;
  };
  auto state = std::make_shared<State>();
  return [state](size_t done, size_t total) {
    const int percent = total == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(done) / total);
    if (percent == state->drawn_percent) return;  // redraw only when the bar moves
    state->drawn_percent = percent;
    constexpr int kWidth = 30;
    const int filled = percent * kWidth / 100;
    std::fprintf(stderr, "\rloading weights [%.*s%*s] %3d%%  %.2f / %.2f GB", filled, "##############################",
                 kWidth - filled, "", percent, done / 1e9, total / 1e9);
    if (done >= total) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - state->start).count();
      std::fprintf(stderr, "\r\033[Kloaded %.2f GB of weights in %.1f s\n", total / 1e9, seconds);
    }
    std::fflush(stderr);
  };
}

void clear_progress_bar() {
  if (!isatty(STDERR_FILENO)) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

}  // namespace deepfuse::cli
