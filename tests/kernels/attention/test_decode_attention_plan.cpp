// Host side of the decode attention launcher, no GPU needed: plan_decode_attention's split choice
// and workspace size, its argument errors, and launch_decode_attention rejecting bad params with
// cudaErrorInvalidValue before it touches the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/decode_attention.hpp"

namespace deepfuse {
namespace {

using kernels::DecodeAttentionParams;
using kernels::DecodeAttentionPlan;
using kernels::plan_decode_attention;

int pages_for(int context) { return (context + kernels::kKvPageSize - 1) / kernels::kKvPageSize; }

struct PlanInput {
  int batch, q_heads, kv_heads, head_dim, max_context, num_sms;
};

std::string describe(const PlanInput& in) {
  return "batch " + std::to_string(in.batch) + ", heads " + std::to_string(in.q_heads) + "/" +
         std::to_string(in.kv_heads) + ", d " + std::to_string(in.head_dim) + ", context " +
         std::to_string(in.max_context) + ", " + std::to_string(in.num_sms) + " SMs";
}

// What every plan must satisfy: the splits cover max_context with none empty, and the workspace
// holds a counter per (sequence, kv head) plus a partial output (bf16) and log-sum-exp (fp32) per
// split and head.
void expect_consistent(const PlanInput& in, const DecodeAttentionPlan& plan) {
  SCOPED_TRACE(describe(in));
  EXPECT_EQ(plan.batch, in.batch);
  EXPECT_EQ(plan.q_heads, in.q_heads);
  EXPECT_EQ(plan.kv_heads, in.kv_heads);
  EXPECT_EQ(plan.head_dim, in.head_dim);
  EXPECT_EQ(plan.max_context, in.max_context);
  const int pages = pages_for(in.max_context);
  ASSERT_GE(plan.splits_per_sequence, 1);
  EXPECT_LE(plan.splits_per_sequence, pages);
  EXPECT_GE(plan.splits_per_sequence * plan.pages_per_split, pages);
  EXPECT_LT((plan.splits_per_sequence - 1) * plan.pages_per_split, pages) << "the last split would be empty";
  if (plan.splits_per_sequence == 1) {
    EXPECT_EQ(plan.workspace_bytes, 0u) << "one split writes the output directly";
  } else {
    const size_t pairs = static_cast<size_t>(in.batch) * in.kv_heads;
    const size_t group = in.q_heads / in.kv_heads;
    const size_t rows = pairs * plan.splits_per_sequence * group;  // (split, head) rows
    const size_t needed = pairs * sizeof(uint32_t) + rows * (in.head_dim * sizeof(uint16_t) + sizeof(float));
    EXPECT_GE(plan.workspace_bytes, needed);
    EXPECT_LE(plan.workspace_bytes, needed + 1024) << "workspace padding beyond alignment";
  }
  if (plan.cluster_merge) {
    EXPECT_EQ(plan.warps_per_block, 8);
    EXPECT_LE(in.q_heads / in.kv_heads, 8);
    EXPECT_GE(plan.splits_per_sequence, 2);
    EXPECT_LE(plan.splits_per_sequence, 8) << "a portable cluster holds at most 8 blocks";
  }
  EXPECT_EQ(kernels::decode_attention_launches(plan), 1);
}

TEST(DecodeAttentionPlan, EveryPlanIsConsistent) {
  for (int batch : {1, 3, 8, 64})
    for (int kv_heads : {1, 8})
      for (int head_dim : {64, 128})
        for (int context : {1, 15, 16, 17, 1000, 8192, 32768, 131072})
          for (int sms : {1, 78, 132, 1000}) {
            const PlanInput in{batch, 4 * kv_heads, kv_heads, head_dim, context, sms};
            expect_consistent(in, plan_decode_attention(in.batch, in.q_heads, in.kv_heads, in.head_dim,
                                                        in.max_context, in.num_sms));
          }
}

// SM counts of the GPUs the planner must serve (A100 108, H100 PCIe 114, H100 SXM and H200 132,
// others around them): nothing below holds for one count only.
constexpr int kSmCounts[] = {78, 108, 114, 132, 144};

// Keys each split of a (sequence, kv head) covers at max_context, in order: split i takes pages
// [i * pages_per_split, (i + 1) * pages_per_split) of the sequence, clipped to its last page.
std::vector<long long> keys_per_split(const DecodeAttentionPlan& plan) {
  std::vector<long long> keys;
  for (int split = 0; split < plan.splits_per_sequence; ++split) {
    const long long first = static_cast<long long>(split) * plan.pages_per_split * kernels::kKvPageSize;
    const long long end = std::min<long long>(first + static_cast<long long>(plan.pages_per_split) * kernels::kKvPageSize,
                                              plan.max_context);
    keys.push_back(std::max<long long>(0, end - first));
  }
  return keys;
}

// Properties of automatic plans on any SM count, batch, head shape and length:
//  - every key of the longest sequence is in exactly one split, and no split is empty;
//  - the workspace holds the counters and every split's partials (expect_consistent);
//  - where the (sequence, kv head) pairs fit the resident block slots (two 4-warp blocks or one
//    8-warp block per SM), the plan keeps to one wave: pairs x splits <= slots; and on a cache long
//    enough to spread, its splits are as short as one wave allows (to the page a 4-warp block
//    streams) and the blocks hold more than half the slots;
//  - where the pairs need several waves, the waves are more than 80% full (no ragged last wave).
TEST(DecodeAttentionPlan, InvariantsOnAnySmCount) {
  struct Heads {
    int q, kv;
  };
  for (int sms : kSmCounts)
    for (int batch : {1, 2, 3, 5, 8, 12, 16, 32, 48, 64, 128})
      for (const Heads heads : {Heads{4, 1}, Heads{16, 2}, Heads{28, 4}, Heads{32, 8}})
        for (int head_dim : {64, 128})
          for (int context : {1, 17, 576, 8192, 32768, 100000, 131072}) {
            const PlanInput in{batch, heads.q, heads.kv, head_dim, context, sms};
            SCOPED_TRACE(describe(in));
            const auto plan = plan_decode_attention(batch, heads.q, heads.kv, head_dim, context, sms);
            expect_consistent(in, plan);

            const std::vector<long long> keys = keys_per_split(plan);
            long long covered = 0;
            for (size_t split = 0; split < keys.size(); ++split) {
              EXPECT_GT(keys[split], 0) << "split " << split << " of " << keys.size() << " is empty";
              covered += keys[split];
            }
            EXPECT_EQ(covered, context) << "the splits must cover every key exactly once";

            const int warps = plan.warps_per_block;
            EXPECT_EQ(warps, batch == 1 ? 8 : 4) << "one sequence takes 8-warp blocks, a batch 4-warp ones";
            const long long pages = pages_for(context);
            const long long pairs = static_cast<long long>(batch) * heads.kv;
            const long long slots = static_cast<long long>(sms) * (8 / warps);
            const long long blocks = pairs * plan.splits_per_sequence;
            const long long waves = (blocks + slots - 1) / slots;
            if (pairs <= slots) {
              EXPECT_LE(blocks, slots) << "the pairs fit one wave, the plan must keep to one";
              const long long most_splits = slots / pairs;  // splits per pair one wave holds
              if (pages >= 2 * most_splits * warps) {
                // Pages a 4-warp block streams for a split of `p` pages in this block shape.
                auto streamed = [&](long long p) { return (p * 4 + warps - 1) / warps; };
                const long long shortest = (pages + most_splits - 1) / most_splits;
                EXPECT_EQ(streamed(plan.pages_per_split), streamed(shortest))
                    << plan.splits_per_sequence << " splits of " << plan.pages_per_split << " pages; one wave holds "
                    << most_splits << " splits of " << shortest;
                EXPECT_GT(2 * blocks, slots) << blocks << " blocks leave most of the " << slots << " slots idle";
              }
            } else if (pages >= 64) {
              const double occupancy = static_cast<double>(blocks) / static_cast<double>(waves * slots);
              EXPECT_GT(occupancy, 0.8) << blocks << " blocks in " << waves << " waves of " << slots << " slots";
            }
          }
}

// One sequence takes 8-warp blocks (half the splits to merge), more take 4-warp blocks; a forced
// block shape is kept, and short sequences keep 2 pages per warp and split.
TEST(DecodeAttentionPlan, BlockShapePerBatch) {
  for (int sms : kSmCounts)
  for (int batch : {1, 2, 8}) {
    const PlanInput in{batch, 32, 8, 128, 8192, sms};
    const auto plan = plan_decode_attention(batch, 32, 8, 128, 8192, sms);
    expect_consistent(in, plan);
    EXPECT_EQ(plan.warps_per_block, batch == 1 ? 8 : 4) << describe(in);
    EXPECT_EQ(plan.min_pages_per_split, 2 * plan.warps_per_block) << describe(in);
    for (int warps : {4, 8}) {
      const auto forced = plan_decode_attention(batch, 32, 8, 128, 8192, sms, 0, warps);
      expect_consistent(in, forced);
      EXPECT_EQ(forced.warps_per_block, warps) << describe(in);
    }
  }
}

// A forced split count is taken as far as distinct, non-empty splits allow.
TEST(DecodeAttentionPlan, ForcedSplits) {
  for (int sms : kSmCounts) {
    const PlanInput in{1, 32, 8, 128, 8192, sms};
    for (int forced : {1, 7, 32, 33, 256}) {
      const auto plan = plan_decode_attention(1, 32, 8, 128, 8192, sms, forced);
      expect_consistent(in, plan);
      EXPECT_EQ(plan.splits_per_sequence, forced == 33 ? 32 : forced) << "forced " << forced << ", " << sms << " SMs";
    }
  }
  EXPECT_EQ(plan_decode_attention(1, 32, 8, 128, 100, 132, 64).splits_per_sequence, 7) << "100 keys are 7 pages";
  EXPECT_EQ(plan_decode_attention(1, 32, 8, 128, 8192, 132, 7).min_pages_per_split, 1)
      << "a forced count holds at any length";
}

// Sequences shorter than max_context are cut into fewer splits of at least a few pages each (the
// merge in L2 costs more than streaming a few pages); the plan's count is what long ones reach.
TEST(DecodeAttentionPlan, ShortSequencesTakeFewerSplits) {
  for (int context : {100, 576, 8192, 32768}) {
    const auto plan = plan_decode_attention(1, 32, 8, 128, context, 132);
    EXPECT_GT(plan.min_pages_per_split, 1) << context;
    EXPECT_LE(plan.min_pages_per_split, 16) << context << ": short sequences would lose their spread";
  }
}

// A batch whose (sequence, kv head) pairs fill every block slot unsplit splits only long
// sequences: a 512-token one stays whole under a plan for 32k, an 8k one still splits.
TEST(DecodeAttentionPlan, FullBatchesSplitOnlyLongSequences) {
  const auto full = plan_decode_attention(64, 32, 8, 128, 32816, 132);  // 512 pairs, 264 slots
  EXPECT_GT(full.splits_per_sequence, 1);
  EXPECT_EQ(full.min_pages_per_split, 32);
  EXPECT_GE(full.min_pages_per_split, 512 / 16) << "512 tokens must run as one split";
  EXPECT_LT(full.min_pages_per_split, 8192 / 16 / 2) << "8k tokens must still split";
  const auto partial = plan_decode_attention(32, 32, 8, 128, 32816, 132);  // 256 pairs: splits fill the GPU
  EXPECT_EQ(partial.min_pages_per_split, 8);
}

// Splits merged in a thread-block cluster: forced on any batch whose shape allows it (automatic
// plans merge in L2; the short-context plans below are the engine's clusters); a shape it cannot
// take is refused with the reason.
TEST(DecodeAttentionPlan, ClusterMerge) {
  using kernels::SplitMerge;
  for (int batch : {1, 3})
    for (int context : {100, 1000, 8192, 32768})
      for (int splits : {0, 2, 8}) {
        const PlanInput in{batch, 32, 8, 128, context, 132};
        const auto plan = plan_decode_attention(batch, 32, 8, 128, context, 132, splits, 0, SplitMerge::cluster);
        expect_consistent(in, plan);
        EXPECT_EQ(plan.cluster_merge, plan.splits_per_sequence > 1) << describe(in) << ", splits " << splits;
        EXPECT_EQ(plan.warps_per_block, 8) << describe(in);
        const auto workspace = plan_decode_attention(batch, 32, 8, 128, context, 132, splits, 8, SplitMerge::workspace);
        EXPECT_FALSE(workspace.cluster_merge);
        if (splits > 0)  // the same splits: a device without clusters merges the cluster plan's in L2
          EXPECT_EQ(workspace.workspace_bytes, plan.workspace_bytes) << describe(in) << ", splits " << splits;
      }
  EXPECT_FALSE(plan_decode_attention(1, 32, 8, 128, 2048, 132).cluster_merge) << "automatic plans merge in L2";
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 8192, 132, 9, 0, SplitMerge::cluster), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 8192, 132, 0, 4, SplitMerge::cluster), Error);
  try {
    plan_decode_attention(1, 96, 8, 128, 8192, 132, 0, 0, SplitMerge::cluster);
    ADD_FAILURE() << "12 query heads per kv head were accepted for a cluster merge";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cluster merge"), std::string::npos) << e.what();
  }
}

// Clusters of 2, 4 and 8 one-block-per-SM blocks a device of `sms` SMs holds at once: all of
// them, a GPU whose GPCs strand some SMs (the H200's 132 hold 66, 30 and 15), and a small share.
std::vector<kernels::ResidentClusters> resident_cluster_cases(int sms) {
  return {{sms / 2, sms / 4, sms / 8}, {sms / 2, sms * 30 / 132, sms * 15 / 132}, {4, 2, 1}};
}

// The cluster size the header promises: the largest of 8, 4, 2 with size x batch <= 8 whose
// batch x kv_heads clusters the device holds at once; 0 for none.
int expected_cluster(int batch, int kv_heads, const kernels::ResidentClusters& resident) {
  for (int cluster : {8, 4, 2})
    if (cluster * batch <= 8 && static_cast<long long>(batch) * kv_heads <= resident.of(cluster)) return cluster;
  return 0;
}

// Short-context plans, on any SM count and resident clusters: the promised cluster size as the
// split count (fewer only where the cache has fewer pages), merged in the cluster by 8-warp blocks
// whose every split streams; serving at least 16 pages per split (256 keys x cluster) and never
// beyond the long plan's context; a batch's splits at most 64 pages; and none where no cluster
// fits, from 5 sequences, for groups of more than 8 heads, on a device without clusters, or for a
// single page.
TEST(DecodeAttentionPlan, ShortContextPlans) {
  using kernels::plan_short_context_decode_attention;
  for (int sms : kSmCounts)
    for (const kernels::ResidentClusters& resident : resident_cluster_cases(sms))
      for (int batch : {1, 2, 3, 4, 5})
        for (int kv_heads : {1, 2, 4, 8, 16, 32})
          for (int context : {16, 100, 1000, 32768}) {
            const int q_heads = 4 * kv_heads;
            const auto long_plan = plan_decode_attention(batch, q_heads, kv_heads, 128, context, sms);
            const auto plan = plan_short_context_decode_attention(long_plan, sms, resident);
            const std::string what = std::to_string(sms) + " SMs holding " + std::to_string(resident.of2) + "/" +
                                     std::to_string(resident.of4) + "/" + std::to_string(resident.of8) +
                                     " clusters, batch " + std::to_string(batch) + ", " + std::to_string(kv_heads) +
                                     " kv heads, plan for " + std::to_string(context);
            const int cluster = expected_cluster(batch, kv_heads, resident);
            if (cluster == 0 || pages_for(context) == 1) {
              EXPECT_FALSE(plan.has_value()) << what;
              continue;
            }
            ASSERT_TRUE(plan.has_value()) << what;
            expect_consistent({batch, q_heads, kv_heads, 128, plan->max_context, sms}, *plan);
            EXPECT_TRUE(plan->cluster_merge) << what;
            EXPECT_EQ(plan->warps_per_block, 8) << what;
            EXPECT_EQ(plan->min_pages_per_split, 1) << what << ": every split streams";
            EXPECT_LE(plan->splits_per_sequence, cluster) << what;
            if (pages_for(plan->max_context) >= cluster) {
              EXPECT_EQ(plan->splits_per_sequence, cluster) << what;
            }
            EXPECT_LE(plan->max_context, context) << what;
            EXPECT_GE(plan->max_context, std::min(context, 256 * cluster)) << what;
            if (batch > 1) {
              EXPECT_LE(plan->max_context, std::min(context, 1024 * cluster)) << what;
            }
          }
  const kernels::ResidentClusters all{66, 33, 16};
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(1, 96, 8, 128, 8192, 132), 132, all))
      << "12 heads per kv head";
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(1, 32, 8, 128, 8192, 132), 132, {}))
      << "a device without clusters";
}

// How long a short-context plan's splits may stream, on any SM count (the header's rule): 16
// pages each while the clusters hold under a fifth of the SMs; else one page per 400 bytes of the
// bf16 partials the L2 plan's merge would read (its splits x group x head_dim x 2), at least 16,
// and for a batch between 32 and 64. So the bound grows with the merge it spares.
TEST(DecodeAttentionPlan, ClusterBoundGrowsWithTheMerge) {
  using kernels::plan_short_context_decode_attention;
  struct Shape {
    const char* model;
    int q_heads, kv_heads, head_dim;
  };
  const Shape shapes[] = {{"Llama-3.2-1B", 32, 8, 64}, {"Llama-3-8B", 32, 8, 128}, {"Qwen2.5-7B", 28, 4, 128},
                          {"two kv heads", 16, 2, 128}};
  for (int sms : kSmCounts)
    for (const Shape& s : shapes)
      for (int batch : {1, 2, 4})
        for (int context : {3000, 32768, 32800}) {
          const kernels::ResidentClusters resident{sms / 2, sms / 4, sms / 8};
          const auto l2 = plan_decode_attention(batch, s.q_heads, s.kv_heads, s.head_dim, context, sms);
          const auto plan = plan_short_context_decode_attention(l2, sms, resident);
          const std::string what = std::string(s.model) + ", batch " + std::to_string(batch) + ", " +
                                   std::to_string(sms) + " SMs, plan for " + std::to_string(context);
          const int cluster = expected_cluster(batch, s.kv_heads, resident);
          if (cluster == 0) {
            EXPECT_FALSE(plan.has_value()) << what;
            continue;
          }
          ASSERT_TRUE(plan.has_value()) << what;
          const long long cluster_blocks = static_cast<long long>(batch) * s.kv_heads * cluster;
          const long long merge_bytes = 2LL * l2.splits_per_sequence * (s.q_heads / s.kv_heads) * s.head_dim;
          long long pages = 16;
          if (5 * cluster_blocks >= sms) {
            pages = std::max<long long>(16, merge_bytes / 400);
            if (batch > 1) pages = std::clamp<long long>(pages, 32, 64);
          }
          EXPECT_EQ(plan->max_context, std::min<long long>(context, cluster * pages * kernels::kKvPageSize))
              << what << ": " << merge_bytes << " bytes of partials, " << cluster_blocks << " cluster blocks";
          EXPECT_EQ(plan->splits_per_sequence, cluster) << what;
        }
}

TEST(DecodeAttentionPlan, RejectsBadSizes) {
  EXPECT_THROW(plan_decode_attention(0, 32, 8, 128, 4096, 132), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 0, 128, 4096, 132), Error);
  EXPECT_THROW(plan_decode_attention(1, 30, 8, 128, 4096, 132), Error);   // not a multiple
  EXPECT_THROW(plan_decode_attention(1, 136, 8, 128, 4096, 132), Error);  // group of 17
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 96, 4096, 132), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 256, 4096, 132), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 0, 132), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 4096, 0), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 4096, 132, 257), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 4096, 132, -1), Error);
  EXPECT_THROW(plan_decode_attention(1, 32, 8, 128, 4096, 132, 0, 6), Error);  // 4 or 8 warps
  try {
    plan_decode_attention(1, 32, 8, 96, 4096, 132);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
}

// Stand-in device addresses: the checks under test run on the host before anything is launched.
template <typename T>
T* fake_pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

TEST(DecodeAttentionLaunch, RejectsBadParamsWithInvalidValue) {
  const DecodeAttentionPlan plan = plan_decode_attention(2, 32, 8, 128, 1000, 132);
  ASSERT_GT(plan.splits_per_sequence, 1) << "the workspace checks need a plan that splits";
  DecodeAttentionParams valid;
  valid.q = fake_pointer<const __nv_bfloat16>(0x100000);
  valid.out = fake_pointer<__nv_bfloat16>(0x200000);
  valid.kv.k_pages = fake_pointer<__nv_bfloat16>(0x300000);
  valid.kv.v_pages = fake_pointer<__nv_bfloat16>(0x400000);
  valid.kv.block_table = fake_pointer<const int32_t>(0x500000);
  valid.kv.max_pages_per_seq = pages_for(1000);
  valid.kv.kv_heads = 8;
  valid.kv.head_dim = 128;
  valid.seq_lens = fake_pointer<const int32_t>(0x600000);
  valid.workspace = fake_pointer<void>(0x700000);
  valid.scale = 0.08838835f;

  // Without a device the valid call gets past the checks and fails on the missing GPU; with one
  // it would launch on the stand-in addresses, so it is only made here.
  if (!cuda_device_available()) EXPECT_NE(kernels::launch_decode_attention(plan, valid, nullptr), cudaErrorInvalidValue);

  struct Mutation {
    const char* what;
    std::function<void(DecodeAttentionPlan&, DecodeAttentionParams&)> apply;
  };
  const std::vector<Mutation> mutations = {
      {"null q", [](auto&, auto& p) { p.q = nullptr; }},
      {"null out", [](auto&, auto& p) { p.out = nullptr; }},
      {"null seq_lens", [](auto&, auto& p) { p.seq_lens = nullptr; }},
      {"null k_pages", [](auto&, auto& p) { p.kv.k_pages = nullptr; }},
      {"null v_pages", [](auto&, auto& p) { p.kv.v_pages = nullptr; }},
      {"null block_table", [](auto&, auto& p) { p.kv.block_table = nullptr; }},
      {"null workspace", [](auto&, auto& p) { p.workspace = nullptr; }},
      {"kv heads differ from the plan", [](auto&, auto& p) { p.kv.kv_heads = 4; }},
      {"head_dim differs from the plan", [](auto&, auto& p) { p.kv.head_dim = 64; }},
      {"block table rows shorter than max_context", [](auto&, auto& p) { p.kv.max_pages_per_seq = pages_for(1000) - 1; }},
      {"misaligned k_pages", [](auto&, auto& p) { p.kv.k_pages = fake_pointer<__nv_bfloat16>(0x300008); }},
      {"misaligned out", [](auto&, auto& p) { p.out = fake_pointer<__nv_bfloat16>(0x200002); }},
      {"misaligned q", [](auto&, auto& p) { p.q = fake_pointer<const __nv_bfloat16>(0x100002); }},
      {"zero scale", [](auto&, auto& p) { p.scale = 0.0f; }},
      {"NaN scale", [](auto&, auto& p) { p.scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"negative window", [](auto&, auto& p) { p.sliding_window = -1; }},
      {"no appended key", [](auto&, auto& p) { p.appended_keys = 0; }},
      {"default plan", [](auto& plan, auto&) { plan = DecodeAttentionPlan{}; }},
      {"plan head_dim 96", [](auto& plan, auto&) { plan.head_dim = 96; }},
      {"plan with zero splits", [](auto& plan, auto&) { plan.splits_per_sequence = 0; }},
      {"plan splits too short for max_context", [](auto& plan, auto&) { plan.pages_per_split = 1; }},
      {"plan workspace too small", [](auto& plan, auto&) { plan.workspace_bytes -= 4; }},
      {"plan group of 17", [](auto& plan, auto&) { plan.q_heads = 17 * plan.kv_heads; }},
  };
  for (const Mutation& m : mutations) {
    DecodeAttentionPlan bad_plan = plan;
    DecodeAttentionParams bad = valid;
    m.apply(bad_plan, bad);
    EXPECT_EQ(kernels::launch_decode_attention(bad_plan, bad, nullptr), cudaErrorInvalidValue) << m.what;
  }
}

// The pages attention may read before the QKV kernel ahead of it is done end before the page of
// the first key that kernel appends. A verify step's query on a fresh page also depends on the
// keys its sequence's earlier entries append on the page before (the bug test_speculative_gpu
// caught: only the newest page waited).
TEST(DecodeAttentionLaunch, FirstAppendedPage) {
  constexpr int P = kernels::kKvPageSize;
  using kernels::first_appended_page;
  // A decode step: the query's own key, on its newest page.
  for (int length : {1, P - 1, P, P + 1, 2 * P, 5 * P + 3}) EXPECT_EQ(first_appended_page(length, 1), (length - 1) / P);
  // A verify step of 3 rows whose sequence was fed at position P - 1: its entry at position P
  // (length P + 1) has key P - 1 of this step on page 0.
  EXPECT_EQ(first_appended_page(P + 1, 3), 0);
  EXPECT_EQ(first_appended_page(P + 2, 3), 0);
  EXPECT_EQ(first_appended_page(P + 3, 3), 1);
  EXPECT_EQ(first_appended_page(2 * P + 1, 2 * P), 0);
  // More appended keys than the query has: from its first page.
  EXPECT_EQ(first_appended_page(2, 7), 0);
  EXPECT_EQ(first_appended_page(1, 1), 0);
}

}  // namespace
}  // namespace deepfuse
