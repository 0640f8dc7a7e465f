#include "server/batching/token_choice.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "deepfuse/reference.hpp"

namespace deepfuse::server {

TokenChoice choose_token(std::span<float> logits, const GenerationSpec& spec, std::span<const int32_t> all_tokens,
                         std::span<const int32_t> generated, uint64_t step) {
  if (spec.presence_penalty != 0.0f || spec.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (const int32_t id : generated) ++counts[id];
    for (const auto& [id, count] : counts)
      logits[id] -= spec.presence_penalty + spec.frequency_penalty * static_cast<float>(count);
  }
  TokenChoice choice;
  choice.id = reference::sample(logits, spec.sampling, all_tokens, step);
  if (spec.top_logprobs < 0) return choice;
  // log_softmax of the (penalized) logits, as OpenAI reports them: before temperature and top-p.
  const float best = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - best);
  const double log_sum = best + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_sum); };
  choice.logprob = logprob(choice.id);
  const int k = std::min<int>(spec.top_logprobs, static_cast<int>(logits.size()));
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < k; ++i) choice.top.push_back({ids[i], logprob(ids[i])});
  return choice;
}

}  // namespace deepfuse::server
