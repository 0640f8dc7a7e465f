// Split-KV ("flash-decoding") attention for the decode step: one query token per sequence over a
// paged KV cache (or several per sequence, each its own query: `sequences` below). GQA: the q_heads / kv_heads query heads of a group share one read of their K/V.
// Each sequence's context is cut into `splits_per_sequence` chunks of whole pages so that one long
// sequence fills the GPU; each chunk produces a normalised partial output and its log-sum-exp,
// and the partials are merged in the same launch (decode_attention_launches() counts the launches:
// one). CPU reference: reference::attention_decode.
//
// Graph safety: the grid is fixed by the plan (made once per batch bucket for a maximum context),
// sequence lengths are read on the device each launch, chunks past a sequence's end do no work,
// and a sequence of length 0 (a padded batch slot) writes zeros. Nothing synchronises with the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "deepfuse/kernels/paged_kv.hpp"

namespace deepfuse::kernels {

// Where the splits of a (sequence, kv head) merge their partial outputs.
enum class SplitMerge {
  automatic,  // the planner's choice: the workspace (short-context plans below merge in clusters)
  workspace,  // in L2: the last split to finish (by a ticket) reads the others' partials back
  cluster,    // in shared memory: the splits are one thread-block cluster and send their partials
              // to its first block (sm_90; at most 8 splits, blocks of 8 warps, at most 8 query
              // heads per kv head; other devices fall back to the workspace)
};

// The kernel's limits: query heads per kv head (two 8-wide n-tiles), splits per sequence, and for
// the cluster merge the portable cluster size (the H200 holds 15 clusters of 8 one-per-SM blocks at
// once, 7 of 16) and one 8-head n-tile.
inline constexpr int kDecodeAttentionMaxGroup = 16;
inline constexpr int kDecodeAttentionMaxSplits = 256;
inline constexpr int kDecodeAttentionMaxClusterSplits = 8;
inline constexpr int kDecodeAttentionMaxClusterGroup = 8;

// Why plan_decode_attention refuses these forced parameters (its forced_splits, forced_warps and
// merge) for `group` query heads per kv head (empty: it takes them). The planner checks exactly
// this; the scheduler plans by it.
std::string decode_attention_forced_unsupported(int forced_splits, int forced_warps, SplitMerge merge, int group);

// Fixed launch shape for a batch bucket, from sizes known when the graph is captured.
struct DecodeAttentionPlan {
  int batch = 0;                // sequences (batch bucket size)
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;             // 64 or 128 (others: cudaErrorInvalidValue)
  int max_context = 0;          // longest sequence the plan must serve
  int splits_per_sequence = 0;  // chunks each sequence's context is cut into
  int pages_per_split = 0;      // whole pages per chunk
  int min_pages_per_split = 1;  // shorter sequences take fewer splits, each at least this long
  int warps_per_block = 4;      // 4 (two blocks per SM) or 8 (one)
  bool cluster_merge = false;   // SplitMerge::cluster (the workspace is sized for either merge)
  size_t workspace_bytes = 0;   // partial outputs, log-sum-exps and merge counters
};

// Chooses splits so batch * kv_heads * splits blocks fill the SMs at the least cost (streaming,
// block starts, merge) at max_context; a shorter sequence is cut into fewer splits of at least
// min_pages_per_split pages on the device. forced_splits > 0 takes that many instead, at any
// length (at most one per page; for benchmarks and tests comparing plans); forced_warps 4 or 8
// fixes the block shape; merge fixes where splits merge (a cluster merge the shape cannot take
// is an error).
DecodeAttentionPlan plan_decode_attention(int batch, int q_heads, int kv_heads, int head_dim, int max_context,
                                          int num_sms, int forced_splits = 0, int forced_warps = 0,
                                          SplitMerge merge = SplitMerge::automatic);

// How many clusters of the cluster-merge kernel (one 8-warp block per SM) the current device holds
// at once, for clusters of 2, 4 and 8 blocks; all 0 without clusters. Asked of the device once.
// The H200 (132 SMs): 66, 30 and 15.
struct ResidentClusters {
  int of2 = 0, of4 = 0, of8 = 0;
  int of(int cluster) const { return cluster == 2 ? of2 : cluster == 4 ? of4 : cluster == 8 ? of8 : 0; }
};
ResidentClusters decode_attention_resident_clusters(int head_dim);

// For the batch of `plan` (made for a longer or equal max_context): a plan for short contexts
// whose splits merge in thread-block clusters, or none where the shape does not allow one. Its
// cluster size C is the largest of 8, 4, 2 with C x batch <= 8 whose batch x kv_heads clusters
// the device holds at once (`resident`): a batch shares one sequence's 8 splits per kv head, so
// from 5 sequences there is none. Its splits are C blocks of 8 warps, and it serves sequences up
// to 16 C pages (256 C tokens, at most plan.max_context): each split then streams at most 16
// pages, no longer than the L2 plan's blocks take for their minimum split (16 pages in 8 warps,
// 8 in 4), and the merge skips the L2 round trips. The splits may stream longer where the L2
// merge is large: one page per 400 bytes of the partials it would read (splits x group x head_dim
// bf16), a batch's 32 to 64, while the clusters hold at least a fifth of the SMs (one sequence:
// Llama-3.2-1B 2560 keys, Llama-3-8B 5120, Qwen2.5-7B 18816 under plans for 32k; two: 2048, 2560,
// 4096). The engine captures both plans and picks by the longest sequence each step.
std::optional<DecodeAttentionPlan> plan_short_context_decode_attention(const DecodeAttentionPlan& plan, int num_sms,
                                                                       const ResidentClusters& resident);

struct DecodeAttentionParams {
  const __nv_bfloat16* q = nullptr;     // [batch, q_heads, head_dim], rotated
  __nv_bfloat16* out = nullptr;         // [batch, q_heads, head_dim]
  PagedKv kv;                           // block table rows 0..batch-1 belong to the sequences
  const int32_t* seq_lens = nullptr;    // [batch] keys per sequence incl. the current token; 0: padded
  // [batch] or null (query i reads block-table row i): the block-table row each query reads. A
  // speculative verify step's k + 1 tokens of one sequence are k + 1 queries on its row, token j
  // with seq_lens = its own position + 1: the causal mask among them.
  const int32_t* sequences = nullptr;
  // Keys at the end of each query's length that the kernel launched just before this one appends
  // (a decode step: 1, the query's own; a verify step: its rows, which may start a page before
  // the query's newest). Their pages are read only once that kernel is done (first_appended_page).
  int appended_keys = 1;
  void* workspace = nullptr;            // plan.workspace_bytes; its first
                                        // decode_attention_counter_bytes(plan) zero before the call
                                        // (the kernel leaves them zero again; a plan of another
                                        // batch writes partials there: clear them after one ran)
  float scale = 0.0f;                   // usually 1/sqrt(head_dim)
  int sliding_window = 0;               // > 0: only the last `sliding_window` keys (Mistral)
};

// The first page of a query of `length` keys that holds one of its last `appended_keys` (those
// the kernel before attention is still writing): the pages before it may be read early, while
// that kernel finishes (a programmatic dependent launch), the others only after it.
__host__ __device__ inline int first_appended_page(int length, int appended_keys) {
  const int first = length - appended_keys;
  return (first > 0 ? first : 0) / kKvPageSize;
}

// The bytes at the start of a plan's workspace that hold its merge counters (0: it has none).
// Plans of different batch sizes lay the workspace out differently: one's log-sum-exps lie where
// another's counters are, so a caller that shares a workspace between plans zeroes these bytes
// before a call that follows another plan's.
size_t decode_attention_counter_bytes(const DecodeAttentionPlan& plan);

// cudaErrorInvalidValue when params do not match the plan (sizes, nulls, a length beyond
// plan.max_context is clamped on the device, never read out of bounds).
cudaError_t launch_decode_attention(const DecodeAttentionPlan& plan, const DecodeAttentionParams& params,
                                    cudaStream_t stream);

int decode_attention_launches(const DecodeAttentionPlan& plan);

}  // namespace deepfuse::kernels
