// Picking a sequence's next token from its logits: OpenAI's presence and frequency penalties over
// the tokens generated so far, then the shared sampler (reference::sample, the same draws as the
// GPU sampler), and the log-probabilities OpenAI's `logprobs` report. Used by the CPU backend; the
// CUDA engine applies the same penalties on the GPU (kernels/token_penalties.hpp) and reports the
// same logprobs (deepfuse/logprobs.hpp).
#pragma once

#include <span>
#include <vector>

#include "server/batching/serving_backend.hpp"

namespace deepfuse::server {

struct TokenChoice {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // spec.top_logprobs of them, most likely first
};

// `logits` is modified (the mask, penalties). `generated` are the sequence's generated tokens;
// `step` is how many it has generated before this one. `allowed`: the spec's constraint's bitmask
// for this token (empty: no constraint), applied first, so no processor picks a left-out id.
TokenChoice choose_token(std::span<float> logits, const GenerationSpec& spec, std::span<const int32_t> all_tokens,
                         std::span<const int32_t> generated, uint64_t step, std::span<const uint32_t> allowed = {});

}  // namespace deepfuse::server
