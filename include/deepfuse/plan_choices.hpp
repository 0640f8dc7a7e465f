// The decode plan's choices, one table each (deepfuse/choice_table.hpp): a row's name is what the
// plan's JSON, `--plan-override`, `inspect --plan` and the help say, its `about` what it runs, and
// its other columns what the runtime runs for it. A new variant value is a row here plus its
// dispatch in the runtime (docs/design.md, "How to add").
#pragma once

#include <array>
#include <optional>

#include "deepfuse/choice_table.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"
#include "deepfuse/mlp.hpp"

namespace deepfuse {

// The SwiGLU MLP.
enum class MlpChoice { fused, unfused, fused_batched, fused_wgmma };
struct MlpChoiceRow {
  MlpChoice value;
  const char* name;
  const char* about;
  MlpVariant variant;    // the MlpLayer that runs it
  bool sums_over_ranks;  // tensor parallel: its own finish can sum over the ranks (AllReduceChoiceRow::mlp_sums)
};
template <>
struct ChoiceTable<MlpChoice> {
  static constexpr std::array rows{
      MlpChoiceRow{MlpChoice::fused, "fused", "the DeepFusion kernel: one launch over fragment-packed weights",
                   MlpVariant::fused, true},
      MlpChoiceRow{MlpChoice::unfused, "unfused", "cuBLASLt GEMMs around silu_and_mul, row-major weights",
                   MlpVariant::unfused, false},
      // Not in any built-in plan until measured: --plan-override mlp=fused_batched, or a tuned plan.
      MlpChoiceRow{MlpChoice::fused_batched, "fused_batched",
                   "the batched fused kernel: one launch for 16-256 tokens, weights once per 128 tokens, silu(g)*u "
                   "through L2 (its own fragment-packed copy)",
                   MlpVariant::fused_batched, false},
      // Not in any built-in plan: written blind, not run on a GPU yet (docs/kernels/swiglu_fused.md,
      // "The Hopper pair"). --plan-override mlp=fused_wgmma.
      MlpChoiceRow{MlpChoice::fused_wgmma, "fused_wgmma",
                   "the Hopper pair (sm_90): gate_up + SiLU, then down + residual, on wgmma fed by TMA, silu(g)*u "
                   "through L2 (its own row-major copy)",
                   MlpVariant::fused_wgmma, false},
  };
};

// The front half of a block: input RMSNorm + QKV (+bias) + RoPE + KV append.
enum class FrontChoice { fused, unfused };
template <>
struct ChoiceTable<FrontChoice> {
  static constexpr std::array rows{
      ChoiceRow<FrontChoice>{FrontChoice::fused, "fused", "qkv_rope_fused: one kernel over fragment-packed weights"},
      ChoiceRow<FrontChoice>{FrontChoice::unfused, "unfused",
                     "a cuBLASLt GEMM (the norm folded into its weights), then rope_kv_append"},
  };
};

// o_proj + residual.
enum class OProjChoice { gemv, cublaslt };
template <>
struct ChoiceTable<OProjChoice> {
  static constexpr std::array rows{
      ChoiceRow<OProjChoice>{OProjChoice::gemv, "gemv",
                     "gemv_residual, the cluster GEMV (needs the fused front, which adds a deferred MLP sum the "
                     "GEMV also clears)"},
      ChoiceRow<OProjChoice>{OProjChoice::cublaslt, "cublaslt", "cuBLASLt with the residual in its epilogue"},
  };
};

// How the cuBLASLt projections of a pass (the unfused front's QKV, cuBLASLt o_proj, the unfused
// MLP's gate_up and down) read FP8 weights: widened to bf16 per call for a bf16 GEMM, or on FP8
// tensor cores with the activations quantized to e4m3 per token (kernels::CublasLtGemm::run_fp8;
// needs per-channel fp8_e4m3 weights). bf16 weights always run bf16.
enum class GemmChoice { bf16, fp8 };
struct GemmChoiceRow {
  GemmChoice value;
  const char* name;
  const char* about;
  MlpGemms mlp_gemms;  // what the unfused MLP runs for it
};
template <>
struct ChoiceTable<GemmChoice> {
  static constexpr std::array rows{
      GemmChoiceRow{GemmChoice::bf16, "bf16",
                    "bf16 GEMMs (FP8 weights widened to a bf16 copy per call; docs/kernels/fp8.md)", MlpGemms::bf16},
      GemmChoiceRow{GemmChoice::fp8, "fp8",
                    "FP8 tensor-core GEMMs: activations quantized to e4m3 per token, per-channel weight scales "
                    "(fp8_e4m3 weights, sm_90)",
                    MlpGemms::fp8},
  };
};

// Tensor parallel: how each block's two sums over the ranks run. The one-shot all-reduce
// (deepfuse/kernels/one_shot_all_reduce.hpp) needs peer access between the GPUs. A TP engine times
// the rows it can time per bucket at start and keeps the fastest, or, at 2 and 4 ranks, takes
// epilogue where flags in the data are the one-shot's size rule and the bucket runs the fused MLP
// (in_mlp at 2 ranks and one token of hidden 4096): runtime/rank_group.cpp. One GPU: unused.
enum class AllReduceChoice { nccl, one_shot, one_shot_flag, one_shot_lines, epilogue, in_mlp };
struct AllReduceChoiceRow {
  AllReduceChoice value;
  const char* name;
  const char* about;
  // The all-reduce kernel of the sums the MLP does not do: none for NCCL's all-reduce, else the
  // one-shot's protocol.
  std::optional<kernels::OneShotProtocol> protocol;
  int mlp_sums;  // how many of the block's two sums a fused MLP does itself (sums_in_mlp)
};
template <>
struct ChoiceTable<AllReduceChoice> {
  using P = kernels::OneShotProtocol;
  static constexpr std::array rows{
      AllReduceChoiceRow{AllReduceChoice::nccl, "nccl", "NCCL's all-reduce", std::nullopt, 0},
      AllReduceChoiceRow{AllReduceChoice::one_shot, "one_shot",
                         "the one-shot all-reduce, its protocol by its built-in size rule", P::automatic, 0},
      AllReduceChoiceRow{AllReduceChoice::one_shot_flag, "one_shot_flag",
                         "the one-shot all-reduce with a flag after the data", P::flag_after_data, 0},
      AllReduceChoiceRow{AllReduceChoice::one_shot_lines, "one_shot_lines",
                         "the one-shot all-reduce with flags in the data", P::flags_in_data, 0},
      AllReduceChoiceRow{AllReduceChoice::epilogue, "epilogue",
                         "the fused MLP sums its output over the ranks in its own finish "
                         "(deepfuse/kernels/line_exchange.hpp); the other sum is the one-shot with flags in the data",
                         P::flags_in_data, 1},
      AllReduceChoiceRow{AllReduceChoice::in_mlp, "in_mlp",
                         "the fused MLP also sums the attention block's partials at its start: no all-reduce kernel "
                         "(an unfused MLP's block: the one-shot with flags in the data, twice)",
                         P::flags_in_data, 2},
  };
};

// Where the decode attention's splits merge: the kernel's own enum (kernels::SplitMerge).
template <>
struct ChoiceTable<kernels::SplitMerge> {
  static constexpr std::array rows{
      ChoiceRow<kernels::SplitMerge>{kernels::SplitMerge::automatic, "automatic", "the planner's choice"},
      ChoiceRow<kernels::SplitMerge>{kernels::SplitMerge::workspace, "workspace", "in L2, the last split to finish merges"},
      ChoiceRow<kernels::SplitMerge>{kernels::SplitMerge::cluster, "cluster", "in a thread-block cluster's shared memory (sm_90)"},
  };
};

static_assert(choice_table_well_formed<MlpChoice>());
static_assert(choice_table_well_formed<FrontChoice>());
static_assert(choice_table_well_formed<OProjChoice>());
static_assert(choice_table_well_formed<GemmChoice>());
static_assert(choice_table_well_formed<AllReduceChoice>());
static_assert(choice_table_well_formed<kernels::SplitMerge>());

}  // namespace deepfuse
