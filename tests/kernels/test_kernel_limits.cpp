// The kernels' exported limits (their public headers' `..._unsupported` functions, which the
// scheduler plans by) are what their launchers and planner refuse. Host only: a refused launch
// returns before touching a device, so no GPU is needed.
#include <gtest/gtest.h>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/cluster_gemv.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/speculative_accept.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"

namespace deepfuse::kernels {
namespace {

// Non-null pointers the launchers check for and never reach.
template <typename T>
T* fake() {
  return reinterpret_cast<T*>(uintptr_t{256});
}

TEST(KernelLimits, QkvRopeFusedLauncherRefusesWhatItsHeaderRefuses) {
  for (const QkvRopeFusedShape s : {QkvRopeFusedShape{0, 4096, 32, 8, 128}, QkvRopeFusedShape{33, 4096, 32, 8, 128},
                                    QkvRopeFusedShape{1, 4000, 32, 8, 128}, QkvRopeFusedShape{1, 4096, 32, 5, 128},
                                    QkvRopeFusedShape{1, 4096, 32, 8, 96}, QkvRopeFusedShape{1, 4096, 32, 0, 128}}) {
    ASSERT_NE(qkv_rope_fused_unsupported(s), "") << s.tokens << " " << s.hidden << " " << s.kv_heads;
    QkvRopeFusedParams p;
    p.x = fake<const __nv_bfloat16>(), p.norm_weight = fake<const __nv_bfloat16>(), p.weights = fake<const uint4>();
    p.inv_freq = fake<const float>(), p.positions = fake<const int32_t>(), p.sequences = fake<const int32_t>();
    p.q_out = fake<__nv_bfloat16>();
    p.kv.k_pages = fake<__nv_bfloat16>(), p.kv.v_pages = fake<__nv_bfloat16>(), p.kv.block_table = fake<const int32_t>();
    p.tokens = s.tokens, p.hidden = s.hidden, p.q_heads = s.q_heads, p.kv.kv_heads = s.kv_heads;
    p.kv.head_dim = s.head_dim;
    EXPECT_EQ(launch_qkv_rope_fused(p, nullptr), cudaErrorInvalidValue);
  }
  EXPECT_EQ(qkv_rope_fused_unsupported({kQkvFusedMaxTokens, 4096, 32, 8, 128}), "");
  EXPECT_EQ(qkv_rope_fused_unsupported({kQkvFusedMaxTokens + 1, 4096, 32, 8, 128}), "takes at most 32 tokens");
}

TEST(KernelLimits, GemvResidualLauncherRefusesWhatItsHeaderRefuses) {
  for (const auto [tokens, rows, inner] : {std::tuple{0, 4096, 4096}, std::tuple{kGemvResidualMaxTokens + 1, 4096, 4096},
                                           std::tuple{1, 4000, 4096}, std::tuple{1, 4096, 32}}) {
    ASSERT_NE(gemv_residual_unsupported(tokens, rows, inner), "");
    GemvResidualParams p;
    p.x = fake<const __nv_bfloat16>(), p.weights = fake<const uint4>(), p.y = fake<__nv_bfloat16>();
    p.tokens = tokens, p.rows = rows, p.inner = inner;
    EXPECT_EQ(launch_gemv_residual(p, nullptr), cudaErrorInvalidValue) << tokens << " " << rows << " " << inner;
  }
  EXPECT_EQ(gemv_residual_unsupported(kGemvResidualMaxTokens, 4096, 4096), "");
}

TEST(KernelLimits, ClusterGemvNeedsItsSharedMemory) {
  EXPECT_EQ(cluster_gemv_unsupported(kClusterGemvSharedBytes), "");
  EXPECT_NE(cluster_gemv_unsupported(kClusterGemvSharedBytes - 1).find("200 KB"), std::string::npos);
}

TEST(KernelLimits, DecodeAttentionPlannerRefusesWhatItsHeaderRefuses) {
  for (int group : {4, 8, 16})
    for (int splits : {-1, 0, 1, kDecodeAttentionMaxClusterSplits, kDecodeAttentionMaxClusterSplits + 1,
                       kDecodeAttentionMaxSplits, kDecodeAttentionMaxSplits + 1})
      for (int warps : {0, 4, 6, 8})
        for (SplitMerge merge : {SplitMerge::automatic, SplitMerge::workspace, SplitMerge::cluster}) {
          const bool supported = decode_attention_forced_unsupported(splits, warps, merge, group).empty();
          auto plan = [&] { plan_decode_attention(1, 8 * group, 8, 128, 8192, 132, splits, warps, merge); };
          if (supported)
            EXPECT_NO_THROW(plan()) << group << " " << splits << " " << warps;
          else
            EXPECT_THROW(plan(), Error) << group << " " << splits << " " << warps;
        }
}

TEST(KernelLimits, FusedMlpShapeAndResidency) {
  const SwigluFusedDevice h100{132, true, 228 * 1024}, a100{108, false, 164 * 1024};
  EXPECT_EQ(swiglu_fused_unsupported(4096, 14336, 8, h100), "");
  EXPECT_NE(swiglu_fused_unsupported(4096, 14336 + 32, 8, h100).find("multiples of 64"), std::string::npos);
  EXPECT_NE(swiglu_fused_unsupported(4096, 14336, 0, h100), "");
  // Without clusters one 8-warp block per SM at up to 8 tokens on an A100: 6 x 16 x 108 rows.
  EXPECT_EQ(swiglu_fused_unsupported(4096, 6 * 16 * 108, 8, a100), "");
  EXPECT_NE(swiglu_fused_unsupported(4096, 6 * 16 * 108 + 64, 8, a100).find("10368"), std::string::npos);
  EXPECT_EQ(swiglu_fused_unsupported(4096, 14336, 8, {0, false, 0}), "");  // no GPU facts: the shape only
  // FP8: per-row scales up to kSwigluFusedFp8MaxTokens tokens; block scales not at all.
  EXPECT_EQ(swiglu_fused_unsupported(4096, 14336, kSwigluFusedFp8MaxTokens, h100, WeightFormat::fp8_e4m3), "");
  EXPECT_NE(swiglu_fused_unsupported(4096, 14336, kSwigluFusedFp8MaxTokens + 1, h100, WeightFormat::fp8_e4m3), "");
  EXPECT_NE(swiglu_fused_unsupported(4096, 14336, 1, h100, WeightFormat::fp8_e4m3_block128).find("fp8_e4m3_block128"),
            std::string::npos);
  SwigluFusedParams p;  // the launcher refuses the shape the header refuses
  p.x = fake<const __nv_bfloat16>(), p.gate_up = fake<const uint4>(), p.down = fake<const uint4>();
  p.y = fake<__nv_bfloat16>(), p.accumulator = fake<float>(), p.counters = fake<unsigned>();
  p.tokens = 1, p.hidden = 4096, p.intermediate = 14336 + 32;
  EXPECT_EQ(launch_swiglu_fused(p, {}, nullptr), cudaErrorInvalidValue);
  // FP8 also needs its scales and the x fragments' scratch.
  p.intermediate = 14336, p.format = WeightFormat::fp8_e4m3;
  p.gate_up_scales = fake<const float>(), p.down_scales = fake<const float>();
  EXPECT_EQ(launch_swiglu_fused(p, {}, nullptr), cudaErrorInvalidValue);
}

TEST(KernelLimits, BatchedMlpShapeTokensFormatAndSharedMemory) {
  const SwigluFusedDevice h100{132, true, 228 * 1024}, a100{108, false, 164 * 1024}, sm86{84, false, 100 * 1024};
  for (const auto [hidden, intermediate] : {std::pair{4096, 14336}, std::pair{3584, 18944}, std::pair{5120, 13824}})
    for (int tokens : {1, 16, 17, 64, 65, 128, 129, kSwigluBatchedMaxTokens})
      EXPECT_EQ(swiglu_batched_unsupported(hidden, intermediate, tokens, h100), "") << hidden << " M=" << tokens;
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336, 0, h100), "");
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336, kSwigluBatchedMaxTokens + 1, h100).find("1 to 256"),
            std::string::npos);
  EXPECT_NE(swiglu_batched_unsupported(4160, 14336, 16, h100).find("multiple of 128"), std::string::npos);
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336 + 32, 16, h100).find("multiple of 64"), std::string::npos);
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336, 16, h100, WeightFormat::fp8_e4m3).find("fp8_e4m3"),
            std::string::npos);
  // An A100 holds the passes of up to 64 tokens, not the 128-token pass; an sm_86 none.
  EXPECT_EQ(swiglu_batched_unsupported(4096, 14336, 64, a100), "");
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336, 65, a100).find("shared memory"), std::string::npos);
  EXPECT_NE(swiglu_batched_unsupported(4096, 14336, 16, sm86).find("shared memory"), std::string::npos);
  SwigluBatchedParams p;  // the launcher refuses what the header refuses, before touching a device
  p.x = fake<const __nv_bfloat16>(), p.gate_up = fake<const uint4>(), p.down = fake<const uint4>();
  p.y = fake<__nv_bfloat16>(), p.activations = fake<__nv_bfloat16>(), p.accumulator = fake<float>();
  p.barrier = fake<unsigned>();
  for (const auto [tokens, hidden, intermediate] :
       {std::tuple{0, 4096, 14336}, std::tuple{kSwigluBatchedMaxTokens + 1, 4096, 14336}, std::tuple{16, 4160, 14336},
        std::tuple{16, 4096, 14336 + 32}}) {
    p.tokens = tokens, p.hidden = hidden, p.intermediate = intermediate;
    EXPECT_EQ(launch_swiglu_batched(p, nullptr), cudaErrorInvalidValue) << tokens << " " << hidden;
  }
}

TEST(KernelLimits, SpeculativeAcceptRefusesRowsPastItsLimitAndMissingBuffers) {
  SpeculativeAcceptParams p;
  p.chosen = p.drafts = p.draft_counts = fake<const int32_t>();
  p.emitted = p.emitted_counts = fake<int32_t>();
  p.sequences = 1;
  p.rows = kSpeculativeMaxRows + 1;
  EXPECT_EQ(launch_speculative_accept(p, nullptr), cudaErrorInvalidValue);
  p.rows = 0;
  EXPECT_EQ(launch_speculative_accept(p, nullptr), cudaErrorInvalidValue);
  p.rows = 2;
  p.sequences = 0;
  EXPECT_EQ(launch_speculative_accept(p, nullptr), cudaErrorInvalidValue);
  p.sequences = 1;
  p.emitted = nullptr;
  EXPECT_EQ(launch_speculative_accept(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse::kernels
