// The plan's JSON form, shared by the tuning cache and benchmark results. Reading is strict: an
// unknown key or choice name is an error, so a plan written by another version never runs as
// something it did not say.
#include <nlohmann/json.hpp>

#include "deepfuse/error.hpp"
#include "scheduler/plan_json.hpp"
#include "scheduler/tuning_cache.hpp"

namespace deepfuse::scheduler {

namespace {

using nlohmann::json;

const json& field(const json& object, const char* name, const char* where) {
  DF_CHECK(object.contains(name), std::string("decode plan JSON: ") + where + " has no '" + name + "'");
  return object.at(name);
}

void only_keys(const json& object, std::initializer_list<const char*> keys, const char* where) {
  DF_CHECK(object.is_object(), std::string("decode plan JSON: ") + where + " is not an object");
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const char* k : keys) known = known || key == k;
    DF_CHECK(known, std::string("decode plan JSON: unknown key '") + key + "' in " + where);
  }
}

int int_from(const json& value, const char* name) {
  DF_CHECK(value.is_number_integer(), std::string("decode plan JSON: ") + name + " is not an integer");
  return value.get<int>();
}

}  // namespace

nlohmann::json plan_json(const DecodePlan& plan) {
  json buckets = json::array();
  for (const BucketPlan& b : plan.buckets) {
    const AttentionChoice& a = b.attention;
    buckets.push_back({{"batch", b.batch},
                       {"mlp", choice_name(b.mlp)},
                       {"front", choice_name(b.front)},
                       {"o_proj", choice_name(b.o_proj)},
                       {"attention",
                        {{"splits", a.splits},
                         {"warps", a.warps},
                         {"merge", choice_name(a.merge)},
                         {"short_context", a.short_context}}}});
    if (plan.tensor_parallel > 1) buckets.back()["all_reduce"] = choice_name(b.all_reduce);
    // Absent means bf16 (plans from before FP8 GEMMs read as they were written).
    if (b.gemm != GemmChoice::bf16) buckets.back()["gemm"] = choice_name(b.gemm);
  }
  json j = {{"source", plan.source}, {"prefill_mlp", choice_name(plan.prefill_mlp)}, {"buckets", buckets}};
  if (plan.prefill_gemm != GemmChoice::bf16) j["prefill_gemm"] = choice_name(plan.prefill_gemm);
  if (plan.tensor_parallel > 1) j["tensor_parallel"] = plan.tensor_parallel;
  return j;
}

DecodePlan plan_from_json_value(const nlohmann::json& j) {
  only_keys(j, {"source", "prefill_mlp", "prefill_gemm", "buckets", "tensor_parallel"}, "the plan");
  DecodePlan plan;
  const json& source = field(j, "source", "the plan");
  DF_CHECK(source.is_string(), "decode plan JSON: source is not a string");
  plan.source = source.get<std::string>();
  plan.prefill_mlp = choice_from_json<MlpChoice>(field(j, "prefill_mlp", "the plan"), "prefill_mlp");
  if (j.contains("prefill_gemm")) plan.prefill_gemm = choice_from_json<GemmChoice>(j["prefill_gemm"], "prefill_gemm");
  if (j.contains("tensor_parallel")) plan.tensor_parallel = int_from(j["tensor_parallel"], "tensor_parallel");
  const json& buckets = field(j, "buckets", "the plan");
  DF_CHECK(buckets.is_array(), "decode plan JSON: buckets is not an array");
  for (const json& b : buckets) {
    only_keys(b, {"batch", "mlp", "front", "o_proj", "gemm", "attention", "all_reduce"}, "a bucket");
    BucketPlan bucket;
    bucket.batch = int_from(field(b, "batch", "a bucket"), "batch");
    bucket.mlp = choice_from_json<MlpChoice>(field(b, "mlp", "a bucket"), "mlp");
    bucket.front = choice_from_json<FrontChoice>(field(b, "front", "a bucket"), "front");
    bucket.o_proj = choice_from_json<OProjChoice>(field(b, "o_proj", "a bucket"), "o_proj");
    const json& a = field(b, "attention", "a bucket");
    only_keys(a, {"splits", "warps", "merge", "short_context"}, "a bucket's attention");
    bucket.attention.splits = int_from(field(a, "splits", "attention"), "attention.splits");
    bucket.attention.warps = int_from(field(a, "warps", "attention"), "attention.warps");
    bucket.attention.merge = choice_from_json<kernels::SplitMerge>(field(a, "merge", "attention"), "attention.merge");
    const json& short_context = field(a, "short_context", "attention");
    DF_CHECK(short_context.is_boolean(), "decode plan JSON: attention.short_context is not true or false");
    bucket.attention.short_context = short_context.get<bool>();
    if (b.contains("gemm")) bucket.gemm = choice_from_json<GemmChoice>(b["gemm"], "gemm");
    if (b.contains("all_reduce"))
      bucket.all_reduce = choice_from_json<AllReduceChoice>(b["all_reduce"], "all_reduce");
    plan.buckets.push_back(bucket);
  }
  return plan;
}

std::string plan_to_json(const DecodePlan& plan) { return plan_json(plan).dump(2); }

DecodePlan plan_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error("decode plan JSON: corrupt at byte " + std::to_string(e.byte));
  }
  return plan_from_json_value(j);
}

}  // namespace deepfuse::scheduler
