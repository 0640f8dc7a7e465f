// The batched fused MLP's limits, tile shapes and shared-memory layout (included by
// swiglu_batched.cu; the design essay opens that file). Host code may include it too: it is
// constexpr only.
#pragma once

#include <cstddef>

namespace deepfuse::kernels::batched {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 4;         // phase-1 ring stages: three in flight while one is consumed
constexpr int kStepsPerStage = 4;  // 16-wide k-steps per stage: 64 columns of H (phase 1) or I (phase 2)
constexpr int kStageColumns = 16 * kStepsPerStage;
constexpr int kGroupTiles = 8;     // phase 1: 16-row I tiles (gate and up) a block streams at once
constexpr int kRowTiles = 8;       // phase 2: 16-row H tiles per work unit, one per warp
constexpr int kMaxPassTokens = 128;  // tokens per pass; more tokens stream the weights once per pass
constexpr int kMaxTokens = 256;      // = kSwigluBatchedMaxTokens
constexpr int kHiddenMultiple = 16 * kRowTiles;       // phase 2 takes whole units of 8 row tiles
constexpr int kIntermediateMultiple = kStageColumns;  // phase 2's stages take 64 columns of I
constexpr int kSharedReservedPerBlock = 1024;         // the runtime's own shared memory per block

// One pass holds 8 * NT tokens (NT = 2, 4, 8, 16 n-tiles of 8 tokens).
template <int NT>
struct Tiles {
  static_assert(NT == 2 || NT == 4 || NT == 8 || NT == 16, "passes of 16, 32, 64 or 128 tokens");
  static constexpr int kPassTokens = 8 * NT;
  // Phase 1: warps as kWarpRows groups of I tiles x kWarpCols groups of tokens; each warp holds
  // kTilesPerWarp tiles x kNTilesPerWarp n-tiles of gate and up sums (at most 128 floats a thread).
  static constexpr int kWarpCols = NT == 16 ? 2 : 1;
  static constexpr int kWarpRows = kWarps / kWarpCols;
  static constexpr int kNTilesPerWarp = NT / kWarpCols;
  static constexpr int kTilesPerWarp = kGroupTiles / kWarpRows;
  // The ring's stage: weights (phase 1: kGroupTiles x kStepsPerStage x gate|up fragments of 512
  // bytes; phase 2 uses half) and one 128-byte row of x or of the activations per token.
  static constexpr size_t kWeightBytes = static_cast<size_t>(kGroupTiles) * kStepsPerStage * 2 * 512;
  static constexpr size_t kRowBytes = kStageColumns * 2;
  static constexpr size_t kStageBytes = kWeightBytes + kPassTokens * kRowBytes;
  static constexpr size_t kRingBytes = kStages * kStageBytes;
  // Phase 2's stages hold half the weights of phase 1's, so the same ring bytes hold more of them
  // (6 or 7): 80-96 KB of weights in flight instead of 48.
  static constexpr size_t kWeightBytes2 = static_cast<size_t>(kRowTiles) * kStepsPerStage * 512;
  static constexpr size_t kStageBytes2 = kWeightBytes2 + kPassTokens * kRowBytes;
  static constexpr int kStages2 = static_cast<int>(kRingBytes / kStageBytes2);
  static constexpr size_t kSharedBytes = kRingBytes + kPassTokens * sizeof(float);
};

static_assert(Tiles<16>::kSharedBytes <= 227 * 1024 - kSharedReservedPerBlock, "the largest pass fits an sm_90 SM");
static_assert(Tiles<2>::kStages2 >= kStages && Tiles<16>::kStages2 >= kStages, "phase 2's ring is no shallower");

}  // namespace deepfuse::kernels::batched
