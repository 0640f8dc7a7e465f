#include "runtime/engine_tuning.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/safetensors.hpp"
#include "runtime/engine_bench.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"

namespace deepfuse::runtime {

// The largest attention workspace any candidate of any bucket asks for.
size_t EngineTuning::attention_candidates_workspace(const Engine::Impl& s) {
  const scheduler::PlanShape shape = s.plan_shape();
  size_t bytes = 0;
  for (const BucketPlan& bucket : s.plan.buckets)
    for (const AttentionChoice& choice : scheduler::attention_candidates(shape, bucket.batch, s.gpu, s.options.max_context))
      bytes = std::max(bytes, s.decode_attention_plan(bucket.batch, choice).workspace_bytes);
  return bytes;
}

void EngineTuning::prepare(Engine::Impl& s) {
  s.make_plan(/*all_layouts=*/true);
  s.attention_workspace_floor = attention_candidates_workspace(s);
}

Engine EngineTuning::with_random_weights(const ModelConfig& config, EngineOptions options, uint64_t seed) {
  options.tuning_cache.clear();
  auto impl = std::make_unique<Engine::Impl>(config, options);
  prepare(*impl);
  check_weights_fit(impl->config, impl->layouts, "the tuner's random weights");
  impl->weights = std::make_unique<GpuWeights>(make_random_weights(impl->config, impl->layouts, seed, impl->stream()));
  impl->finish_setup();
  return Engine(RankGroup::single(std::move(impl)));
}

Engine EngineTuning::from_checkpoint(const std::filesystem::path& model_dir, EngineOptions options,
                                     const LoadProgress& progress) {
  options.tuning_cache.clear();
  ModelConfig config = load_model_config(model_dir);
  const Checkpoint checkpoint(model_dir);
  validate_checkpoint(checkpoint, config);
  auto impl = std::make_unique<Engine::Impl>(std::move(config), options);
  prepare(*impl);
  check_weights_fit(impl->config, impl->layouts, model_dir.string());
  impl->weights = std::make_unique<GpuWeights>(
      load_checkpoint_weights(checkpoint, impl->config, impl->layouts, impl->stream(), progress));
  impl->finish_setup();
  return Engine(RankGroup::single(std::move(impl)));
}

double EngineTuning::time_bucket(Engine& engine, const BucketPlan& bucket, int context, int replays) {
  Engine::Impl& s = engine.ranks_->lead();
  s.activate_device();
  DF_CHECK(engine.running_sequences() == 0, "the tuner times buckets on an idle engine");
  const int index = s.lanes[0].graphs->bucket_index(bucket.batch);
  DF_CHECK(s.plan.buckets[index].batch == bucket.batch,
           "batch " + std::to_string(bucket.batch) + " is not one of the engine's decode buckets");
  const BucketPlan saved = s.plan.buckets[index];
  auto use = [&](const BucketPlan& plan) {
    s.plan.buckets[index] = plan;
    s.plan_attention(index);
    for (StepLane& lane : s.lanes) lane.graphs->reset(index);
  };
  use(bucket);
  size_t workspace = s.decode_plans[index].workspace_bytes;
  if (s.short_context_plans[index]) workspace = std::max(workspace, s.short_context_plans[index]->workspace_bytes);
  double ms = std::numeric_limits<double>::infinity();
  if (workspace <= s.buffers->attention_workspace.bytes()) {
    constexpr int kWarmSteps = 3;  // eager, captured, replayed
    std::vector<SequenceId> sequences;
    for (int b = 0; b < bucket.batch; ++b)
      sequences.push_back(EngineBench::add_prefilled(engine, context, kWarmSteps + 2));
    for (int step = 0; step < kWarmSteps; ++step) engine.step();
    ms = EngineBench::decode_replay_ms(engine, replays);
    for (SequenceId id : sequences) engine.remove_sequence(id);
    engine.wait_for_launched_steps();
  }
  use(saved);
  return ms;
}

int EngineTuning::longest_timed_context(const Engine& engine, int batch, int limit) {
  const Engine::Impl& s = engine.ranks_->lead();
  constexpr int kSpare = 16;  // the timed steps' own tokens, and a page boundary's worth
  const int pages_each = s.pool->available_pages() / std::max(batch, 1);
  const int fits = pages_each * kernels::kKvPageSize - kSpare;
  return std::max(0, std::min({limit, fits, s.options.max_context - kSpare}));
}

scheduler::GpuInfo EngineTuning::gpu(const Engine& engine) { return engine.ranks_->lead().gpu; }
scheduler::TuningKey EngineTuning::key(const Engine& engine) { return engine.ranks_->lead().tuning_key(); }
scheduler::PlanShape EngineTuning::plan_shape(const Engine& engine) { return engine.ranks_->lead().plan_shape(); }

}  // namespace deepfuse::runtime
