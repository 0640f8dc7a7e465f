// Speculative decoding's acceptance on the device (issue 54): after a verify step has chosen a
// token for each of a sequence's 1 + k rows (the sampler, greedy or with each row's own draw
// index), keeps the drafts while they equal the chosen tokens and the first chosen token that
// differs (or the one after the last draft), exactly speculative::accept_drafts
// (src/speculative/verify.hpp). Writes the emitted tokens, their count, and the last one where the
// next step's embedding reads its input. One thread per sequence; nothing synchronises with the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

// The most rows a sequence verifies at once (its token and up to 15 drafts).
inline constexpr int kSpeculativeMaxRows = 16;

struct SpeculativeAcceptParams {
  const int32_t* chosen = nullptr;        // [sequences, rows]: each verify row's token
  const int32_t* drafts = nullptr;        // [sequences, rows - 1]: what each sequence fed after its token
                                          // (may be null when rows == 1)
  const int32_t* draft_counts = nullptr;  // [sequences]: drafts fed, 0 .. rows - 1 (rows past 1 + count: padding)
  int sequences = 0;
  int rows = 0;                           // per sequence: 1 + the most drafts, at most kSpeculativeMaxRows
  int32_t* emitted = nullptr;             // [sequences, rows]: accepted drafts, then one more; -1 after
  int32_t* emitted_counts = nullptr;      // [sequences]: 1 + drafts accepted
  int32_t* next_ids = nullptr;            // [sequences] or null: the last emitted token (the next input)
};

// cudaErrorInvalidValue on null chosen, drafts (rows > 1), draft_counts, emitted or emitted_counts, sequences
// outside [1, 65535] or rows outside [1, kSpeculativeMaxRows]. A draft count outside [0, rows - 1]
// is clamped on the device.
cudaError_t launch_speculative_accept(const SpeculativeAcceptParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
