#include "deepfuse/logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "deepfuse/error.hpp"

namespace deepfuse {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t chosen, int top) {
  DF_CHECK(!logits.empty(), "logprobs of empty logits");
  DF_CHECK(chosen >= 0 && static_cast<size_t>(chosen) < logits.size(),
           "logprobs: token id " + std::to_string(chosen) + " is outside the vocabulary of " +
               std::to_string(logits.size()));
  const float best = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - best);
  const double log_sum = best + std::log(sum);
  auto logprob = [&](int32_t id) { return static_cast<float>(logits[id] - log_sum); };
  TokenLogprobs out;
  out.logprob = logprob(chosen);
  const int k = std::min<int>(std::max(top, 0), static_cast<int>(logits.size()));
  if (k == 0) return out;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (int i = 0; i < k; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

}  // namespace deepfuse
