// `deepfuse tune`'s driver: the scheduler's profiler (scheduler/profiler.hpp) run on a tuning
// engine's buckets, and the tuned plan with its table.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/engine.hpp"
#include "scheduler/profiler.hpp"

namespace deepfuse::runtime {

struct TuneOptions {
  // Each candidate is timed at two cache lengths and judged by the sum: a short one, and a long
  // one (as long as the bucket's sequences fit the KV pool, at most long_context), since the
  // attention's forced splits that win at one length can lose at another.
  int context = 1024;       // keys in each timed sequence's cache
  int long_context = 16384;
  int replays = 20;       // graph replays per timing
  double min_gain = 0.003;  // a candidate must be this much faster to replace the incumbent
  std::function<void(int done, int total)> progress;
};

struct TuneOutcome {
  DecodePlan builtin;  // the plan the engine started from
  DecodePlan tuned;    // source: "tuned <UTC time> (<GPU>)"
  std::vector<scheduler::Trial> trials;
};

// `engine` from EngineTuning (every layout held). Leaves its plan as it was.
TuneOutcome tune(Engine& engine, const TuneOptions& options);

// The trials as a table: one row per bucket and op, each candidate's ms, the winner marked.
std::string trials_table(const std::vector<scheduler::Trial>& trials);

}  // namespace deepfuse::runtime
