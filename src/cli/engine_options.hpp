// The flags that choose and shape a backend, shared by generate and score: which backend runs
// (reference on the CPU, cuda on the GPU, auto = cuda when a device is present), and the CUDA
// engine's options (batch, context, KV cache size, graphs, MLP variant).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "deepfuse/engine.hpp"
#include "deepfuse/model_config.hpp"

namespace deepfuse::cli {

enum class Backend { reference, cuda };

const char* backend_name(Backend backend);

// "reference", "cuda" or "auto". Throws deepfuse::Error for an unknown name and for "cuda" on a
// machine without a CUDA device; "auto" falls back to the reference backend there.
Backend resolve_backend(const std::string& name);

// Why the CUDA kernels cannot run `config` (head_dim other than 64 or 128, hidden or intermediate
// size not a multiple of 64), or an empty string when they can. `auto` uses it to fall back to the
// reference backend; an explicit `--backend cuda` leaves the verdict to the engine.
std::string cuda_unsupported_reason(const ModelConfig& config);

// The CUDA engine's flags as given; engine_options() checks and converts them.
struct EngineArgs {
  int max_batch = 1;             // generate and score run one sequence
  int max_context = 0;           // 0: the model's max_position_embeddings
  size_t kv_cache_mb = 0;        // 0: the engine's default share of free GPU memory
  bool no_cuda_graphs = false;
  bool no_overlap_steps = false;
  std::string mlp_variant = "fused";
  int fused_mlp_max_tokens = EngineOptions{}.fused_mlp_max_tokens;
  bool tune_gemms = false;
};

// Adds --max-batch, --max-context, --kv-cache-mb, --no-cuda-graphs, --no-overlap-steps, --mlp-variant,
// --fused-mlp-max-tokens and --tune-gemms.
void add_engine_options(CLI::App& command, EngineArgs& args);

// Throws deepfuse::Error naming the flag on a bad value (e.g. an unknown --mlp-variant).
EngineOptions engine_options(const EngineArgs& args);

// Draws "loading weights [#####     ]  52%  1.2 / 2.3 GB" on stderr while weights load, when
// stderr is a terminal (logs and tests see nothing); clears the line when done.
LoadProgress stderr_progress_bar();

// Clears a half-drawn progress bar (loading failed), so the error message starts its own line.
void clear_progress_bar();

}  // namespace deepfuse::cli
