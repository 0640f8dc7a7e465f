// What decode attention's host planner (decode_attention_plan.cpp) and its kernel and launcher
// (decode_attention.cu) share: the kernel's limits and the workspace layout. Host code only.
#pragma once

#include <cstddef>

#include "deepfuse/kernels/decode_attention.hpp"

namespace deepfuse::kernels::decode_attention_detail {

constexpr int kMaxGroup = 16;  // query heads per kv head: two 8-wide n-tiles
constexpr int kMaxSplits = 256;
// Merging in a cluster (plan.cluster_merge): at most 8 splits, the portable cluster size (the
// H200 holds 15 clusters of 8 one-per-SM blocks at once, 7 of 16).
constexpr int kMaxClusterSplits = 8;

// Workspace: [counters (batch*kv_heads u32)] [lse (pairs*splits*G f32)] [partial O (pairs*splits*G*D bf16)]
struct WorkspaceLayout {
  size_t lse_offset = 0;
  size_t partial_offset = 0;
  size_t bytes = 0;
};
WorkspaceLayout workspace_layout(int batch, int kv_heads, int group, int head_dim, int splits);

// The plan as plan_decode_attention makes it; anything else is a caller's mistake.
bool plan_is_consistent(const DecodeAttentionPlan& plan);

}  // namespace deepfuse::kernels::decode_attention_detail
