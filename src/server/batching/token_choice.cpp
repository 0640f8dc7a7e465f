#include "server/batching/token_choice.hpp"

#include "deepfuse/logprobs.hpp"
#include "deepfuse/reference.hpp"

namespace deepfuse::server {

TokenChoice choose_token(std::span<float> logits, const GenerationSpec& spec, std::span<const int32_t> all_tokens,
                         std::span<const int32_t> generated, uint64_t step, std::span<const uint32_t> allowed) {
  if (!allowed.empty()) reference::apply_token_bitmask(logits, allowed);
  reference::apply_presence_frequency_penalties(logits, spec.presence_penalty, spec.frequency_penalty, generated);
  TokenChoice choice;
  choice.id = reference::sample(logits, spec.sampling, all_tokens, step);
  if (spec.top_logprobs < 0) return choice;
  // Of the penalized logits, as OpenAI reports them (the CUDA engine reports the same).
  TokenLogprobs logprobs = token_logprobs(logits, choice.id, spec.top_logprobs);
  choice.logprob = logprobs.logprob;
  choice.top = std::move(logprobs.top);
  return choice;
}

}  // namespace deepfuse::server
