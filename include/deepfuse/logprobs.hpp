// The log-probabilities OpenAI's `logprobs` / `top_logprobs` report for a sampled token, from the
// logits it was sampled from. Both backends of `deepfuse serve` call this: the CPU backend on the
// reference decoder's logits, the CUDA engine on the logits its decode step leaves on the device.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepfuse {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  float logprob = 0.0f;            // the chosen token's
  std::vector<TokenLogprob> top;   // the most likely ids, most likely first (lowest id first on ties)
};

// log_softmax of `logits` (in double; after presence and frequency penalties, before
// temperature, top-k, top-p and min-p, as OpenAI reports them) at `chosen`, and the `top` most
// likely ids (none when top <= 0; at most the vocabulary). Empty logits or `chosen` outside
// them throw deepfuse::Error.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top);

}  // namespace deepfuse
