// OpenAI's presence and frequency penalties on fp32 logits, in place, before the sampler: for every
// id a sequence generated `count` > 0 times, logit -= presence + frequency * count (fp32, rounded
// after each operation, exactly as reference::apply_presence_frequency_penalties computes it).
// The counts live on the device, one dense row per sequence, so a decode step launched ahead of
// the host keeps them current itself: each launch first adds the id its row was fed (the token
// the row generated last) to the row's counts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

// Per-sequence penalties, in device memory so graph replays pick up changes. Both 0: the row is
// left alone (its counts are neither read nor written).
struct PenaltySlot {
  float presence = 0.0f;
  float frequency = 0.0f;
};

inline bool penalized(const PenaltySlot& slot) { return slot.presence != 0.0f || slot.frequency != 0.0f; }

struct TokenPenaltyParams {
  float* logits = nullptr;             // [batch, vocab]: penalized in place
  int32_t* counts = nullptr;           // [batch, vocab]: times each id was generated, fed ids added
  const PenaltySlot* slots = nullptr;  // [batch]
  const int32_t* fed_ids = nullptr;    // [batch] or null: the id each row was fed (< 0: none) counts first
  int batch = 0;
  int vocab = 0;
};

// One launch, (vocab / 4096) x batch blocks; rows without penalties return at once.
// cudaErrorInvalidValue on null logits, counts or slots, batch outside [1, 65535] or vocab
// outside [1, 2^30].
cudaError_t launch_token_penalties(const TokenPenaltyParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
