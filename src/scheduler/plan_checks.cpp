// Whole-plan checks and `--plan-override`: both go through the registry's rules (variants.cpp), so
// a plan from the cache, a file or the command line is refused with one line naming the bucket,
// the op and the reason before the engine loads a weight.
#include <charconv>
#include <optional>
#include <string>

#include "deepfuse/error.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse::scheduler {

namespace {

// Prefill chunks are hundreds of tokens (EngineOptions::prefill_chunk, 1024 by default); every
// rule that depends on tokens treats anything above 32 alike (the fused MLP's 32-token passes).
constexpr int kPrefillTokens = 1024;

std::string bucket_text(const BucketPlan& bucket) { return "bucket " + std::to_string(bucket.batch); }

// Empty when every choice of `bucket` is supported; else "<op>=<choice>: <reason>".
std::string bucket_problem(const BucketPlan& bucket, const PlanShape& shape, const GpuInfo& gpu) {
  const int tokens = bucket.batch;
  if (std::string why = why_unsupported(bucket.mlp, shape, tokens, gpu); !why.empty())
    return std::string("mlp=") + choice_name(bucket.mlp) + ": " + why;
  if (std::string why = why_unsupported(bucket.front, shape, tokens, gpu); !why.empty())
    return std::string("front=") + choice_name(bucket.front) + ": " + why;
  if (std::string why = why_unsupported(bucket.o_proj, bucket.front, shape, tokens, gpu); !why.empty())
    return std::string("o_proj=") + choice_name(bucket.o_proj) + ": " + why;
  if (std::string why = why_unsupported(bucket.gemm, shape, gpu); !why.empty())
    return std::string("gemm=") + choice_name(bucket.gemm) + ": " + why;
  if (std::string why = why_unsupported(bucket.attention, shape, tokens, gpu); !why.empty())
    return "attention " + describe(bucket.attention) + ": " + why;
  return "";
}

std::string bucket_list(const DecodePlan& plan) {
  std::string text;
  for (const BucketPlan& bucket : plan.buckets) text += (text.empty() ? "" : ", ") + std::to_string(bucket.batch);
  return text;
}

int count_of(const PlanOverride& o) {
  if (o.value == "auto") return 0;
  int value = 0;
  const auto [end, error] = std::from_chars(o.value.data(), o.value.data() + o.value.size(), value);
  if (error != std::errc() || end != o.value.data() + o.value.size() || value < 0)
    throw Error("plan override '" + o.text + "': bad value '" + o.value + "' for " + o.op);
  return value;
}

// Sets one op of one bucket from an override.
void set_choice(BucketPlan& bucket, const PlanOverride& o) {
  if (o.op == "mlp") {
    bucket.mlp = override_choice<MlpChoice>(o);
  } else if (o.op == "front") {
    bucket.front = override_choice<FrontChoice>(o);
    // The GEMV cannot run without the fused front, so asking for the unfused front asks for
    // cuBLASLt o_proj too; the other way round stays an error (below), never a silent change.
    if (bucket.front == FrontChoice::unfused) bucket.o_proj = OProjChoice::cublaslt;
  } else if (o.op == "o_proj") {
    bucket.o_proj = override_choice<OProjChoice>(o);
  } else if (o.op == "gemm") {
    bucket.gemm = override_choice<GemmChoice>(o);
  } else if (o.op == "attention.splits") {
    bucket.attention.splits = count_of(o);
  } else if (o.op == "attention.warps") {
    bucket.attention.warps = count_of(o);
  } else if (o.op == "attention.merge") {
    bucket.attention.merge = override_choice<kernels::SplitMerge>(o);
  } else if (o.op == "attention.short_context") {
    if (o.value != "on" && o.value != "off")
      throw Error("plan override '" + o.text + "': bad value '" + o.value + "' for " + o.op);
    bucket.attention.short_context = o.value == "on";
  } else if (o.op == "all_reduce") {
    bucket.all_reduce = override_choice<AllReduceChoice>(o);
  } else {
    throw Error("plan override '" + o.text + "': unknown op '" + o.op + "'");
  }
}

}  // namespace

void check_plan(const DecodePlan& plan, const PlanShape& shape, const GpuInfo& gpu) {
  DF_CHECK(!plan.buckets.empty(), "decode plan (" + plan.source + ") has no buckets");
  int previous = 0;
  for (const BucketPlan& bucket : plan.buckets) {
    DF_CHECK(bucket.batch > previous, "decode plan (" + plan.source + "): buckets must be ascending and distinct (" +
                                          bucket_list(plan) + ")");
    previous = bucket.batch;
    const std::string problem = bucket_problem(bucket, shape, gpu);
    DF_CHECK(problem.empty(), "decode plan (" + plan.source + "): " + bucket_text(bucket) + ", " + problem);
  }
  const std::string prefill = why_unsupported(plan.prefill_mlp, shape, kPrefillTokens, gpu);
  DF_CHECK(prefill.empty(), "decode plan (" + plan.source + "): prefill.mlp=" + choice_name(plan.prefill_mlp) +
                                ": " + prefill);
  const std::string prefill_gemm = why_unsupported(plan.prefill_gemm, shape, gpu);
  DF_CHECK(prefill_gemm.empty(), "decode plan (" + plan.source + "): prefill.gemm=" +
                                     choice_name(plan.prefill_gemm) + ": " + prefill_gemm);
}

DecodePlan apply_overrides(DecodePlan plan, const std::vector<PlanOverride>& overrides, const PlanShape& shape,
                           const GpuInfo& gpu) {
  if (overrides.empty()) return plan;
  std::string applied;
  for (const PlanOverride& o : overrides) {
    auto fail = [&](const std::string& why) { throw Error("plan override '" + o.text + "': " + why); };
    applied += (applied.empty() ? "" : ",") + o.text;
    if (o.op == "prefill.mlp") {
      plan.prefill_mlp = override_choice<MlpChoice>(o);
      if (std::string why = why_unsupported(plan.prefill_mlp, shape, kPrefillTokens, gpu); !why.empty())
        fail("prefill: " + why);
      continue;
    }
    if (o.op == "prefill.gemm") {
      plan.prefill_gemm = override_choice<GemmChoice>(o);
      if (std::string why = why_unsupported(plan.prefill_gemm, shape, gpu); !why.empty()) fail("prefill: " + why);
      continue;
    }
    bool matched = false;
    for (BucketPlan& bucket : plan.buckets) {
      if (o.bucket && *o.bucket != bucket.batch) continue;
      matched = true;
      set_choice(bucket, o);
      if (const std::string problem = bucket_problem(bucket, shape, gpu); !problem.empty())
        fail(bucket_text(bucket) + ", " + problem);
    }
    if (!matched && !o.bucket) fail("the plan has no buckets");
    if (!matched) fail(std::to_string(*o.bucket) + " is not one of the plan's buckets (" + bucket_list(plan) + ")");
    // `mlp=` without a bucket covers prefill too, as the command line's help says.
    if (o.op == "mlp" && !o.bucket) {
      plan.prefill_mlp = override_choice<MlpChoice>(o);
      if (std::string why = why_unsupported(plan.prefill_mlp, shape, kPrefillTokens, gpu); !why.empty())
        fail("prefill: " + why);
    }
    if (o.op == "gemm" && !o.bucket) plan.prefill_gemm = override_choice<GemmChoice>(o);  // checked with the buckets
  }
  plan.source += " + overrides " + applied;
  return plan;
}

}  // namespace deepfuse::scheduler
