// The variant registry's rules: what each kernel's launcher accepts, asked of the kernel's public
// header (each exports its limits and an `..._unsupported` function its launcher or planner checks
// too), so a plan never names a variant that would fail at its first launch and no limit is
// written here. The registry adds only the GPU's facts (GpuInfo) and the runtime's pairings.
//
// Shape limits every CUDA variant shares (head_dim 64 or 128, hidden and intermediate multiples of
// 64, at most 16 query heads per kv head) are the engine's to refuse before it asks for a plan
// (README, "Supported models and GPUs"); the unfused variants and automatic attention are therefore
// always "supported" here, the fallbacks every plan can take.
#include "scheduler/variants.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/cluster_gemv.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"

namespace deepfuse::scheduler {

PlanShape PlanShape::of(const ModelConfig& config, WeightFormat weights) {
  PlanShape shape;
  shape.hidden = config.hidden_size;
  shape.intermediate = config.intermediate_size;
  shape.q_heads = config.num_attention_heads;
  shape.kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  shape.layers = config.num_hidden_layers;
  shape.vocab = config.vocab_size;
  shape.qkv_bias = config.qkv_bias;
  shape.weights = weights;
  return shape;
}

std::string PlanShape::signature() const {
  std::string text;
  auto add = [&](const char* tag, int value) { text.append(tag).append(std::to_string(value)); };
  add("h", hidden);
  add("-i", intermediate);
  add("-q", q_heads);
  add("-kv", kv_heads);
  add("-d", head_dim);
  add("-l", layers);
  add("-v", vocab);
  if (qkv_bias) text += "-bias";
  // bf16 adds nothing, so the keys of plans tuned before FP8 weights existed still match.
  if (weights != WeightFormat::bf16) text.append("-").append(weight_format_name(weights));
  return text;
}

namespace {

constexpr int KiB = 1024;

std::string gpu_name(const GpuInfo& gpu) { return "sm_" + std::to_string(gpu.major) + std::to_string(gpu.minor); }

// The cluster GEMV stream (the fused front and the o_proj GEMV) needs its shared memory limit
// (kernels/cluster_gemv.hpp) whatever the shape: on sm_80 and sm_86/sm_89 its launch fails.
std::string cluster_gemv_unsupported(const char* what, const GpuInfo& gpu) {
  const std::string why = kernels::cluster_gemv_unsupported(gpu.shared_bytes_per_block());
  return why.empty() ? "" : std::string(what) + " " + why + " on " + gpu_name(gpu);
}

}  // namespace

// Shared memory a block may opt into, and an SM's total, by compute capability (CUDA C++
// Programming Guide, "Technical Specifications per Compute Capability"). Unlisted GPUs get the
// smallest of the recent ones, so a rule errs towards the unfused fallback.
int GpuInfo::shared_bytes_per_block() const {
  if ((major == 9 && minor == 0) || major == 10) return 227 * KiB;
  if (major == 8 && (minor == 0 || minor == 7)) return 163 * KiB;
  return 99 * KiB;
}
int GpuInfo::shared_bytes_per_sm() const {
  if ((major == 9 && minor == 0) || major == 10) return 228 * KiB;
  if (major == 8 && (minor == 0 || minor == 7)) return 164 * KiB;
  return 100 * KiB;
}

// Each rule asks the kernel's public header (its `..._unsupported` function, which its launcher or
// planner checks too); only the pairing rules of the runtime are the registry's own.
std::string why_unsupported(MlpChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu) {
  if (choice == MlpChoice::unfused) return "";
  const kernels::SwigluFusedDevice device{gpu.sms, gpu.clusters(), gpu.shared_bytes_per_sm()};
  if (choice == MlpChoice::fused_batched)
    return kernels::swiglu_batched_unsupported(shape.hidden, shape.intermediate, tokens, device, shape.weights);
  if (choice == MlpChoice::fused_wgmma)
    return kernels::swiglu_wgmma_unsupported(shape.hidden, shape.intermediate, tokens, {gpu.major, gpu.sms},
                                             shape.weights);
  return kernels::swiglu_fused_unsupported(shape.hidden, shape.intermediate, tokens, device, shape.weights);
}

std::string why_unsupported(FrontChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu) {
  if (choice == FrontChoice::unfused) return "";
  const std::string why = kernels::qkv_rope_fused_unsupported(
      {tokens, shape.hidden, shape.q_heads, shape.kv_heads, shape.head_dim}, shape.weights);
  if (!why.empty()) return "the fused front " + why;
  return cluster_gemv_unsupported("the fused front", gpu);
}

std::string why_unsupported(OProjChoice choice, FrontChoice front, const PlanShape& shape, int tokens,
                            const GpuInfo& gpu) {
  if (choice == OProjChoice::cublaslt) return "";
  // The fused MLP leaves its sum for the next block's fused front and o_proj GEMV, and the GEMV
  // clears it (runtime/forward.cpp, ForwardPass::layer): the runtime pairs them.
  if (front != FrontChoice::fused) return "the o_proj GEMV needs the fused front";
  // rows = hidden, inner = q_heads x head_dim.
  const std::string why =
      kernels::gemv_residual_unsupported(tokens, shape.hidden, shape.q_heads * shape.head_dim, shape.weights);
  if (!why.empty()) return "the o_proj GEMV " + why;
  return cluster_gemv_unsupported("the o_proj GEMV", gpu);
}

std::string why_unsupported(GemmChoice choice, const PlanShape& shape, const GpuInfo& gpu) {
  if (choice == GemmChoice::bf16) return "";
  // Per-token times per-channel scales: the outer-vector product cuBLASLt applies; block scales
  // are not one.
  if (shape.weights != WeightFormat::fp8_e4m3)
    return std::string("the FP8 GEMMs need fp8_e4m3 weights (per-channel scales), not ") +
           weight_format_name(shape.weights);
  const int q_size = shape.q_heads * shape.head_dim, kv_size = shape.kv_heads * shape.head_dim;
  // QKV, o_proj, gate_up, down: N outputs over K inputs.
  for (const auto& [n, k] : {std::pair{q_size + 2 * kv_size, shape.hidden}, std::pair{shape.hidden, q_size},
                            std::pair{2 * shape.intermediate, shape.hidden}, std::pair{shape.hidden, shape.intermediate}})
    if (std::string why = kernels::fp8_gemm_unsupported(n, k, gpu.major, gpu.minor); !why.empty()) return why;
  return "";
}

std::string why_unsupported(const AttentionChoice& choice, const PlanShape& shape, int batch, const GpuInfo& gpu) {
  if (batch < 1) return "attention needs a batch of at least one sequence";
  // Without clusters the kernel would fall back to the workspace: a plan saying cluster would lie.
  if (choice.merge == kernels::SplitMerge::cluster && !gpu.clusters())
    return "the attention cluster merge needs thread-block clusters (sm_90)";
  // No kv heads: no group a cluster could hold.
  const int group = shape.kv_heads >= 1 ? shape.q_heads / shape.kv_heads : std::numeric_limits<int>::max();
  const std::string why = kernels::decode_attention_forced_unsupported(choice.splits, choice.warps, choice.merge, group);
  if (!why.empty()) return "attention " + why;
  // The short-context plan merges its splits in clusters (plan_short_context_decode_attention).
  if (choice.short_context && !gpu.clusters())
    return "the short-context attention plan needs thread-block clusters (sm_90)";
  return "";
}

std::string why_unsupported(const AttentionChoice& choice, const PlanShape& shape, int batch, const GpuInfo& gpu,
                            int max_context) {
  if (std::string why = why_unsupported(choice, shape, batch, gpu); !why.empty()) return why;
  const int pages = (max_context + kernels::kKvPageSize - 1) / kernels::kKvPageSize;
  if (max_context > 0 && choice.splits > pages)
    return "attention splits " + std::to_string(choice.splits) + " exceed the " + std::to_string(pages) +
           " pages of a " + std::to_string(max_context) + "-token context (one split per page at most)";
  return "";
}

namespace {
template <typename Choice>
std::vector<Choice> every() {
  const auto values = all_choices<Choice>();
  return {values.begin(), values.end()};
}
}  // namespace

// fused_wgmma is not timed by `tune` until it has passed its GPU tests (written without a GPU:
// docs/kernels/swiglu_fused.md, "The Hopper pair"); --plan-override mlp=fused_wgmma runs it.
std::vector<MlpChoice> mlp_candidates() {
  std::vector<MlpChoice> all = every<MlpChoice>();
  std::erase(all, MlpChoice::fused_wgmma);
  return all;
}
std::vector<FrontChoice> front_candidates() { return every<FrontChoice>(); }
std::vector<OProjChoice> o_proj_candidates() { return every<OProjChoice>(); }
std::vector<GemmChoice> gemm_candidates() { return every<GemmChoice>(); }

std::vector<AttentionChoice> attention_candidates(const PlanShape& shape, int batch, const GpuInfo& gpu) {
  return attention_candidates(shape, batch, gpu, 0);
}

std::vector<AttentionChoice> attention_candidates(const PlanShape& shape, int batch, const GpuInfo& gpu,
                                                  int max_context) {
  // short_context follows the GPU here; the profiler keeps the incumbent's (it times one context,
  // where the short-context plan does not run).
  AttentionChoice automatic;
  automatic.short_context = gpu.clusters();
  std::vector<AttentionChoice> all{automatic};
  auto with = [&](auto change) {
    AttentionChoice choice = automatic;
    change(choice);
    all.push_back(choice);
  };
  // The planner picks 8 warps for one sequence and 4 for more (docs/kernels/decode_attention.md,
  // "Blocks of 8 warps for one sequence": faster at batch 1, mixed at 2-8): time both shapes.
  with([](AttentionChoice& c) { c.warps = 4; });
  with([](AttentionChoice& c) { c.warps = 8; });
  with([](AttentionChoice& c) { c.merge = kernels::SplitMerge::cluster; });
  // Around the planner's split count ("Fewer splits than slots, measured and not adopted"). The
  // planner refuses shapes the kernel cannot run; those have nothing to time anyway.
  const bool plannable = (shape.head_dim == 64 || shape.head_dim == 128) && shape.kv_heads >= 1 &&
                         shape.q_heads % shape.kv_heads == 0 && shape.q_heads / shape.kv_heads <= 16;
  if (max_context > 0 && gpu.sms > 0 && plannable) {
    const int planned =
        kernels::plan_decode_attention(batch, shape.q_heads, shape.kv_heads, shape.head_dim, max_context, gpu.sms)
            .splits_per_sequence;
    for (int splits : {planned / 2, planned * 2})
      if (splits >= 1 && splits != planned) with([&](AttentionChoice& c) { c.splits = splits; });
  }
  std::vector<AttentionChoice> supported;
  for (const AttentionChoice& choice : all)
    if (why_unsupported(choice, shape, batch, gpu, max_context).empty()) supported.push_back(choice);
  return supported;
}

}  // namespace deepfuse::scheduler
