// The Hopper MLP pair's host side: limits, scratch sizes, the tiling of a call and the weights'
// tensor maps (swiglu_wgmma.hpp). No device code: the CPU tests run all of it but the encoder.
#include <algorithm>

#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "kernels/mlp/swiglu_wgmma_config.hpp"

namespace deepfuse::kernels {

using namespace wgmma_mlp;

namespace {
bool valid_shape(int hidden, int intermediate) {
  return hidden > 0 && intermediate > 0 && hidden % kHiddenMultiple == 0 && intermediate % kIntermediateMultiple == 0;
}

// Phase 2's K split: row_tiles x splits blocks run in ceil(blocks / slots) waves, so the SMs are
// busy blocks / (waves x slots) of the time. The fewest splits that keep them >= 90% busy (fewer
// splits: fewer partial sums), else the best; each split at least kMinChunksPerSplit stages.
int down_splits(int row_tiles, int chunks, int slots) {
  const int most = std::max(1, chunks / kMinChunksPerSplit);
  int best = 1;
  double best_busy = 0.0;
  for (int splits = 1; splits <= most; ++splits) {
    const int blocks = row_tiles * splits, waves = (blocks + slots - 1) / slots;
    const double busy = static_cast<double>(blocks) / (static_cast<double>(waves) * slots);
    if (busy >= kDownBusyTarget) return splits;
    if (busy > best_busy) best = splits, best_busy = busy;
  }
  return best;
}
}  // namespace

std::string swiglu_wgmma_unsupported(int hidden, int intermediate, int tokens, const SwigluWgmmaDevice& device,
                                     WeightFormat format) {
  static_assert(kSwigluWgmmaMaxTokens == kMaxTokens, "one token limit");
  if (format != WeightFormat::bf16)
    return std::string("the Hopper MLP pair reads bf16 weights, not ") + weight_format_name(format);
  if (!valid_shape(hidden, intermediate))
    return "the Hopper MLP pair needs hidden and intermediate sizes that are multiples of " +
           std::to_string(kHiddenMultiple);
  if (tokens < 1 || tokens > kMaxTokens)
    return "the Hopper MLP pair takes 1 to " + std::to_string(kMaxTokens) + " tokens, not " + std::to_string(tokens);
  if (device.major != 0 && device.major != 9)
    return "the Hopper MLP pair needs sm_90 (wgmma and TMA), not sm_" + std::to_string(device.major) + "x";
  return "";
}

size_t swiglu_wgmma_activation_elements(int intermediate, int max_tokens) {
  return static_cast<size_t>(intermediate) * std::clamp(max_tokens, 0, kMaxTokens);
}
size_t swiglu_wgmma_accumulator_floats(int hidden, int max_tokens) {
  return static_cast<size_t>(hidden) * std::clamp(max_tokens, 0, kMaxTokens);
}
size_t swiglu_wgmma_counter_words(int hidden) { return static_cast<size_t>(std::max(hidden, 0) / kRows); }

SwigluWgmmaPlan plan_swiglu_wgmma(int hidden, int intermediate, int tokens, int sms) {
  SwigluWgmmaPlan plan;
  const int tile = token_tile(tokens);
  plan.token_tile = tile;
  plan.gate_up_stages = gate_up_stages(tile);
  plan.gate_up_blocks = intermediate / kRows;
  plan.gate_up_shared_bytes = gate_up_shared_bytes(tile);
  plan.down_stages = down_stages(tile);
  plan.down_shared_bytes = down_shared_bytes(tile);
  // Phase 2: (H / 64 row tiles) x splits blocks.
  const int row_tiles = std::max(hidden / kRows, 1), chunks = intermediate / kStageColumns;
  plan.down_splits = down_splits(row_tiles, chunks, std::max(sms, 1) * blocks_per_sm(tile));
  plan.down_blocks = row_tiles * plan.down_splits;
  return plan;
}

cudaError_t make_swiglu_wgmma_weights(const __nv_bfloat16* gate_up, const __nv_bfloat16* down, int hidden,
                                      int intermediate, SwigluWgmmaWeights& out) {
  if (!valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  if (cudaError_t e = encode_tile_map(gate_up, bf16_tile_map(2 * static_cast<uint64_t>(intermediate), hidden, kRows),
                                      out.gate_up);
      e != cudaSuccess)
    return e;
  return encode_tile_map(down, bf16_tile_map(hidden, intermediate, kRows), out.down);
}

}  // namespace deepfuse::kernels
