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
  // A token left out by a constraint (logit -inf, deepfuse/token_bitmask.hpp) has no probability
  // to report: the list stops before it (JSON has no -inf).
  for (int i = 0; i < k && std::isfinite(logits[ids[i]]); ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

namespace {

// log_softmax of one row, in double.
std::vector<double> log_softmax(std::span<const float> logits) {
  double max_logit = logits[0];
  for (float v : logits) max_logit = std::max<double>(max_logit, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max_logit);
  const double log_sum = std::log(sum) + max_logit;
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_sum;
  return out;
}

}  // namespace

NextTokenAgreement compare_next_token(std::span<const float> reference, std::span<const float> candidate, size_t vocab) {
  DF_CHECK(vocab > 0 && reference.size() == candidate.size() && reference.size() % vocab == 0,
           "compare_next_token: logits of different shapes");
  NextTokenAgreement result;
  result.positions = reference.size() / vocab;
  double kl_sum = 0;
  for (size_t t = 0; t < result.positions; ++t) {
    const auto p = reference.subspan(t * vocab, vocab), q = candidate.subspan(t * vocab, vocab);
    result.top1_agree += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
    const std::vector<double> log_p = log_softmax(p), log_q = log_softmax(q);
    for (size_t i = 0; i < vocab; ++i) kl_sum += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  }
  result.mean_kl = result.positions ? kl_sum / static_cast<double>(result.positions) : 0.0;
  return result;
}

}  // namespace deepfuse
