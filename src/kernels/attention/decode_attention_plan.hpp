// What decode attention's host planner (decode_attention_plan.cpp) and its kernel and launcher
// (decode_attention.cu) share: the kernel's limits and the workspace layout. Host code only.
#pragma once

#include <cstddef>

#include "deepfuse/kernels/decode_attention.hpp"

namespace deepfuse::kernels::decode_attention_detail {

// The public limits (decode_attention.hpp) under the names the kernel and planner use.
constexpr int kMaxGroup = kDecodeAttentionMaxGroup;
constexpr int kMaxSplits = kDecodeAttentionMaxSplits;
constexpr int kMaxClusterSplits = kDecodeAttentionMaxClusterSplits;

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
