// The flags that choose and shape a backend, shared by generate and score: which backend runs
// (reference on the CPU, cuda on the GPU, auto = cuda when a device is present), and the CUDA
// engine's options (batch, context, KV cache size, graphs, MLP variant).
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/speculative.hpp"

namespace deepfuse::cli {

enum class Backend { reference, cuda };

const char* backend_name(Backend backend);

// "reference", "cuda" or "auto". Throws deepfuse::Error for an unknown name and for "cuda" on a
// machine without a CUDA device; "auto" falls back to the reference backend there.
Backend resolve_backend(const std::string& name);


// The CUDA engine's flags as given; engine_options() checks and converts them.
struct EngineArgs {
  int max_batch = 1;             // generate and score run one sequence
  int max_context = 0;           // 0: the model's max_position_embeddings
  size_t kv_cache_mb = 0;        // 0: the engine's default share of free GPU memory
  bool no_cuda_graphs = false;
  bool no_overlap_steps = false;
  std::vector<std::string> plan_overrides;  // --plan-override, as given
  std::string tuning_cache;                 // --tuning-cache; empty: default_tuning_cache()
  bool no_tuning_cache = false;
  bool tune_gemms = false;
  bool mixed_steps = false;                 // --mixed-steps / --no-mixed-steps (serve: on by default)
  int tensor_parallel = 1;                  // --tp
  std::string quantize;                     // --quantize: empty, or "fp8"
  bool quantize_lm_head = false;            // --quantize-lm-head
  // --speculative (add_speculative_option, on the commands that take it): the engine verifies drafts
  SpeculativeChoice speculative = SpeculativeChoice::off;
};

// Why the CUDA kernels cannot run `config` with these flags (head_dim other than 64 or 128,
// hidden or intermediate size not a multiple of 64, FP8 weights from the checkpoint or
// --quantize), or an empty string when they can. `auto` uses it to fall back to the reference
// backend; an explicit `--backend cuda` leaves the verdict to the engine.
std::string cuda_unsupported_reason(const ModelConfig& config, const EngineArgs& args);

// --quantize / --quantize-lm-head as the reference loader's options. Throws deepfuse::Error
// naming the flag for an unknown format or --quantize-lm-head alone.
WeightLoadOptions weight_load_options(const EngineArgs& args);

// A --weights value: "bf16", "fp8" (fp8_e4m3: per-channel FP8, what --quantize fp8 makes),
// "fp8-block128" (fp8_e4m3_block128: a scale per 128x128 block, as make-model --dtype
// fp8-block128 writes) or a format's full name. Throws deepfuse::Error naming the flag and the
// known values.
WeightFormat parse_weights_flag(const std::string& value);

// Throws deepfuse::Error unless `backend` runs --quantize (the CUDA backend only where its
// kernels take the format: WeightFormatInfo::implemented).
void check_quantize_backend(const EngineArgs& args, Backend backend);

// Adds --speculative (deepfuse/speculative.hpp's table: off, ngram, suffix; default off), kept as
// given; speculative_choice() reads it.
void add_speculative_option(CLI::App& command, std::string& name);

// The drafter `name` (--speculative's value). Throws deepfuse::Error naming the values for another.
SpeculativeChoice speculative_choice(const std::string& name);

// Adds --max-batch, --max-context, --kv-cache-mb, --no-cuda-graphs, --no-overlap-steps,
// --mixed-steps / --no-mixed-steps, --plan-override, --tuning-cache, --no-tuning-cache,
// --tune-gemms, --tp, --quantize and --quantize-lm-head.
void add_engine_options(CLI::App& command, EngineArgs& args);

// How the engine's steps run prompts next to decode rows (EngineOptions::mixed_steps), one line
// for `inspect --plan`.
std::string describe_steps(const EngineOptions& options);

// Adds --plan-override, --tuning-cache / --no-tuning-cache and --tp alone (bench decode has its
// own engine flags).
void add_plan_options(CLI::App& command, EngineArgs& args);

// Throws deepfuse::Error naming the flag on a bad value (e.g. a malformed --plan-override, --tp
// beyond the GPUs this machine has), before any GPU work.
EngineOptions engine_options(const EngineArgs& args);

// Where `deepfuse tune` saves plans and engines look them up: $XDG_CACHE_HOME/deepfuse/tuning.json,
// else ~/.cache/deepfuse/tuning.json; empty when neither variable is set. (The CLI reads the
// environment; the library never does.)
std::filesystem::path default_tuning_cache();

// Throws deepfuse::Error naming the path when a tuning cache cannot be written there (its folder
// cannot be made, or a file in it cannot be created): `tune` checks before any GPU work.
void check_tuning_cache_writable(const std::filesystem::path& path);

// The plan's one-line cache notice, if any, on stderr.
void print_plan_notice(const Engine& engine);

// Draws "loading weights [#####     ]  52%  1.2 / 2.3 GB" on stderr while weights load, when
// stderr is a terminal (logs and tests see nothing); clears the line when done.
LoadProgress stderr_progress_bar();

// Clears a half-drawn progress bar (loading failed), so the error message starts its own line.
void clear_progress_bar();

}  // namespace deepfuse::cli
