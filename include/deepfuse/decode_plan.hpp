// The decode plan: for every batch bucket, which variant of each op the decode step runs and with
// what launch parameters. The forward pass, graph capture, launch accounting and weight packing all
// read it; nothing else decides. A plan comes from the built-in rules of the GPU's class, from the
// tuning cache (`deepfuse tune` measured it on this GPU), and from explicit overrides, in that
// order; `source` says which. Each choice's values, names and what they run are its table in
// deepfuse/plan_choices.hpp.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deepfuse/plan_choices.hpp"

namespace deepfuse {

// Decode attention launch parameters; 0 / automatic: the planner's choice for the GPU and context.
struct AttentionChoice {
  int splits = 0;  // splits per sequence
  int warps = 0;   // 4 or 8 warps per block
  kernels::SplitMerge merge = kernels::SplitMerge::automatic;
  bool short_context = true;  // also capture the cluster-merged plan for short sequences

  bool operator==(const AttentionChoice&) const = default;
};

// One bucket's choices.
struct BucketPlan {
  int batch = 0;  // the bucket: steps of up to this many sequences
  MlpChoice mlp = MlpChoice::fused;
  FrontChoice front = FrontChoice::fused;
  OProjChoice o_proj = OProjChoice::gemv;
  GemmChoice gemm = GemmChoice::bf16;  // the cuBLASLt projections' (FP8 weights)
  AttentionChoice attention;
  AllReduceChoice all_reduce = AllReduceChoice::nccl;  // tensor parallel only

  bool operator==(const BucketPlan&) const = default;
};

struct DecodePlan {
  std::vector<BucketPlan> buckets;  // ascending batch; the engine's decode buckets
  MlpChoice prefill_mlp = MlpChoice::unfused;  // prefill chunks (hundreds of tokens)
  GemmChoice prefill_gemm = GemmChoice::bf16;  // prefill chunks' and mixed steps' projections
  // GPUs the model is split over (the plan is one rank's: its shapes are the rank's slice); prefill
  // chunks sum over them with NCCL.
  int tensor_parallel = 1;
  // Where the plan came from, for `inspect --plan`, `bench decode --plan` and results JSON:
  // "built-in (sm_90)", "tuned 2026-11-27T21:40:00Z (NVIDIA H100 80GB HBM3)", "... + overrides mlp@16=unfused".
  std::string source;

  bool operator==(const DecodePlan&) const = default;

  // The bucket serving `sequences` sequences: the smallest holding them (the largest otherwise).
  const BucketPlan& bucket_for(int sequences) const;
  // Whether any bucket (or prefill) runs this variant: the weights then hold its layout.
  bool uses(MlpChoice mlp) const;
  bool uses(FrontChoice front) const;
  bool uses(OProjChoice o_proj) const;
};

// Tensor parallel: how many of a block's two sums over the ranks the MLP does itself under
// `all_reduce` (the fused MLP only: epilogue its output, in_mlp its input too); all-reduce kernels
// do the others. The engine does them only where its peer buffers hold the message.
int sums_in_mlp(MlpChoice mlp, AllReduceChoice all_reduce);

// One override, as `--plan-override` takes it: OP[@BUCKET]=VALUE, e.g. `mlp=unfused` (every
// bucket and prefill), `mlp@16=unfused`, `attention.splits@1=8`, `attention.short_context=off`,
// `prefill.mlp=fused`, `gemm=fp8` (every bucket and prefill), `prefill.gemm=fp8`, `all_reduce=one_shot`
// (tensor parallel). Several are separated by commas.
// plan_override_help() lists every op and the values it takes.
struct PlanOverride {
  std::string op;             // mlp, front, o_proj, gemm, attention.splits, attention.warps,
                              // attention.merge, attention.short_context, prefill.mlp, prefill.gemm,
                              // all_reduce
  std::optional<int> bucket;  // none: every bucket
  std::string value;
  std::string text;           // as written, for messages and `source`
};

// An override's value as `Choice`, as apply_overrides reads every choice op; overrides usually come
// from parse_plan_overrides, but a caller may build one by hand, so an unknown value is an error
// here too (naming the override and the values), never a default.
template <typename Choice>
Choice override_choice(const PlanOverride& o) {
  if (const std::optional<Choice> choice = parse_choice<Choice>(o.value)) return *choice;
  throw Error("plan override '" + o.text + "': bad value '" + o.value + "' for " + o.op + " (" +
              choice_names<Choice>() + ")");
}

// "mlp=fused|unfused, ...": every op `--plan-override` takes with its values, from the choices'
// tables, for the command line's help.
std::string plan_override_help();

// Throws deepfuse::Error with a one-line message naming the bad part (unknown op, bad value,
// malformed text).
std::vector<PlanOverride> parse_plan_overrides(std::string_view text);

// "splits=8 warps=4 merge=workspace" / "auto" (the planner's choice), as tables print it.
std::string describe(const AttentionChoice& choice);
// The plan as a table, one row per bucket, then the prefill choice and the source.
std::string describe(const DecodePlan& plan);

}  // namespace deepfuse
