// The profiler's entry points into an Engine (deepfuse tune), kept out of the public API: an
// engine whose weights hold every layout a candidate may need, and the time of one bucket's
// captured decode step under a candidate bucket plan.
#pragma once

#include <filesystem>

#include "deepfuse/engine.hpp"
#include "scheduler/tuning_cache.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse::runtime {

class EngineTuning {
 public:
  // Like Engine::with_random_weights / from_checkpoint, with every layout (both MLP variants, the
  // packed front and o_proj) wherever a candidate could use it, attention workspace for every
  // attention candidate, and the built-in plan (options.tuning_cache is not read).
  static Engine with_random_weights(const ModelConfig& config, EngineOptions options, uint64_t seed);
  static Engine from_checkpoint(const std::filesystem::path& model_dir, EngineOptions options,
                                const LoadProgress& progress);

  // Milliseconds per decode step of bucket.batch sequences whose caches hold `context` keys, the
  // bucket's step running `bucket`: captured, then replayed `replays` times back to back (the
  // GPU's time alone, weights streaming from HBM as the step reads them). Infinity when the
  // candidate's attention needs more workspace than the engine holds. The engine's plan is left
  // as it was; no sequence may be running.
  static double time_bucket(Engine& engine, const BucketPlan& bucket, int context, int replays);

  // The longest cache (at most `limit` keys, whole pages) that `batch` timed sequences can each
  // hold in the engine's KV pool within max_context.
  static int longest_timed_context(const Engine& engine, int batch, int limit);

  static scheduler::GpuInfo gpu(const Engine& engine);
  static scheduler::PlanShape plan_shape(const Engine& engine);
  static scheduler::TuningKey key(const Engine& engine);

 private:
  static size_t attention_candidates_workspace(const Engine::Impl& s);
  static void prepare(Engine::Impl& s);
};

}  // namespace deepfuse::runtime
