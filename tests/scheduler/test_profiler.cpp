// The profiler's choice logic with an injected step timer: a table of made-up step times stands in
// for the GPU, so each rule (faster wins, min_gain, the GEMV needing the fused front, the end-to-end
// confirmation) is checked on its own.
#include <gtest/gtest.h>

#include <map>

#include "deepfuse/kernels/decode_attention.hpp"
#include "model/model_test_util.hpp"
#include "scheduler/builtin_plans.hpp"
#include "scheduler/profiler.hpp"
#include "scheduler/scheduler_test_util.hpp"

namespace deepfuse {
namespace {

using namespace scheduler;
using testing::expect_error;

const PlanShape& llama() {
  static const PlanShape shape = testing::model_shapes()[0].shape;
  return shape;
}

DecodePlan start_plan(std::vector<int> buckets) { return builtin_plan(llama(), testing::h100(), buckets); }

// Step time = 10 ms + the table's cost of each choice that differs from the built-in's, per
// bucket; every timed bucket must be one the registry supports.
struct FakeTimer {
  std::map<std::string, double> cost;  // "mlp=unfused", "front=unfused", "o_proj=cublaslt", "warps=4", ...
  std::function<double(const BucketPlan&, double)> adjust;  // optional: a last word on each time
  std::vector<BucketPlan> timed;

  double operator()(const BucketPlan& b) {
    EXPECT_EQ(why_unsupported(b.o_proj, b.front, llama(), b.batch, testing::h100()), "")
        << "timed an unsupported bucket";
    timed.push_back(b);
    double ms = 10.0;
    auto add = [&](const std::string& name) {
      if (auto it = cost.find(name); it != cost.end()) ms += it->second;
    };
    add(std::string("mlp=") + choice_name(b.mlp));
    add(std::string("front=") + choice_name(b.front));
    add(std::string("o_proj=") + choice_name(b.o_proj));
    add("warps=" + std::to_string(b.attention.warps));
    add("splits=" + std::to_string(b.attention.splits));
    add(std::string("merge=") + choice_name(b.attention.merge));
    return adjust ? adjust(b, ms) : ms;
  }
  StepTimer timer() {
    return [this](const BucketPlan& b) { return (*this)(b); };
  }
};

TEST(Profiler, PicksTheFasterVariants) {
  FakeTimer fake;
  fake.cost = {{"mlp=fused", -0.5}, {"warps=4", -0.2}};  // at bucket 16 the fused MLP wins here
  const DecodePlan start = start_plan({1, 16});
  const TuneResult result = tune_plan(start, llama(), testing::h100(), fake.timer());
  EXPECT_EQ(result.plan.bucket_for(16).mlp, MlpChoice::fused);
  EXPECT_EQ(result.plan.bucket_for(16).attention.warps, 4);
  EXPECT_EQ(result.plan.bucket_for(1).mlp, MlpChoice::fused);  // already the start's
  EXPECT_EQ(result.plan.bucket_for(1).attention.warps, 4);
  EXPECT_EQ(result.plan.bucket_for(1).o_proj, OProjChoice::gemv);
  EXPECT_EQ(result.trials.size(), fake.timed.size());  // every timing is a trial
  EXPECT_NO_THROW(check_plan(result.plan, llama(), testing::h100()));
}

TEST(Profiler, KeepsTheIncumbentUnlessTheGainExceedsMinGain) {
  for (const auto& [gain_ms, taken] : std::vector<std::pair<double, bool>>{{-0.02, false}, {-0.05, true}}) {
    FakeTimer fake;
    fake.cost = {{"o_proj=cublaslt", gain_ms}};  // 0.2% and 0.5% of 10 ms
    const TuneResult result = tune_plan(start_plan({1}), llama(), testing::h100(), fake.timer(), 0.003);
    EXPECT_EQ(result.plan.buckets[0].o_proj, taken ? OProjChoice::cublaslt : OProjChoice::gemv) << gain_ms;
  }
}

TEST(Profiler, TheGemvNeedsTheFusedFront) {
  FakeTimer fake;
  // The unfused front wins, and the GEMV is the fastest o_proj: it still cannot follow.
  fake.cost = {{"front=unfused", -1.0}, {"o_proj=cublaslt", 0.3}};
  const TuneResult result = tune_plan(start_plan({1, 8}), llama(), testing::h100(), fake.timer());
  for (const BucketPlan& b : result.plan.buckets) {
    EXPECT_EQ(b.front, FrontChoice::unfused);
    EXPECT_EQ(b.o_proj, OProjChoice::cublaslt);
  }
  bool timed_with_cublaslt = false;
  for (const Trial& t : result.trials) {
    EXPECT_FALSE(t.op == "o_proj" && t.variant == "gemv" && t.chosen);
    if (t.op == "front") {
      EXPECT_EQ(t.variant, "unfused (o_proj cublaslt)");
      timed_with_cublaslt = true;
    }
  }
  EXPECT_TRUE(timed_with_cublaslt);
  // Once the front is unfused, the GEMV is never timed (FakeTimer checks every timed bucket).
  for (const BucketPlan& b : fake.timed)
    if (b.front == FrontChoice::unfused) {
      EXPECT_EQ(b.o_proj, OProjChoice::cublaslt);
    }
}

TEST(Profiler, KeepsTheStartWhenTheCombinationLosesEndToEnd) {
  FakeTimer fake;
  fake.cost = {{"mlp=unfused", -0.5}, {"warps=4", -0.3}};
  // The two winners together measure slower when timed back to back with the start (per-op
  // winners that interact, or a lucky first timing).
  int combined_timings = 0;
  fake.adjust = [&](const BucketPlan& b, double ms) {
    const bool both = b.mlp == MlpChoice::unfused && b.attention.warps == 4;
    return both && ++combined_timings > 1 ? 10.4 : ms;
  };
  const DecodePlan start = start_plan({1});
  const TuneResult result = tune_plan(start, llama(), testing::h100(), fake.timer());
  EXPECT_EQ(result.plan, start);
  ASSERT_GE(result.trials.size(), 2u);
  const Trial& confirm_start = result.trials[result.trials.size() - 2];
  const Trial& combined = result.trials.back();
  EXPECT_EQ(confirm_start.op, "built-in");
  EXPECT_TRUE(confirm_start.chosen);
  EXPECT_EQ(combined.op, "combined");
  EXPECT_FALSE(combined.chosen);
  EXPECT_DOUBLE_EQ(combined.ms, 10.4);
  for (const Trial& t : result.trials)
    if (t.op != "built-in") {
      EXPECT_FALSE(t.chosen) << t.op << " " << t.variant;  // no op winner is kept
    }
}

TEST(Profiler, KeepsTheCombinationWhenItWinsEndToEnd) {
  FakeTimer fake;
  fake.cost = {{"mlp=unfused", -0.5}, {"warps=4", -0.3}};
  const TuneResult result = tune_plan(start_plan({1}), llama(), testing::h100(), fake.timer());
  EXPECT_EQ(result.plan.buckets[0].mlp, MlpChoice::unfused);
  EXPECT_EQ(result.plan.buckets[0].attention.warps, 4);
  EXPECT_EQ(result.trials.back().op, "combined");
  EXPECT_TRUE(result.trials.back().chosen);
  int chosen_ops = 0;
  for (const Trial& t : result.trials) chosen_ops += t.chosen && (t.op == "mlp" || t.op == "attention");
  EXPECT_EQ(chosen_ops, 2);
}

TEST(Profiler, TimesTheSplitsAroundThePlannerWithAContext) {
  FakeTimer fake;
  const int planned = kernels::plan_decode_attention(1, 32, 8, 128, 8192, 132).splits_per_sequence;
  fake.cost = {{"splits=" + std::to_string(planned * 2), -0.4}};
  const TuneResult result = tune_plan(start_plan({1}), llama(), testing::h100(), 8192, fake.timer());
  EXPECT_EQ(result.plan.buckets[0].attention.splits, planned * 2);
  EXPECT_TRUE(result.plan.buckets[0].attention.short_context);  // the incumbent's, kept
  // Without the context, no split is timed.
  FakeTimer plain;
  for (const Trial& t : tune_plan(start_plan({1}), llama(), testing::h100(), plain.timer()).trials)
    EXPECT_EQ(t.variant.find("splits=" + std::to_string(planned * 2)), std::string::npos);
}

TEST(Profiler, DeterministicWithProgressEndingFull) {
  auto run = [](std::vector<std::pair<int, int>>& calls) {
    FakeTimer fake;
    fake.cost = {{"mlp=unfused", -0.5}, {"front=unfused", 0.4}};
    return tune_plan(start_plan({1, 2, 16, 64}), llama(), testing::h100(), 8192, fake.timer(), 0.003,
                     [&](int done, int total) {
                       calls.push_back({done, total});
                     });
  };
  std::vector<std::pair<int, int>> first_calls, second_calls;
  const TuneResult first = run(first_calls), second = run(second_calls);
  EXPECT_EQ(first.plan, second.plan);
  ASSERT_EQ(first.trials.size(), second.trials.size());
  for (size_t i = 0; i < first.trials.size(); ++i) {
    EXPECT_EQ(first.trials[i].variant, second.trials[i].variant);
    EXPECT_EQ(first.trials[i].chosen, second.trials[i].chosen);
  }
  EXPECT_EQ(first_calls, second_calls);
  ASSERT_FALSE(first_calls.empty());
  for (size_t i = 0; i < first_calls.size(); ++i) EXPECT_LE(first_calls[i].first, first_calls[i].second);
  EXPECT_EQ(first_calls.back().first, static_cast<int>(first.trials.size()));
  EXPECT_EQ(first_calls.back().second, static_cast<int>(first.trials.size()));
}

TEST(Profiler, RefusesAnUnsupportedStartOrABadTimer) {
  DecodePlan start = start_plan({1, 32});
  start.buckets[1].o_proj = OProjChoice::gemv;  // front unfused at 32
  FakeTimer fake;
  expect_error([&] { tune_plan(start, llama(), testing::h100(), fake.timer()); },
               {"bucket 32", "needs the fused front"});
  expect_error([&] { tune_plan(start_plan({1}), llama(), testing::h100(), [](const BucketPlan&) { return -1.0; }); },
               {"step timer returned", "bucket 1"});
  expect_error([&] { tune_plan(start_plan({1}), llama(), testing::h100(), fake.timer(), 1.5); }, {"min_gain"});
}

}  // namespace
}  // namespace deepfuse
