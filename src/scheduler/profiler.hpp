// The profiler's choice logic, apart from the GPU: given a way to time one decode step of a bucket
// under a bucket plan (the runtime captures that step in a CUDA graph and replays it, the weights
// streaming from HBM as the step reads them), it times every supported candidate of each op in
// turn, keeps each op's winner, then confirms the combined plan end to end against the starting
// (built-in) plan and keeps the faster: per-op winners can interact.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse::scheduler {

// Milliseconds per decode step of bucket.batch sequences under `bucket` (median of several).
using StepTimer = std::function<double(const BucketPlan& bucket)>;

// One timed candidate, for the tuner's table.
struct Trial {
  int batch = 0;
  std::string op;       // "mlp", "front", "o_proj", "attention", "combined", "built-in"
  std::string variant;  // e.g. "unfused", "splits=8 warps=4 merge=workspace"
  double ms = 0.0;
  bool chosen = false;
};

struct TuneResult {
  DecodePlan plan;  // starting plan with each bucket's winners; source left to the caller
  std::vector<Trial> trials;
};

// A candidate must beat the incumbent by more than `min_gain` (a fraction, e.g. 0.003) to replace
// it, so noise does not flip choices. progress(done, total) after each timing.
TuneResult tune_plan(const DecodePlan& start, const PlanShape& shape, const GpuInfo& gpu, const StepTimer& time_step,
                     double min_gain = 0.003, const std::function<void(int, int)>& progress = {});
// ... with the context the attention plans serve (the engine's max_context), which adds the
// planner's splits halved and doubled to the attention candidates (attention_candidates). The
// overload above passes 0: no split candidates. progress's total may shrink as buckets finish
// (a bucket whose ops keep the starting choices skips its end-to-end confirmation).
TuneResult tune_plan(const DecodePlan& start, const PlanShape& shape, const GpuInfo& gpu, int max_context,
                     const StepTimer& time_step, double min_gain = 0.003,
                     const std::function<void(int, int)>& progress = {});

}  // namespace deepfuse::scheduler
