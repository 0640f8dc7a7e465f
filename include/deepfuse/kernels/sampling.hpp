// GPU sampling from fp32 logits, one id per sequence, without copying logits to the host:
// greedy, temperature, top-k, top-p, min-p with per-sequence parameters and seeds. Several blocks
// per sequence so batch 1 over a 128k-152k vocabulary is fast. Draws match the CPU reference
// (reference::sample): the same processors in the same order, inverse CDF at
// reference::sampling_uniform(seed, step).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "deepfuse/sampling_params.hpp"
#include "deepfuse/token_bitmask.hpp"

namespace deepfuse::kernels {

// Per-sequence parameters, in device memory so graph replays pick up changes.
struct SamplingSlot {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t step = 0;         // draw index; the kernel increments it after each draw
};

// The slot of a sequence sampled as reference::sample does with `params`, from draw 0 (the GPU
// applies no repetition penalty).
inline SamplingSlot sampling_slot(const deepfuse::SamplingParams& params) {
  SamplingSlot slot;
  slot.temperature = params.temperature;
  slot.top_k = params.top_k;
  slot.top_p = params.top_p;
  slot.min_p = params.min_p;
  slot.seed = params.seed;
  return slot;
}

struct SamplingParams {
  const float* logits = nullptr;   // [batch, vocab]
  SamplingSlot* slots = nullptr;   // [batch]
  int32_t* ids = nullptr;          // [batch] sampled ids
  int32_t* host_ids = nullptr;     // [batch] or null: the ids also written here (mapped pinned host memory)
  // Decode steps: the ids the step fed ([batch]; may be `ids` itself, read before it is written).
  // A row fed a negative id sat the step out: its draw index (slot step) stays, so a sequence's
  // draws count its own tokens only, as reference::sample's step does. Null: every row advances.
  const int32_t* fed_ids = nullptr;
  // Constrained decoding: [batch, token_bitmask_words(vocab)] allowed-token bitmasks
  // (deepfuse/token_bitmask.hpp), one row per sequence; a left-out id is sampled as if its logit
  // were -inf (reference::apply_token_bitmask). A row of all ones leaves its sequence free. Null:
  // no mask for any row.
  const uint32_t* token_bitmask = nullptr;
  void* workspace = nullptr;       // sampling_workspace_bytes(batch, vocab); no zeroing needed
  int batch = 0;
  int vocab = 0;
};

// 0 today: the blocks of a sequence share their partial results through distributed shared
// memory. Callers still allocate what it returns, so a later version may need some.
size_t sampling_workspace_bytes(int batch, int vocab);

// One launch, grid batch x C blocks in clusters of C (16, 8 or 4 on Hopper, 1 before it); the ids
// and the slots' steps are written by the kernel. cudaErrorInvalidValue on null pointers, batch
// < 1 or vocab outside [1, 2^30]. Inverse-CDF order: ascending token id, as reference::sample.
cudaError_t launch_sampling(const SamplingParams& params, cudaStream_t stream);

// Tests and benchmarks: the same kernel with a given cluster size (1, 4, 8 or 16);
// cudaErrorNotSupported when the device cannot run it.
cudaError_t launch_sampling_with_cluster_size(const SamplingParams& params, int cluster_size, cudaStream_t stream);

}  // namespace deepfuse::kernels
