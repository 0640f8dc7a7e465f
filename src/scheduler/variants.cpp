// The variant registry's rules: what each kernel's launcher accepts, restated on the host so a plan
// never names a variant that would fail at its first launch. Each rule names the code it comes
// from; when a launcher's limits change, its rule here must change with it (tests/scheduler checks
// the built-in plans against these rules, not against the kernels).
//
// Shape limits every CUDA variant shares (head_dim 64 or 128, hidden and intermediate multiples of
// 64, at most 16 query heads per kv head) are the engine's to refuse before it asks for a plan
// (README, "Supported models and GPUs"); the unfused variants and automatic attention are therefore
// always "supported" here, the fallbacks every plan can take.
#include "scheduler/variants.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"

namespace deepfuse::scheduler {

PlanShape PlanShape::of(const ModelConfig& config) {
  PlanShape shape;
  shape.hidden = config.hidden_size;
  shape.intermediate = config.intermediate_size;
  shape.q_heads = config.num_attention_heads;
  shape.kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  shape.layers = config.num_hidden_layers;
  shape.vocab = config.vocab_size;
  shape.qkv_bias = config.qkv_bias;
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
  return text;
}

namespace {

constexpr int KiB = 1024;

// Shared memory a block may opt into, and an SM's total, by compute capability (CUDA C++
// Programming Guide, "Technical Specifications per Compute Capability"). Unlisted GPUs get the
// smallest of the recent ones, so a rule errs towards the unfused fallback.
int shared_per_block_optin(const GpuInfo& gpu) {
  if ((gpu.major == 9 && gpu.minor == 0) || gpu.major == 10) return 227 * KiB;
  if (gpu.major == 8 && (gpu.minor == 0 || gpu.minor == 7)) return 163 * KiB;
  return 99 * KiB;
}
int shared_per_sm(const GpuInfo& gpu) {
  if ((gpu.major == 9 && gpu.minor == 0) || gpu.major == 10) return 228 * KiB;
  if (gpu.major == 8 && (gpu.minor == 0 || gpu.minor == 7)) return 164 * KiB;
  return 100 * KiB;
}

// The cluster GEMV stream (the fused front and the o_proj GEMV) sets every instance's dynamic
// shared memory limit to 200 KB before its first launch (kernels/common/cluster_gemv.cuh,
// kMaxSharedBytes); cudaFuncSetAttribute refuses that where a block may not opt into as much, so
// the launch fails on sm_80 (163 KB) and sm_86/sm_89 (99 KB), whatever the shape.
constexpr int kClusterGemvSharedBytes = 200 * KiB;

std::string cluster_gemv_unsupported(const char* what, const GpuInfo& gpu) {
  if (shared_per_block_optin(gpu) >= kClusterGemvSharedBytes) return "";
  return std::string(what) + " asks for 200 KB of shared memory per block, more than sm_" + std::to_string(gpu.major) +
         std::to_string(gpu.minor) + " allows (" + std::to_string(shared_per_block_optin(gpu) / KiB) + " KB)";
}

// The fused MLP's blocks each own at most 6 tiles of 16 rows of I per 8 warps
// (swiglu_fused.cu, FusedConfig::kMaxTilesPerBlock), and its grid never exceeds the blocks
// resident at once; so I / 16 must fit 6 tiles per 8 warps resident. With clusters (sm_90) the
// instances hold 16 warps per SM (two 8-warp blocks or one of 16): at most 12 tiles per SM.
// Without clusters every instance is one 8-warp block (C = 1) of sizeof(SharedStorage<NT, 1>):
// about 90.8 KB at up to 8 tokens, 89.4 KB at 9-16, 80.5 KB in 32-token passes (summed from the
// struct's members), plus the 1 KB the runtime reserves per block, at most 2 per SM.
int fused_mlp_tiles_per_sm(const GpuInfo& gpu, int tokens) {
  if (gpu.clusters()) return 12;
  const int storage = tokens <= 8 ? 90800 : tokens <= 16 ? 89424 : 80528;
  const int blocks = std::min(2, shared_per_sm(gpu) / (storage + KiB));
  return 6 * blocks;
}

// Query heads per kv head the cluster merge's blocks hold (decode_attention.hpp, SplitMerge), and
// the most splits it and the planner take (decode_attention.cu, kMaxClusterSplits, kMaxSplits).
constexpr int kClusterMergeMaxGroup = 8;
constexpr int kClusterMergeMaxSplits = 8;
constexpr int kMaxSplits = 256;

}  // namespace

std::string why_unsupported(MlpChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu) {
  if (choice == MlpChoice::unfused) return "";
  // validate_mlp_shape (runtime/mlp_layer.cpp) and the launcher's valid_shape (swiglu_fused.cu).
  // Any token count runs: the kernel takes passes of 8, 16 or 32 tokens.
  if (shape.hidden < 64 || shape.hidden % 64 != 0 || shape.intermediate < 64 || shape.intermediate % 64 != 0)
    return "the fused MLP needs hidden and intermediate sizes that are multiples of 64";
  if (tokens < 1) return "the fused MLP needs at least one token";
  const int tiles_per_sm = fused_mlp_tiles_per_sm(gpu, tokens);
  if (gpu.sms > 0 && shape.intermediate / 16 > tiles_per_sm * gpu.sms)
    return "the fused MLP's resident blocks hold at most " + std::to_string(16 * tiles_per_sm * gpu.sms) +
           " intermediate rows on this GPU at " + std::to_string(tokens) + " tokens";
  return "";
}

std::string why_unsupported(FrontChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu) {
  if (choice == FrontChoice::unfused) return "";
  // launch_qkv_rope_fused's checks (qkv/qkv_rope_fused.cu).
  if (tokens < 1 || tokens > kernels::kQkvFusedMaxTokens)
    return "the fused front takes at most " + std::to_string(kernels::kQkvFusedMaxTokens) + " tokens";
  if (shape.head_dim != 64 && shape.head_dim != 128) return "the fused front needs head_dim 64 or 128";
  if (shape.hidden < 64 || shape.hidden % 64 != 0)
    return "the fused front needs a hidden size that is a multiple of 64";
  if (shape.kv_heads < 1 || shape.q_heads % shape.kv_heads != 0)
    return "the fused front needs q_heads a multiple of kv_heads";
  return cluster_gemv_unsupported("the fused front", gpu);
}

std::string why_unsupported(OProjChoice choice, FrontChoice front, const PlanShape& shape, int tokens,
                            const GpuInfo& gpu) {
  if (choice == OProjChoice::cublaslt) return "";
  // The fused MLP leaves its sum for the next block's fused front and o_proj GEMV, and the GEMV
  // clears it (runtime/forward.cpp, ForwardPass::layer): the runtime pairs them.
  if (front != FrontChoice::fused) return "the o_proj GEMV needs the fused front";
  // launch_gemv_residual's checks (gemv/gemv_residual.cu): rows = hidden, inner = q_heads x head_dim.
  if (tokens < 1 || tokens > kernels::kGemvResidualMaxTokens)
    return "the o_proj GEMV takes at most " + std::to_string(kernels::kGemvResidualMaxTokens) + " tokens";
  const int inner = shape.q_heads * shape.head_dim;
  if (shape.hidden < 64 || shape.hidden % 64 != 0 || inner < 64 || inner % 64 != 0)
    return "the o_proj GEMV needs hidden and q_heads x head_dim multiples of 64";
  return cluster_gemv_unsupported("the o_proj GEMV", gpu);
}

std::string why_unsupported(const AttentionChoice& choice, const PlanShape& shape, int batch, const GpuInfo& gpu) {
  // plan_decode_attention's checks on forced parameters (attention/decode_attention.cu).
  if (batch < 1) return "attention needs a batch of at least one sequence";
  if (choice.splits < 0 || choice.splits > kMaxSplits)
    return "attention splits must be 0 (the planner's) to " + std::to_string(kMaxSplits);
  if (choice.warps != 0 && choice.warps != 4 && choice.warps != 8) return "attention warps must be 4 or 8";
  if (choice.merge == kernels::SplitMerge::cluster) {
    if (!gpu.clusters()) return "the attention cluster merge needs thread-block clusters (sm_90)";
    if (choice.warps == 4) return "the attention cluster merge needs blocks of 8 warps";
    if (choice.splits > kClusterMergeMaxSplits)
      return "the attention cluster merge takes at most " + std::to_string(kClusterMergeMaxSplits) + " splits";
    if (shape.kv_heads < 1 || shape.q_heads / shape.kv_heads > kClusterMergeMaxGroup)
      return "the attention cluster merge takes at most " + std::to_string(kClusterMergeMaxGroup) +
             " query heads per kv head";
  }
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

std::vector<MlpChoice> mlp_candidates() { return every<MlpChoice>(); }
std::vector<FrontChoice> front_candidates() { return every<FrontChoice>(); }
std::vector<OProjChoice> o_proj_candidates() { return every<OProjChoice>(); }

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
