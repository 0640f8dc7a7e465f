// The Hopper MLP pair's host side (kernels/swiglu_wgmma.hpp): its limits, how a call is tiled, the
// TMA maps' parameters and the accumulator layout its epilogues index by. CPU only: none of this
// touches a device (the kernels themselves: test_mlp_batched_gpu, --gtest_filter='*fused_wgmma*').
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "deepfuse/kernels/tensor_map.hpp"
#include "kernels/common/wgmma_layout.hpp"
#include "kernels/mlp/swiglu_wgmma_config.hpp"

namespace deepfuse::kernels {
namespace {

constexpr SwigluWgmmaDevice kH200{9, 132};

TEST(SwigluWgmma, LimitsAreTheHeaders) {
  for (const auto& [h, i] : {std::pair{4096, 14336}, std::pair{3584, 18944}, std::pair{5120, 13824},
                             std::pair{128, 64}, std::pair{192, 320}, std::pair{2048, 8192}})
    for (int tokens : {1, 7, 16, 17, 64, 255, 256}) EXPECT_EQ(swiglu_wgmma_unsupported(h, i, tokens, kH200), "");
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336, 0, kH200).find("1 to 256"), std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336, 257, kH200).find("1 to 256"), std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096 + 32, 14336, 16, kH200).find("multiples of 64"), std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336 + 32, 16, kH200).find("multiples of 64"), std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336, 16, kH200, WeightFormat::fp8_e4m3).find("fp8_e4m3"),
            std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336, 16, {8, 108}).find("sm_90"), std::string::npos);
  EXPECT_NE(swiglu_wgmma_unsupported(4096, 14336, 16, {10, 148}).find("sm_90"), std::string::npos);
  EXPECT_EQ(swiglu_wgmma_unsupported(4096, 14336, 16, {}), "") << "an unknown GPU: the shape alone";
}

// Refused launches return before asking for a device.
TEST(SwigluWgmma, LauncherRefusesWhatItsHeaderRefuses) {
  const SwigluWgmmaWeights weights;
  auto* fake_bf16 = reinterpret_cast<__nv_bfloat16*>(uintptr_t{256});
  SwigluWgmmaParams good;
  good.x = fake_bf16, good.weights = &weights, good.y = fake_bf16, good.activations = fake_bf16;
  good.accumulator = reinterpret_cast<float*>(uintptr_t{256});
  good.tile_counters = reinterpret_cast<unsigned*>(uintptr_t{256});
  good.tokens = 16, good.hidden = 4096, good.intermediate = 14336;
  std::vector<SwigluWgmmaParams> bad(9, good);
  bad[0].tokens = 0, bad[1].tokens = 257, bad[2].hidden = 4100, bad[3].intermediate = 100;
  bad[4].x = nullptr, bad[5].weights = nullptr, bad[6].activations = nullptr, bad[7].accumulator = nullptr;
  bad[8].tile_counters = nullptr;
  for (size_t k = 0; k < bad.size(); ++k) EXPECT_EQ(launch_swiglu_wgmma(bad[k], nullptr), cudaErrorInvalidValue) << k;
}

// Every M in 1..256 gets the smallest tile of 16, 32, 64, 128, 256 that holds it; each consumer
// warpgroup's half is a valid wgmma N (a multiple of 8 up to 256).
TEST(SwigluWgmma, TokenTiles) {
  const std::set<int> tiles{16, 32, 64, 128, 256};
  for (int m = 1; m <= kSwigluWgmmaMaxTokens; ++m) {
    const int tile = plan_swiglu_wgmma(4096, 14336, m, 132).token_tile;
    ASSERT_TRUE(tiles.count(tile)) << m;
    EXPECT_GE(tile, m);
    EXPECT_TRUE(tile == 16 || tile / 2 < m) << "M=" << m << " in a tile of " << tile;
    const int n = tile / wgmma_mlp::kConsumerGroups;
    EXPECT_TRUE(n % 8 == 0 && n >= 8 && n <= 256) << tile;
  }
}

// Rings at least double-buffered, within an SM's shared memory at the blocks per SM each tile
// plans for (sm_90: 227 KB a block, 228 KB an SM, 1 KB reserved per block).
TEST(SwigluWgmma, SharedMemoryFitsAnH200) {
  for (int tile : {16, 32, 64, 128, 256}) {
    const SwigluWgmmaPlan plan = plan_swiglu_wgmma(4096, 14336, tile, 132);
    EXPECT_GE(plan.gate_up_stages, 2) << tile;
    EXPECT_GE(plan.down_stages, 2) << tile;
    EXPECT_LE(plan.gate_up_stages, wgmma_mlp::kMaxStages) << tile;
    EXPECT_LE(plan.down_stages, wgmma_mlp::kMaxStages) << tile;
    const size_t most = std::max(plan.gate_up_shared_bytes, plan.down_shared_bytes) + 1024;
    EXPECT_LE(most, 227u * 1024) << tile;
    EXPECT_LE(most * wgmma_mlp::blocks_per_sm(tile), 228u * 1024) << tile;
    // The ring, 1024 bytes of alignment slack and the barriers / per-token floats.
    EXPECT_GE(plan.gate_up_shared_bytes,
              plan.gate_up_stages * wgmma_mlp::gate_up_stage_bytes(tile) + 1024 + 2 * 8 * 8 + 256 * 4 + 4);
  }
}

// The share of an H200's SM slots phase 2's waves keep busy.
double busy(const SwigluWgmmaPlan& plan, int sms) {
  const int slots = sms * wgmma_mlp::blocks_per_sm(plan.token_tile);
  const int waves = (plan.down_blocks + slots - 1) / slots;
  return static_cast<double>(plan.down_blocks) / (waves * slots);
}

// Phase 1: one block per 64 rows of I. Phase 2: row tiles x splits, the fewest splits whose waves
// keep >= 90% of the SM slots busy, each split of I at least kMinChunksPerSplit stages, every
// chunk in exactly one split.
TEST(SwigluWgmma, GridsAndSplits) {
  const SwigluWgmmaPlan small = plan_swiglu_wgmma(4096, 14336, 16, 132);
  EXPECT_EQ(small.gate_up_blocks, 224);
  EXPECT_EQ(small.down_splits, 4);  // 64 row tiles, 264 slots at two blocks per SM: 256 blocks
  EXPECT_EQ(small.down_blocks, 256);
  const SwigluWgmmaPlan large = plan_swiglu_wgmma(4096, 14336, 200, 132);
  EXPECT_EQ(large.token_tile, 256);
  EXPECT_EQ(large.down_splits, 2);  // 132 slots at one block per SM: 128 blocks
  // 80 row tiles on 132 slots: 1 or 2 splits keep 61% busy, 3 (240 blocks, two waves) 91%.
  EXPECT_EQ(plan_swiglu_wgmma(5120, 13824, 128, 132).down_splits, 3);
  // 56 row tiles: 7 splits, 392 blocks in three waves of 132 (99%).
  EXPECT_EQ(plan_swiglu_wgmma(3584, 18944, 256, 132).down_splits, 7);
  EXPECT_EQ(plan_swiglu_wgmma(128, 64, 5, 132).down_splits, 1) << "one stage of I: no split";
  for (const auto& [h, i] : {std::pair{4096, 14336}, std::pair{3584, 18944}, std::pair{5120, 13824}})
    for (int tokens : {16, 64, 128, 256}) EXPECT_GE(busy(plan_swiglu_wgmma(h, i, tokens, 132), 132), 0.9) << h;
  for (const auto& [h, i] : {std::pair{4096, 14336}, std::pair{3584, 18944}, std::pair{5120, 13824},
                             std::pair{128, 64}, std::pair{192, 320}, std::pair{8192, 28672}})
    for (int tokens : {1, 40, 100, 256})
      for (int sms : {1, 78, 132}) {
        const SwigluWgmmaPlan plan = plan_swiglu_wgmma(h, i, tokens, sms);
        const int row_tiles = h / 64, chunks = i / 64;
        EXPECT_EQ(plan.gate_up_blocks, i / 64);
        EXPECT_EQ(plan.down_blocks, row_tiles * plan.down_splits);
        ASSERT_GE(plan.down_splits, 1);
        if (plan.down_splits > 1) EXPECT_GE(chunks / plan.down_splits, wgmma_mlp::kMinChunksPerSplit) << h << "x" << i;
        // The down phase's split s covers chunks [chunks * s / splits, chunks * (s + 1) / splits).
        int covered = 0;
        for (int s = 0; s < plan.down_splits; ++s) {
          const int first = chunks * s / plan.down_splits, end = chunks * (s + 1) / plan.down_splits;
          EXPECT_EQ(first, covered);
          EXPECT_GE(end - first, 1);
          covered = end;
        }
        EXPECT_EQ(covered, chunks);
      }
}

TEST(SwigluWgmma, ScratchSizes) {
  EXPECT_EQ(swiglu_wgmma_activation_elements(14336, 64), size_t{14336} * 64);
  EXPECT_EQ(swiglu_wgmma_activation_elements(14336, 1000), size_t{14336} * 256) << "at most 256 tokens a call";
  EXPECT_EQ(swiglu_wgmma_accumulator_floats(4096, 300), size_t{4096} * 256);
  EXPECT_EQ(swiglu_wgmma_counter_words(4096), 64u);
}

TEST(TensorMap, Bf16TileMapParameters) {
  const TileMap2d x = bf16_tile_map(17, 4096, 17);
  EXPECT_EQ(x.columns, 4096u);
  EXPECT_EQ(x.rows, 17u) << "the call's tokens, not the tile's";
  EXPECT_EQ(x.row_stride_bytes, 8192u);
  EXPECT_EQ(x.box_columns, 64u);
  EXPECT_EQ(x.box_rows, 17u);
  const void* aligned = reinterpret_cast<const void*>(uintptr_t{4096});
  EXPECT_EQ(tile_map_unsupported(aligned, x), "");
  EXPECT_EQ(tile_map_unsupported(aligned, bf16_tile_map(2 * 14336, 4096, 64)), "");
  EXPECT_NE(tile_map_unsupported(reinterpret_cast<const void*>(uintptr_t{4104}), x).find("16-byte"), std::string::npos);
  EXPECT_NE(tile_map_unsupported(nullptr, x), "");
  EXPECT_NE(tile_map_unsupported(aligned, bf16_tile_map(8, 100, 16)).find("row stride"), std::string::npos);
  EXPECT_NE(tile_map_unsupported(aligned, bf16_tile_map(8, 4096, 0)).find("box"), std::string::npos);
  EXPECT_NE(tile_map_unsupported(aligned, bf16_tile_map(8, 4096, 257)).find("box"), std::string::npos);
  EXPECT_NE(tile_map_unsupported(aligned, bf16_tile_map(0, 4096, 16)).find("extents"), std::string::npos);
  TensorMapBytes out;
  EXPECT_EQ(encode_tile_map(aligned, bf16_tile_map(8, 100, 16), out), cudaErrorInvalidValue);
}

// The epilogues' index of each accumulator element: over a warpgroup's 128 threads the N / 2
// elements of each cover the 64 x N tile exactly once (N = 8..128, every consumer tile).
TEST(WgmmaLayout, AccumulatorsCoverTheTileOnce) {
  for (int n : {8, 16, 32, 64, 128}) {
    std::vector<int> hits(64 * n, 0);
    for (int thread = 0; thread < 128; ++thread)
      for (int i = 0; i < n / 2; ++i) {
        const int row = hopper::accumulator_row(thread / 32, thread % 32, i);
        const int column = hopper::accumulator_column(thread % 32, i);
        ASSERT_TRUE(row >= 0 && row < 64 && column >= 0 && column < n) << n;
        ++hits[row * n + column];
      }
    for (int cell = 0; cell < 64 * n; ++cell) EXPECT_EQ(hits[cell], 1) << "n " << n << " cell " << cell;
  }
  // mma.m16n8's C layout in warp 0's band: lane 5 holds (1, 2), (1, 3), (9, 2), (9, 3) first.
  EXPECT_EQ(hopper::accumulator_row(0, 5, 0), 1);
  EXPECT_EQ(hopper::accumulator_column(5, 1), 3);
  EXPECT_EQ(hopper::accumulator_row(0, 5, 2), 9);
  EXPECT_EQ(hopper::accumulator_row(2, 0, 0), 32);
  EXPECT_EQ(hopper::accumulator_column(0, 4), 8);
}

}  // namespace
}  // namespace deepfuse::kernels
