// Host side of the decode attention launcher, no GPU needed: plan_decode_attention's split choice
// and workspace size, its argument errors, and launch_decode_attention rejecting bad params with
// cudaErrorInvalidValue before it touches the device.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "kernels/attention/decode_attention.cuh"

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

// With enough pages to go round, the blocks fill the SMs and fit the resident slots (two 4-warp
// blocks or one 8-warp block per SM) in one wave, or cover several waves almost fully.
TEST(DecodeAttentionPlan, FillsTheGpuWithoutARaggedLastWave) {
  for (int sms : {78, 114, 132})
    for (int batch : {1, 2, 5, 8, 32, 48})
      for (int context : {8192, 32768, 100000}) {
        const PlanInput in{batch, 32, 8, 128, context, sms};
        const auto plan = plan_decode_attention(batch, 32, 8, 128, context, sms);
        const long long blocks = static_cast<long long>(batch) * 8 * plan.splits_per_sequence;
        const long long slots = static_cast<long long>(sms) * (8 / plan.warps_per_block);
        const long long waves = (blocks + slots - 1) / slots;
        EXPECT_GE(blocks * plan.warps_per_block, 4LL * sms) << describe(in) << ": only " << blocks << " blocks";
        // Fraction of the resident slots busy, averaged over the waves. Where the (sequence, kv
        // head) pairs fit one wave the plan keeps to one: shorter sequences run fewer splits, and
        // a second wave would then be a part-filled one.
        const double occupancy = static_cast<double>(blocks) / static_cast<double>(waves * slots);
        if (batch * 8 <= slots) {
          EXPECT_EQ(waves, 1) << describe(in);
          EXPECT_GT(occupancy, 0.75) << describe(in) << ": " << blocks << " blocks";
        } else {
          EXPECT_GT(occupancy, 0.8) << describe(in) << ": " << blocks << " blocks in " << waves << " waves";
        }
      }
}

// The benchmark shapes on an H200 (132 SMs).
TEST(DecodeAttentionPlan, H200BenchmarkShapes) {
  const auto one_by_8k = plan_decode_attention(1, 32, 8, 128, 8192, 132);
  EXPECT_EQ(one_by_8k.warps_per_block, 8);
  EXPECT_GE(one_by_8k.splits_per_sequence, 16) << "one sequence must spread over the SMs";
  const auto one_by_32k = plan_decode_attention(1, 32, 8, 128, 32768, 132);
  EXPECT_GE(8 * one_by_32k.splits_per_sequence, 128);
  EXPECT_LE(8 * one_by_32k.splits_per_sequence, 132) << "one 8-warp block per SM, one wave";
  const auto eight_by_32k = plan_decode_attention(8, 32, 8, 128, 32768, 132);
  EXPECT_EQ(eight_by_32k.warps_per_block, 4);
  EXPECT_EQ(eight_by_32k.splits_per_sequence, 4) << "256 blocks of 4 warps in the 264 slots";
  const auto many = plan_decode_attention(32, 32, 8, 128, 8192, 132);
  EXPECT_EQ(many.splits_per_sequence, 1) << "256 (sequence, kv head) blocks already fill 132 SMs";
  EXPECT_EQ(many.workspace_bytes, 0u);
}

// One sequence takes 8-warp blocks (half the splits to merge), more take 4-warp blocks; a forced
// block shape is kept, and short sequences keep 2 pages per warp and split.
TEST(DecodeAttentionPlan, BlockShapePerBatch) {
  for (int batch : {1, 2, 8}) {
    const PlanInput in{batch, 32, 8, 128, 8192, 132};
    const auto plan = plan_decode_attention(batch, 32, 8, 128, 8192, 132);
    expect_consistent(in, plan);
    EXPECT_EQ(plan.warps_per_block, batch == 1 ? 8 : 4) << describe(in);
    EXPECT_EQ(plan.min_pages_per_split, 2 * plan.warps_per_block) << describe(in);
    for (int warps : {4, 8}) {
      const auto forced = plan_decode_attention(batch, 32, 8, 128, 8192, 132, 0, warps);
      expect_consistent(in, forced);
      EXPECT_EQ(forced.warps_per_block, warps) << describe(in);
    }
  }
}

// A forced split count is taken as far as distinct, non-empty splits allow.
TEST(DecodeAttentionPlan, ForcedSplits) {
  const PlanInput in{1, 32, 8, 128, 8192, 132};
  for (int forced : {1, 7, 32, 33, 256}) {
    const auto plan = plan_decode_attention(1, 32, 8, 128, 8192, 132, forced);
    expect_consistent(in, plan);
    EXPECT_EQ(plan.splits_per_sequence, forced == 33 ? 32 : forced) << "forced " << forced;
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

// Short-context plans: the largest cluster (8, 4, 2) of at most 8 / batch whose batch x kv_heads
// clusters the device holds at once, as many splits of 8 warps, sequences up to 16 pages per
// split; none from 5 sequences, where no cluster fits, for groups of more than 8 heads, or for a
// single page.
TEST(DecodeAttentionPlan, ShortContextPlans) {
  using kernels::plan_short_context_decode_attention;
  const kernels::ResidentClusters h200{66, 30, 15};
  struct Expected {
    int batch, kv_heads, cluster;
  };
  for (const Expected e : {Expected{1, 8, 8}, Expected{2, 8, 4}, Expected{3, 8, 2}, Expected{4, 8, 2},
                           Expected{1, 4, 8}, Expected{2, 4, 4}, Expected{4, 4, 2}, Expected{1, 16, 4},
                           Expected{1, 32, 2}}) {
    const int q_heads = 4 * e.kv_heads;
    for (int context : {32768, 1000}) {
      const auto long_plan = plan_decode_attention(e.batch, q_heads, e.kv_heads, 128, context, 132);
      const auto plan = plan_short_context_decode_attention(long_plan, 132, h200);
      const std::string what = "batch " + std::to_string(e.batch) + ", " + std::to_string(e.kv_heads) +
                               " kv heads, plan for " + std::to_string(context);
      ASSERT_TRUE(plan.has_value()) << what;
      expect_consistent({e.batch, q_heads, e.kv_heads, 128, plan->max_context, 132}, *plan);
      EXPECT_TRUE(plan->cluster_merge) << what;
      EXPECT_EQ(plan->warps_per_block, 8) << what;
      EXPECT_EQ(plan->min_pages_per_split, 1) << what << ": every split streams";
      // At least 16 pages per split, more where the L2 merge is large (below); a batch's 32-64.
      EXPECT_GE(plan->max_context, std::min(context, 256 * e.cluster)) << what;
      if (e.batch > 1) EXPECT_LE(plan->max_context, std::min(context, 1024 * e.cluster)) << what;
      if (context > 256 * e.cluster) EXPECT_EQ(plan->splits_per_sequence, e.cluster) << what;
    }
  }
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(5, 32, 8, 128, 8192, 132), 132, h200))
      << "5 sequences: less than 2 of the 8 splits each";
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(2, 160, 40, 128, 8192, 132), 132, h200))
      << "80 clusters of 2 do not fit";
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(1, 96, 8, 128, 8192, 132), 132, h200))
      << "12 heads per kv head";
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(1, 32, 8, 128, 8192, 132), 132, {}))
      << "a device without clusters";
  EXPECT_FALSE(plan_short_context_decode_attention(plan_decode_attention(1, 32, 8, 128, 16, 132), 132, h200))
      << "one page: nothing to merge";
}

// Cluster splits stream one page each per 400 bytes of the bf16 partials the L2 plan's merge
// would read (splits x query heads per kv head x head_dim x 2), at least 16, for a batch 32 to
// 64: the bounds fitted to the decode step on the H200 (docs/kernels/decode_attention.md).
TEST(DecodeAttentionPlan, ClusterBoundGrowsWithTheMerge) {
  using kernels::plan_short_context_decode_attention;
  const kernels::ResidentClusters h200{66, 30, 15};
  struct Shape {
    const char* model;
    int q_heads, kv_heads, head_dim, l2_splits, keys;
  };
  for (const Shape s : {Shape{"Llama-3.2-1B", 32, 8, 64, 16, 2560}, Shape{"Llama-3-8B", 32, 8, 128, 16, 5120},
                        Shape{"Qwen2.5-7B", 28, 4, 128, 32, 18304}}) {
    const auto l2 = plan_decode_attention(1, s.q_heads, s.kv_heads, s.head_dim, 32768, 132);
    ASSERT_EQ(l2.splits_per_sequence, s.l2_splits) << s.model;
    const auto plan = plan_short_context_decode_attention(l2, 132, h200);
    ASSERT_TRUE(plan.has_value()) << s.model;
    EXPECT_EQ(plan->max_context, s.keys) << s.model;
    // The bench's engines plan for 32800 keys, where Qwen2.5-7B's L2 plan takes 33 splits.
    const auto engine_plan = plan_short_context_decode_attention(
        plan_decode_attention(1, s.q_heads, s.kv_heads, s.head_dim, 32800, 132), 132, h200);
    ASSERT_TRUE(engine_plan.has_value()) << s.model;
    EXPECT_GE(engine_plan->max_context, s.keys) << s.model;
    EXPECT_EQ(plan->splits_per_sequence, 8) << s.model;
    expect_consistent({1, s.q_heads, s.kv_heads, s.head_dim, plan->max_context, 132}, *plan);
    // Never beyond the engine's own context.
    const auto short_engine = plan_short_context_decode_attention(
        plan_decode_attention(1, s.q_heads, s.kv_heads, s.head_dim, 3000, 132), 132, h200);
    ASSERT_TRUE(short_engine.has_value()) << s.model;
    EXPECT_LE(short_engine->max_context, 3000) << s.model;
  }
  // Two sequences (4 cluster splits each, L2 plans of 4-warp blocks): Llama-3.2-1B 32 pages (its
  // merge alone: 20), Llama-3-8B 40, Qwen2.5-7B 64 (its merge alone would allow 147).
  for (const Shape s : {Shape{"Llama-3.2-1B", 32, 8, 64, 16, 2048}, Shape{"Llama-3-8B", 32, 8, 128, 16, 2560},
                        Shape{"Qwen2.5-7B", 28, 4, 128, 33, 4096}}) {
    const auto l2 = plan_decode_attention(2, s.q_heads, s.kv_heads, s.head_dim, 32768, 132);
    ASSERT_EQ(l2.splits_per_sequence, s.l2_splits) << s.model << ", two sequences";
    const auto plan = plan_short_context_decode_attention(l2, 132, h200);
    ASSERT_TRUE(plan.has_value()) << s.model << ", two sequences";
    EXPECT_EQ(plan->max_context, s.keys) << s.model << ", two sequences";
    EXPECT_EQ(plan->splits_per_sequence, 4) << s.model << ", two sequences";
  }
  // Four sequences of Qwen2.5-7B: 2 splits each, the 64-page cap (its merge: 71); three: 24 cluster
  // blocks, under a fifth of the SMs, keep 16 pages.
  const auto four = plan_short_context_decode_attention(plan_decode_attention(4, 28, 4, 128, 32768, 132), 132, h200);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->max_context, 2048);
  const auto three = plan_short_context_decode_attention(plan_decode_attention(3, 28, 4, 128, 32768, 132), 132, h200);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->max_context, 512);
  // Clusters on fewer than a fifth of the SMs (8 x 2 kv heads = 16 of 132) keep 16 pages per
  // split, however large the merge: a long cache would stream through too few SMs.
  const auto few = plan_decode_attention(1, 16, 2, 128, 32768, 132);
  ASSERT_GT(few.splits_per_sequence, 32);
  const auto plan = plan_short_context_decode_attention(few, 132, h200);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->max_context, 2048);
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

}  // namespace
}  // namespace deepfuse
