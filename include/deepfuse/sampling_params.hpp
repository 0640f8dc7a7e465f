// Sampling parameters of one sequence, shared by the engine, the GPU sampler and the CPU reference.
#pragma once

#include <cstdint>

namespace deepfuse {

// How one sequence samples its next token. temperature <= 0 means greedy (argmax, lowest id on
// ties). The CPU reference (reference::sample) and the GPU sampler read the same fields.
struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; applied to logits of ids in `previous` (HF rule)
  uint64_t seed = 0;
};

}  // namespace deepfuse
