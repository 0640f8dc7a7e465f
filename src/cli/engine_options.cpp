#include "cli/engine_options.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

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

std::string cuda_unsupported_reason(const ModelConfig& config) {
  if (config.head_dim != 64 && config.head_dim != 128)
    return "head_dim " + std::to_string(config.head_dim) + " (the CUDA kernels take 64 or 128)";
  if (config.hidden_size % 64 != 0 || config.intermediate_size % 64 != 0)
    return "hidden " + std::to_string(config.hidden_size) + " / intermediate " +
           std::to_string(config.intermediate_size) + " (the CUDA kernels need multiples of 64)";
  return "";
}

void add_engine_options(CLI::App& command, EngineArgs& args) {
  const std::string group = "CUDA backend";
  command.add_option("--max-batch", args.max_batch, "largest decode batch the engine is built for (default 1)")
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
  command.add_option("--mlp-variant", args.mlp_variant, "fused | unfused | naive (default fused)")->group(group);
  command
      .add_option("--fused-mlp-max-tokens", args.fused_mlp_max_tokens,
                  "larger steps run the unfused MLP from a second copy of its weights; 0: fused always (default " +
                      std::to_string(args.fused_mlp_max_tokens) + ")")
      ->check(CLI::NonNegativeNumber)
      ->group(group);
  command
      .add_flag("--tune-gemms", args.tune_gemms,
                "time cuBLASLt's suggested algorithms for the decode GEMMs at start-up and keep the fastest")
      ->group(group);
}

EngineOptions engine_options(const EngineArgs& args) {
  EngineOptions options;
  options.max_batch = args.max_batch;
  options.max_context = args.max_context;
  options.kv_cache_bytes = args.kv_cache_mb << 20;
  options.cuda_graphs = !args.no_cuda_graphs;
  options.overlap_steps = !args.no_overlap_steps;
  options.fused_mlp_max_tokens = args.fused_mlp_max_tokens;
  options.tune_gemms = args.tune_gemms;
  try {
    options.mlp_variant = parse_mlp_variant(args.mlp_variant);
  } catch (const Error&) {
    throw Error("--mlp-variant '" + args.mlp_variant + "': unknown MLP variant (fused, unfused, naive)");
  }
  return options;
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
