// Decode attention's host planner: how many splits of how many pages, blocks of 4 or 8 warps, and
// where the splits merge (docs/kernels/decode_attention.md, "The planner"). Plain C++; the kernel
// and its launcher are in decode_attention.cu.
#include <algorithm>
#include <limits>
#include <string>

#include "deepfuse/error.hpp"
#include "kernels/attention/decode_attention_plan.hpp"

namespace deepfuse::kernels {
namespace decode_attention_detail {
namespace {

// Plan costs in pages a 4-warp block streams (~0.5 µs each at a 1/264 share of 4.3 TB/s): a
// block's start (length, then page-table reads) and a split merge each cost about two. The model
// fills every resident slot: plans of one 4-warp block per SM stream as fast alone, but lose in a
// graph where the next launch starts early (docs/kernels/decode_attention.md, "Where the time
// goes (v1, per-block timelines)").
constexpr int kBlockStartPages = 2;
constexpr int kMergePages = 2;
// Inside the decode step a split merge costs more than the model's two pages: the last block's
// ticket, its L2 round trips for the partials and the next kernel's wait come after the stream
// (docs/kernels/decode_attention.md, "Short sequences in a long plan: at least 8 pages per
// split"). A sequence shorter than max_context therefore keeps at least this many pages per split
// (4-warp blocks; twice as many for 8 warps); the plan's split count is only reached by long ones.
constexpr int kMinPagesPerSplit = 8;
// Where the batch's (sequence, kv head) pairs fill every resident block slot unsplit, splits only
// even out the waves, and an 8-page split's merge is pure cost: Llama-3-8B at batch 64 with
// 512-token sequences under a plan for 32k (17 splits) ran 4% slower steps with 4 splits of 8
// pages than unsplit (docs/kernels/decode_attention.md, "Batches that fill the GPU unsplit").
constexpr int kMinPagesPerSplitFullWave = 32;
// What a short-context plan's splits may stream at least (their bound, in pages each): the L2
// plans' minimum split (16 pages in 8 warps, 8 in 4), so that up to there only the merge changes.
constexpr int kClusterSplitBoundPages = 16;
// The cluster splits may stream longer: each page more per split is worth it while the L2 merge
// it spares costs more, and that merge's last block reads every split's bf16 partial of every
// query head of the group (splits x group x head_dim x 2 bytes). One page per split for each
// kMergeBytesPerClusterPage of them, fitted to where one sequence's 8 cluster splits stopped
// paying in the decode step (docs/kernels/decode_attention.md, "Longer cluster splits where the
// merge is large").
constexpr int kMergeBytesPerClusterPage = 400;
// A batch's cluster splits (4 per sequence for two, 2 for three or four) stream 32 to 64 pages,
// whatever the merge: where a batch's clusters gained in the step (same section).
constexpr int kBatchClusterSplitMinPages = 32;
constexpr int kBatchClusterSplitMaxPages = 64;

size_t align_up(size_t bytes, size_t alignment) { return (bytes + alignment - 1) / alignment * alignment; }

int pages_for(int context) { return (context + kKvPageSize - 1) / kKvPageSize; }

// Pages one split of a short-context plan may stream, against the L2 plan it stands in for. The
// rule was measured where the clusters hold 32 (Qwen2.5-7B) or 64 blocks on 132 SMs; on fewer
// than a fifth of the SMs (a model with one or two kv heads) they would stream a long cache too
// slowly, so those keep the 16 pages.
int cluster_split_max_pages(const DecodeAttentionPlan& l2_plan, long long cluster_blocks, int num_sms) {
  if (5 * cluster_blocks < num_sms) return kClusterSplitBoundPages;
  const long long merge_bytes = 2LL * l2_plan.splits_per_sequence * (l2_plan.q_heads / l2_plan.kv_heads) * l2_plan.head_dim;
  long long pages = std::max<long long>(kClusterSplitBoundPages, merge_bytes / kMergeBytesPerClusterPage);
  if (l2_plan.batch > 1) pages = std::clamp<long long>(pages, kBatchClusterSplitMinPages, kBatchClusterSplitMaxPages);
  return static_cast<int>(pages);
}

}  // namespace

WorkspaceLayout workspace_layout(int batch, int kv_heads, int group, int head_dim, int splits) {
  WorkspaceLayout layout;
  if (splits <= 1) return layout;  // a single split writes the output directly
  const size_t pairs = static_cast<size_t>(batch) * kv_heads;
  layout.lse_offset = align_up(pairs * sizeof(unsigned), 256);
  layout.partial_offset = layout.lse_offset + align_up(pairs * splits * group * sizeof(float), 256);
  layout.bytes = layout.partial_offset + pairs * splits * group * head_dim * sizeof(__nv_bfloat16);
  return layout;
}

bool plan_is_consistent(const DecodeAttentionPlan& plan) {
  if (plan.batch < 1 || plan.kv_heads < 1 || plan.q_heads < 1 || plan.q_heads % plan.kv_heads != 0 ||
      plan.q_heads / plan.kv_heads > kMaxGroup || (plan.head_dim != 64 && plan.head_dim != 128) ||
      plan.max_context < 1 || plan.splits_per_sequence < 1 || plan.splits_per_sequence > kMaxSplits ||
      plan.pages_per_split < 1 || plan.min_pages_per_split < 1 || (plan.warps_per_block != 4 && plan.warps_per_block != 8))
    return false;
  if (static_cast<long long>(plan.splits_per_sequence) * plan.pages_per_split < pages_for(plan.max_context)) return false;
  if (plan.cluster_merge && (plan.warps_per_block != 8 || plan.q_heads / plan.kv_heads > 8 ||
                             plan.splits_per_sequence < 2 || plan.splits_per_sequence > kMaxClusterSplits))
    return false;
  const WorkspaceLayout layout = workspace_layout(plan.batch, plan.kv_heads, plan.q_heads / plan.kv_heads,
                                                  plan.head_dim, plan.splits_per_sequence);
  return plan.workspace_bytes >= layout.bytes && plan.batch <= 65535 && plan.kv_heads <= 65535;
}

}  // namespace decode_attention_detail

using namespace decode_attention_detail;

size_t decode_attention_counter_bytes(const DecodeAttentionPlan& plan) {
  const WorkspaceLayout layout = workspace_layout(plan.batch, plan.kv_heads, plan.q_heads / plan.kv_heads,
                                                  plan.head_dim, plan.splits_per_sequence);
  return layout.bytes > 0 ? layout.lse_offset : 0;
}

std::string decode_attention_forced_unsupported(int forced_splits, int forced_warps, SplitMerge merge, int group) {
  if (forced_splits < 0 || forced_splits > kMaxSplits)
    return "splits must be 0 (the planner's) to " + std::to_string(kMaxSplits);
  if (forced_warps != 0 && forced_warps != 4 && forced_warps != 8) return "warps must be 4 or 8";
  if (merge == SplitMerge::cluster) {
    if (forced_warps == 4) return "cluster merge needs blocks of 8 warps";
    if (forced_splits > kMaxClusterSplits)
      return "cluster merge takes at most " + std::to_string(kMaxClusterSplits) + " splits";
    if (group > kDecodeAttentionMaxClusterGroup)
      return "cluster merge takes at most " + std::to_string(kDecodeAttentionMaxClusterGroup) +
             " query heads per kv head";
  }
  return "";
}

DecodeAttentionPlan plan_decode_attention(int batch, int q_heads, int kv_heads, int head_dim, int max_context,
                                          int num_sms, int forced_splits, int forced_warps, SplitMerge merge) {
  auto text = [](int v) { return std::to_string(v); };
  DF_CHECK(batch >= 1 && batch <= 65535, "decode attention: batch " + text(batch) + " is outside [1, 65535]");
  DF_CHECK(kv_heads >= 1 && kv_heads <= 65535, "decode attention: kv_heads " + text(kv_heads) + " is outside [1, 65535]");
  DF_CHECK(q_heads >= 1 && q_heads % kv_heads == 0,
           "decode attention: q_heads " + text(q_heads) + " is not a positive multiple of kv_heads " + text(kv_heads));
  DF_CHECK(q_heads / kv_heads <= kMaxGroup, "decode attention: " + text(q_heads / kv_heads) +
                                                " query heads per kv head; at most " + text(kMaxGroup) + " supported");
  DF_CHECK(head_dim == 64 || head_dim == 128, "decode attention: head_dim " + text(head_dim) + " (64 or 128 supported)");
  DF_CHECK(max_context >= 1, "decode attention: max_context " + text(max_context) + " must be at least 1");
  DF_CHECK(num_sms >= 1, "decode attention: num_sms " + text(num_sms) + " must be at least 1");
  const int group = q_heads / kv_heads;
  const std::string forced = decode_attention_forced_unsupported(forced_splits, forced_warps, merge, group);
  DF_CHECK(forced.empty(), "decode attention: " + forced);
  const int max_pages = pages_for(max_context);
  const bool cluster = merge == SplitMerge::cluster;

  // A single sequence takes blocks of 8 warps: half the splits and partials for its merge; faster
  // at batch 1, mixed at 2-8 sequences (docs/kernels/decode_attention.md, "Blocks of 8 warps for
  // one sequence").
  const long long pairs = static_cast<long long>(batch) * kv_heads;
  const int warps = forced_warps > 0 ? forced_warps : batch == 1 || cluster ? 8 : 4;
  const long long slots = static_cast<long long>(num_sms) * (8 / warps);
  const int min_pages = (pairs >= slots ? kMinPagesPerSplitFullWave : kMinPagesPerSplit) * warps / 4;
  // Cost of s splits, in pages a 4-warp block streams: waves of resident blocks times each
  // block's start and pages, plus the merge. Only s that leave no split empty are distinct. The
  // plan serves every length up to max_context, and shorter sequences run fewer, shorter splits
  // (min_pages each), so a grid of several waves at max_context runs a wave and a part at mid
  // lengths: where the pairs fit one wave, the plan keeps to one (docs/kernels/decode_attention.md,
  // "One wave where the pairs fit one").
  int best_splits = 1;
  long long best_cost = std::numeric_limits<long long>::max();
  for (int splits = 1; splits <= std::min(max_pages, kMaxSplits); ++splits) {
    const int per_split = (max_pages + splits - 1) / splits;
    if ((max_pages + per_split - 1) / per_split != splits) continue;
    const long long waves = (pairs * splits + slots - 1) / slots;
    if (pairs <= slots && waves > 1) continue;
    const long long cost = waves * (kBlockStartPages + (per_split * 4 + warps - 1) / warps) + (splits > 1 ? kMergePages : 0);
    if (cost < best_cost) best_cost = cost, best_splits = splits;
  }

  // The count of distinct non-empty splits nearest below a request.
  auto distinct_splits = [&](int requested) {
    const int per_split = (max_pages + requested - 1) / requested;
    return (max_pages + per_split - 1) / per_split;
  };
  if (forced_splits > 0) {
    best_splits = distinct_splits(std::min(forced_splits, max_pages));
  } else if (cluster) {  // one cluster per (sequence, kv head): as many splits as it holds
    best_splits = distinct_splits(std::min(max_pages, kMaxClusterSplits));
  }

  DecodeAttentionPlan plan;
  plan.batch = batch;
  plan.q_heads = q_heads;
  plan.kv_heads = kv_heads;
  plan.head_dim = head_dim;
  plan.max_context = max_context;
  plan.splits_per_sequence = best_splits;
  plan.pages_per_split = (max_pages + best_splits - 1) / best_splits;
  // A cluster merge is cheap enough that every split streams even at a few pages
  // (docs/kernels/decode_attention.md, "Splits merged in a cluster").
  plan.min_pages_per_split = forced_splits > 0 || cluster ? 1 : min_pages;
  plan.warps_per_block = warps;
  plan.cluster_merge = cluster && best_splits > 1;
  plan.workspace_bytes = workspace_layout(batch, kv_heads, q_heads / kv_heads, head_dim, best_splits).bytes;
  return plan;
}

std::optional<DecodeAttentionPlan> plan_short_context_decode_attention(const DecodeAttentionPlan& plan, int num_sms,
                                                                       const ResidentClusters& resident) {
  if (plan.cluster_merge || plan.q_heads / plan.kv_heads > 8) return std::nullopt;
  // A batch's sequences share one sequence's 8 splits per kv head (4 each for 2 sequences, 2 for
  // 3-4, none from 5): the grid keeps the single-sequence plan's block count
  // (docs/kernels/decode_attention.md, "Splits merged in a cluster").
  const long long pairs = static_cast<long long>(plan.batch) * plan.kv_heads;
  int largest = kMaxClusterSplits;
  while (largest > 1 && largest * plan.batch > kMaxClusterSplits) largest /= 2;
  for (int cluster = largest; cluster >= 2; cluster /= 2) {
    if (pairs > resident.of(cluster)) continue;  // a cluster left for a second wave would wait
    const int max_pages = cluster_split_max_pages(plan, pairs * cluster, num_sms);
    const int context = static_cast<int>(std::min<long long>(plan.max_context, 1LL * cluster * max_pages * kKvPageSize));
    DecodeAttentionPlan shorter = plan_decode_attention(plan.batch, plan.q_heads, plan.kv_heads, plan.head_dim,
                                                        context, num_sms, cluster, 8, SplitMerge::cluster);
    if (!shorter.cluster_merge) return std::nullopt;  // a single page: nothing to merge
    return shorter;
  }
  return std::nullopt;
}

}  // namespace deepfuse::kernels
