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
// likely ids (none when top <= 0; at most the vocabulary; never an id whose logit is -inf, which a
// token bitmask left out). Empty logits or `chosen` outside
// them throw deepfuse::Error.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top);

// How closely `candidate` logits follow `reference` ones ([positions, vocab] each, the same
// prompt): at how many positions their argmax agrees (lowest id on ties), and the mean over
// positions of KL(softmax(reference) || softmax(candidate)) in nats. Used to report what a
// quantization costs (score --compare-unquantized). Throws deepfuse::Error on mismatched sizes.
struct NextTokenAgreement {
  size_t positions = 0;
  size_t top1_agree = 0;
  double mean_kl = 0.0;
};
NextTokenAgreement compare_next_token(std::span<const float> reference, std::span<const float> candidate, size_t vocab);

}  // namespace deepfuse
