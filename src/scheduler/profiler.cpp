// The tuner's choice logic (docs/scheduler.md, "The profiler"). Per bucket: time the starting
// choices; then, one op at a time (mlp, front, o_proj, gemm, attention), time each supported alternative
// with the other ops at their best so far, and keep the fastest only if it beats the incumbent by
// more than min_gain; finally time the starting bucket and the combined winners back to back and
// keep the combination only if it still wins by min_gain. Ops are tuned greedily in that order
// because the MLP is the largest share of a step and the front decides what o_proj may be; the
// final comparison guards against winners that interact (e.g. the GEMV's deferred MLP sum).
#include "scheduler/profiler.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "deepfuse/error.hpp"

namespace deepfuse::scheduler {

namespace {

std::string describe_bucket(const BucketPlan& b) {
  return std::string("mlp=") + choice_name(b.mlp) + " front=" + choice_name(b.front) + " o_proj=" +
         choice_name(b.o_proj) + " gemm=" + choice_name(b.gemm) + " attention: " + describe(b.attention);
}

class BucketTuner {
 public:
  BucketTuner(const PlanShape& shape, const GpuInfo& gpu, int max_context, const StepTimer& time_step,
              double min_gain, std::vector<Trial>& trials)
      : shape_(shape), gpu_(gpu), max_context_(max_context), time_step_(time_step), min_gain_(min_gain),
        trials_(trials) {}

  // The alternatives to the incumbent each op would time, at most (o_proj's depend on the front
  // chosen: one at most). For the progress total.
  int planned_timings(const BucketPlan& start) const {
    return 1 + static_cast<int>(mlp_alternatives(start).size() + front_alternatives(start).size()) + 1 +
           static_cast<int>(gemm_alternatives(start).size() + attention_alternatives(start).size()) + 2;
  }

  BucketPlan tune(const BucketPlan& start, const std::function<void()>& timed) {
    timed_ = timed;
    const size_t first = trials_.size();
    best_ = start;
    best_ms_ = time(start, "built-in", describe_bucket(start));

    consider("mlp", [&] {
      std::vector<std::pair<BucketPlan, std::string>> options;
      for (MlpChoice c : mlp_alternatives(best_))
        options.push_back({with(best_, [&](BucketPlan& b) { b.mlp = c; }), choice_name(c)});
      return options;
    });
    consider("front", [&] {
      std::vector<std::pair<BucketPlan, std::string>> options;
      for (FrontChoice c : front_alternatives(best_)) {
        BucketPlan b = with(best_, [&](BucketPlan& p) { p.front = c; });
        std::string name = choice_name(c);
        // The GEMV needs the fused front: an unfused front is timed with cuBLASLt o_proj.
        if (!why_unsupported(b.o_proj, b.front, shape_, b.batch, gpu_).empty()) {
          b.o_proj = OProjChoice::cublaslt;
          name += " (o_proj cublaslt)";
        }
        options.push_back({b, name});
      }
      return options;
    });
    consider("o_proj", [&] {
      std::vector<std::pair<BucketPlan, std::string>> options;
      for (OProjChoice c : o_proj_candidates())
        if (c != best_.o_proj && why_unsupported(c, best_.front, shape_, best_.batch, gpu_).empty())
          options.push_back({with(best_, [&](BucketPlan& b) { b.o_proj = c; }), choice_name(c)});
      return options;
    });
    consider("gemm", [&] {
      std::vector<std::pair<BucketPlan, std::string>> options;
      for (GemmChoice c : gemm_alternatives(best_))
        options.push_back({with(best_, [&](BucketPlan& b) { b.gemm = c; }), choice_name(c)});
      return options;
    });
    consider("attention", [&] {
      std::vector<std::pair<BucketPlan, std::string>> options;
      for (const AttentionChoice& c : attention_alternatives(best_))
        options.push_back({with(best_, [&](BucketPlan& b) { b.attention = c; }), describe(c)});
      return options;
    });

    if (best_ == start) {
      trials_[first].chosen = true;
      return start;
    }
    // Confirm end to end, the two timed back to back so both see the same clocks.
    const double start_ms = time(start, "built-in", describe_bucket(start));
    const double combined_ms = time(best_, "combined", describe_bucket(best_));
    const bool keep = combined_ms < start_ms * (1.0 - min_gain_);
    for (size_t i = first; i + 2 < trials_.size(); ++i) trials_[i].chosen = trials_[i].chosen && keep;
    trials_[trials_.size() - (keep ? 1 : 2)].chosen = true;
    return keep ? best_ : start;
  }

 private:
  template <typename Change>
  static BucketPlan with(BucketPlan bucket, Change change) {
    change(bucket);
    return bucket;
  }

  std::vector<MlpChoice> mlp_alternatives(const BucketPlan& b) const {
    std::vector<MlpChoice> out;
    for (MlpChoice c : mlp_candidates())
      if (c != b.mlp && why_unsupported(c, shape_, b.batch, gpu_).empty()) out.push_back(c);
    return out;
  }
  std::vector<FrontChoice> front_alternatives(const BucketPlan& b) const {
    std::vector<FrontChoice> out;
    for (FrontChoice c : front_candidates())
      if (c != b.front && why_unsupported(c, shape_, b.batch, gpu_).empty()) out.push_back(c);
    return out;
  }
  // Only where the bucket runs a cuBLASLt projection (else the GEMMs' choice changes nothing).
  std::vector<GemmChoice> gemm_alternatives(const BucketPlan& b) const {
    std::vector<GemmChoice> out;
    const bool any_gemm =
        b.mlp == MlpChoice::unfused || b.front == FrontChoice::unfused || b.o_proj == OProjChoice::cublaslt;
    for (GemmChoice c : gemm_candidates())
      if (any_gemm && c != b.gemm && why_unsupported(c, shape_, gpu_).empty()) out.push_back(c);
    return out;
  }
  // The registry's attention shapes, with the incumbent's short_context: the profiler times one
  // context, at which the short-context plan would not run, so it cannot judge that flag.
  std::vector<AttentionChoice> attention_alternatives(const BucketPlan& b) const {
    std::vector<AttentionChoice> out;
    for (AttentionChoice c : attention_candidates(shape_, b.batch, gpu_, max_context_)) {
      c.short_context = b.attention.short_context;
      if (c != b.attention && std::find(out.begin(), out.end(), c) == out.end() &&
          why_unsupported(c, shape_, b.batch, gpu_, max_context_).empty())
        out.push_back(c);
    }
    return out;
  }

  double time(const BucketPlan& bucket, const std::string& op, const std::string& variant) {
    const double ms = time_step_(bucket);
    DF_CHECK(std::isfinite(ms) && ms > 0.0, "step timer returned " + std::to_string(ms) + " ms for bucket " +
                                                std::to_string(bucket.batch) + " (" + op + " " + variant + ")");
    trials_.push_back({bucket.batch, op, variant, ms, false});
    if (timed_) timed_();
    return ms;
  }

  // Times each option; the fastest replaces the incumbent when it wins by more than min_gain.
  template <typename Options>
  void consider(const std::string& op, Options options_of) {
    std::optional<size_t> winner;
    double winner_ms = best_ms_ * (1.0 - min_gain_);
    BucketPlan winner_bucket;
    for (const auto& [bucket, name] : options_of()) {
      const double ms = time(bucket, op, name);
      if (ms < winner_ms) winner = trials_.size() - 1, winner_ms = ms, winner_bucket = bucket;
    }
    if (!winner) return;
    trials_[*winner].chosen = true;
    best_ = winner_bucket;
    best_ms_ = winner_ms;
  }

  const PlanShape& shape_;
  const GpuInfo& gpu_;
  int max_context_;
  const StepTimer& time_step_;
  double min_gain_;
  std::vector<Trial>& trials_;
  std::function<void()> timed_;
  BucketPlan best_;
  double best_ms_ = 0.0;
};

}  // namespace

TuneResult tune_plan(const DecodePlan& start, const PlanShape& shape, const GpuInfo& gpu, const StepTimer& time_step,
                     double min_gain, const std::function<void(int, int)>& progress) {
  return tune_plan(start, shape, gpu, 0, time_step, min_gain, progress);
}

TuneResult tune_plan(const DecodePlan& start, const PlanShape& shape, const GpuInfo& gpu, int max_context,
                     const StepTimer& time_step, double min_gain, const std::function<void(int, int)>& progress) {
  DF_CHECK(static_cast<bool>(time_step), "tune_plan needs a step timer");
  DF_CHECK(min_gain >= 0.0 && min_gain < 1.0, "tune_plan: min_gain " + std::to_string(min_gain) + " is outside [0, 1)");
  DF_CHECK(max_context >= 0, "tune_plan: max_context " + std::to_string(max_context) + " is negative");
  check_plan(start, shape, gpu);

  TuneResult result;
  result.plan = start;
  BucketTuner tuner(shape, gpu, max_context, time_step, min_gain, result.trials);
  int total = 0, done = 0, reported_total = 0;
  for (const BucketPlan& bucket : start.buckets) total += tuner.planned_timings(bucket);
  for (BucketPlan& bucket : result.plan.buckets) {
    const int planned = tuner.planned_timings(bucket);
    const int before = done;
    bucket = tuner.tune(bucket, [&] {
      ++done;
      reported_total = total;
      if (progress) progress(done, total);
    });
    total -= planned - (done - before);
  }
  if (progress && reported_total != total) progress(done, total);  // the bar ends full
  return result;
}

}  // namespace deepfuse::scheduler
