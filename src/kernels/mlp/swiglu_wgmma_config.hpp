// The Hopper MLP pair's limits, tiles and shared-memory layout (swiglu_wgmma.cu; the design is in
// docs/kernels/swiglu_fused.md, "The Hopper pair"). constexpr only: host code and the CPU tests
// include it too.
#pragma once

#include <algorithm>
#include <cstddef>

namespace deepfuse::kernels::wgmma_mlp {

constexpr int kRows = 64;           // weight rows per tile: wgmma's M
constexpr int kStageColumns = 64;   // K per stage: one 128-byte swizzled row per weight row and token
constexpr int kKStep = 16;          // K per wgmma instruction (bf16)
constexpr int kConsumerGroups = 2;  // consumer warpgroups; each takes half the token tile
constexpr int kHelperWarps = 3;     // warps 1-3 of the producer warpgroup: phase 1's RMSNorm sums
constexpr int kThreads = 128 * (1 + kConsumerGroups);
constexpr int kMaxTokens = 256;     // = kSwigluWgmmaMaxTokens
constexpr int kHiddenMultiple = kRows;         // phase 2's row tiles and phase 1's stages
constexpr int kIntermediateMultiple = kRows;   // phase 1's row tiles and phase 2's stages
constexpr int kMaxStages = 8;
constexpr int kMinChunksPerSplit = 4;          // phase 2: split K no finer than 4 stages of 64 columns
constexpr double kDownBusyTarget = 0.9;        // phase 2: the share of SM slots its waves keep busy
constexpr size_t kTileBytes = static_cast<size_t>(kRows) * kStageColumns * 2;  // 8 KB of weights
constexpr size_t kTokenRowBytes = kStageColumns * 2;                            // 128 bytes per token
constexpr size_t kAlignment = 1024;             // 128-byte swizzle atoms: tiles start on 1024 bytes
constexpr size_t kSharedReservedPerBlock = 1024;  // the runtime's own shared memory per block

// Token tiles: the wgmma N of the whole block (each consumer warpgroup takes half: n = 8..128).
constexpr int token_tile(int tokens) {
  return tokens <= 16 ? 16 : tokens <= 32 ? 32 : tokens <= 64 ? 64 : tokens <= 128 ? 128 : 256;
}
// Up to 64 tokens two blocks share an SM (accumulators are small: at most 64 floats a consumer
// thread), so phase 1's 224 blocks of Llama-3-8B are all resident at once; from 128 tokens one
// block holds the SM with a deeper ring.
constexpr int blocks_per_sm(int tile) { return tile <= 64 ? 2 : 1; }
constexpr size_t ring_budget(int tile) { return blocks_per_sm(tile) == 2 ? 104 * 1024 : 200 * 1024; }

// Phase 1 stage: gate tile, up tile, the tokens' x columns. Phase 2 stage: Wd tile, act columns.
constexpr size_t gate_up_stage_bytes(int tile) { return 2 * kTileBytes + tile * kTokenRowBytes; }
constexpr size_t down_stage_bytes(int tile) { return kTileBytes + tile * kTokenRowBytes; }
constexpr int stages_for(size_t stage_bytes, int tile) {
  return static_cast<int>(std::min<size_t>(kMaxStages, ring_budget(tile) / stage_bytes));
}
constexpr int gate_up_stages(int tile) { return stages_for(gate_up_stage_bytes(tile), tile); }
constexpr int down_stages(int tile) { return stages_for(down_stage_bytes(tile), tile); }

// After the ring: kMaxStages full and kMaxStages empty barriers (8 bytes each), kMaxTokens floats
// (phase 1: 1/rms per token), one flag word (phase 2: "this block finishes its row tile"); rounded
// up to 1024. Before it, 1024 bytes of slack to align the ring's base.
constexpr size_t kExtrasBytes =
    (2 * kMaxStages * 8 + kMaxTokens * sizeof(float) + 16 + kAlignment - 1) / kAlignment * kAlignment;
constexpr size_t shared_bytes(size_t stage_bytes, int stages) {
  return kAlignment + static_cast<size_t>(stages) * stage_bytes + kExtrasBytes;
}
constexpr size_t gate_up_shared_bytes(int tile) {
  return shared_bytes(gate_up_stage_bytes(tile), gate_up_stages(tile));
}
constexpr size_t down_shared_bytes(int tile) { return shared_bytes(down_stage_bytes(tile), down_stages(tile)); }

constexpr bool fits_sm90(int tile) {
  const size_t most = std::max(gate_up_shared_bytes(tile), down_shared_bytes(tile)) + kSharedReservedPerBlock;
  return gate_up_stages(tile) >= 2 && down_stages(tile) >= 2 && gate_up_stage_bytes(tile) % kAlignment == 0 &&
         down_stage_bytes(tile) % kAlignment == 0 && most <= 227 * 1024 &&
         most * blocks_per_sm(tile) <= 228 * 1024;
}
static_assert(fits_sm90(16) && fits_sm90(32) && fits_sm90(64) && fits_sm90(128) && fits_sm90(256),
              "every token tile's blocks fit an sm_90 SM");
static_assert(kThreads == 384 && kConsumerGroups * 4 + kHelperWarps + 1 == kThreads / 32, "warp roles");

}  // namespace deepfuse::kernels::wgmma_mlp
