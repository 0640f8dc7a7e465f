#include "runtime/tuner.hpp"

#include <cstdio>
#include <ctime>
#include <map>

#include "deepfuse/error.hpp"
#include "runtime/engine_tuning.hpp"

namespace deepfuse::runtime {

namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

}  // namespace

TuneOutcome tune(Engine& engine, const TuneOptions& options) {
  DF_CHECK(options.context >= 1 && options.context + 8 <= engine.options().max_context,
           "tuning context " + std::to_string(options.context) + " must leave room for the timed steps within max_context " +
               std::to_string(engine.options().max_context));
  const scheduler::GpuInfo gpu = EngineTuning::gpu(engine);
  const scheduler::PlanShape shape = EngineTuning::plan_shape(engine);
  TuneOutcome outcome;
  outcome.builtin = engine.plan();
  const scheduler::StepTimer timer = [&](const BucketPlan& bucket) {
    double ms = EngineTuning::time_bucket(engine, bucket, options.context, options.replays);
    const int long_context = EngineTuning::longest_timed_context(engine, bucket.batch, options.long_context);
    if (long_context > options.context) ms += EngineTuning::time_bucket(engine, bucket, long_context, options.replays);
    return ms;
  };
  scheduler::TuneResult result =
      scheduler::tune_plan(outcome.builtin, shape, gpu, engine.options().max_context, timer, options.min_gain,
                          options.progress);
  outcome.tuned = std::move(result.plan);
  outcome.tuned.source = "tuned " + utc_now() + " (" + gpu.name + ")";
  outcome.trials = std::move(result.trials);
  return outcome;
}

std::string trials_table(const std::vector<scheduler::Trial>& trials) {
  std::string out = "bucket  op         variant                            ms (short + long cache)   chosen\n";
  char line[192];
  for (const scheduler::Trial& t : trials) {
    std::snprintf(line, sizeof line, "%6d  %-9s  %-33s  %8.4f   %s\n", t.batch, t.op.c_str(), t.variant.c_str(), t.ms,
                  t.chosen ? "*" : "");
    out += line;
  }
  return out;
}

}  // namespace deepfuse::runtime
