// The decode plan: for every batch bucket, which variant of each op the decode step runs and with
// what launch parameters. The forward pass, graph capture, launch accounting and weight packing all
// read it; nothing else decides. A plan comes from the built-in rules of the GPU's class, from the
// tuning cache (`deepfuse tune` measured it on this GPU), and from explicit overrides, in that
// order; `source` says which.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepfuse {

// The SwiGLU MLP: the DeepFusion kernel (one launch, fragment-packed weights) or cuBLASLt GEMMs
// around silu_and_mul (row-major weights).
enum class MlpChoice { fused, unfused };
// The front half of a block: input RMSNorm + QKV (+bias) + RoPE + KV append as one kernel over
// fragment-packed weights, or a cuBLASLt GEMM (norm folded into its weights) + rope_kv_append.
enum class FrontChoice { fused, unfused };
// o_proj + residual: the cluster GEMV (needs the fused front, which adds a deferred MLP sum the
// GEMV also clears) or cuBLASLt with the residual in its epilogue.
enum class OProjChoice { gemv, cublaslt };
// Tensor parallel: how each block's two sums over the ranks run: NCCL's all-reduce, or the
// one-shot all-reduce over NVLink peer memory (deepfuse/kernels/one_shot_all_reduce.hpp), which
// needs peer access between the GPUs: with a flag after the data, with flags in the data, or
// (one_shot) whichever of the two its built-in size rule picks; or (epilogue) the fused MLP sums
// its output over the ranks in its own finish, with flags in the data
// (deepfuse/kernels/line_exchange.hpp), and the block's other sum (and an unfused MLP's) is the
// one-shot kernel with flags in the data; or (in_mlp) the fused MLP also sums the attention
// block's partials at its start, so a block that runs it launches no all-reduce kernel (an unfused
// MLP's block: the one-shot kernel with flags in the data, twice). A TP engine times NCCL and both
// protocols per bucket at start and keeps the fastest, or, at 2 and 4 ranks, takes epilogue where
// flags in the data are the one-shot's size rule and the bucket runs the fused MLP (in_mlp at 2
// ranks and one token of hidden 4096). One GPU: unused.
enum class AllReduceChoice { nccl, one_shot, one_shot_flag, one_shot_lines, epilogue, in_mlp };
// Where the decode attention's splits merge (kernels::SplitMerge).
enum class MergeChoice { automatic, workspace, cluster };

// Decode attention launch parameters; 0 / automatic: the planner's choice for the GPU and context.
struct AttentionChoice {
  int splits = 0;  // splits per sequence
  int warps = 0;   // 4 or 8 warps per block
  MergeChoice merge = MergeChoice::automatic;
  bool short_context = true;  // also capture the cluster-merged plan for short sequences

  bool operator==(const AttentionChoice&) const = default;
};

// One bucket's choices.
struct BucketPlan {
  int batch = 0;  // the bucket: steps of up to this many sequences
  MlpChoice mlp = MlpChoice::fused;
  FrontChoice front = FrontChoice::fused;
  OProjChoice o_proj = OProjChoice::gemv;
  AttentionChoice attention;
  AllReduceChoice all_reduce = AllReduceChoice::nccl;  // tensor parallel only

  bool operator==(const BucketPlan&) const = default;
};

struct DecodePlan {
  std::vector<BucketPlan> buckets;  // ascending batch; the engine's decode buckets
  MlpChoice prefill_mlp = MlpChoice::unfused;  // prefill chunks (hundreds of tokens)
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

const char* choice_name(MlpChoice choice);
const char* choice_name(FrontChoice choice);
const char* choice_name(OProjChoice choice);
const char* choice_name(MergeChoice choice);
const char* choice_name(AllReduceChoice choice);
// Tensor parallel: how many of a block's two sums over the ranks the MLP does itself under
// `all_reduce` (the fused MLP only: epilogue its output, in_mlp its input too); all-reduce kernels
// do the others. The engine does them only where its peer buffers hold the message.
int sums_in_mlp(MlpChoice mlp, AllReduceChoice all_reduce);

// One override, as `--plan-override` takes it: OP[@BUCKET]=VALUE, e.g. `mlp=unfused` (every
// bucket and prefill), `mlp@16=unfused`, `front@32=fused`, `o_proj=cublaslt`,
// `attention.splits@1=8`, `attention.warps=4`, `attention.merge=workspace`,
// `attention.short_context=off`, `prefill.mlp=fused`, `all_reduce=one_shot` (tensor parallel:
// `nccl` or `one_shot`). Several are separated by commas.
struct PlanOverride {
  std::string op;             // mlp, front, o_proj, attention.splits, attention.warps,
                              // attention.merge, attention.short_context, prefill.mlp, all_reduce
  std::optional<int> bucket;  // none: every bucket
  std::string value;
  std::string text;           // as written, for messages and `source`
};

// Throws deepfuse::Error with a one-line message naming the bad part (unknown op, bad value,
// malformed text).
std::vector<PlanOverride> parse_plan_overrides(std::string_view text);

// "splits=8 warps=4 merge=workspace" / "auto" (the planner's choice), as tables print it.
std::string describe(const AttentionChoice& choice);
// The plan as a table, one row per bucket, then the prefill choice and the source.
std::string describe(const DecodePlan& plan);

}  // namespace deepfuse
