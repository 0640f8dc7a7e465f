// Per-op references for the transformer layer (declared at the end of deepfuse/reference.hpp).
// Each op follows the Hugging Face transformers code it stands in for; sums run in double so
// the oracle's own rounding stays far below what tests of fp32/bf16 kernels can see.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <unordered_map>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"

namespace deepfuse::reference {

void embedding(const float* table, int vocab, int hidden, const int32_t* ids, int tokens, float* out) {
  for (int t = 0; t < tokens; ++t) {
    const int32_t id = ids[t];
    DF_CHECK(id >= 0 && id < vocab,
             "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    std::copy_n(table + static_cast<size_t>(id) * hidden, hidden, out + static_cast<size_t>(t) * hidden);
  }
}

void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<size_t>(r) * hidden;
    double sum_of_squares = 0;
    for (int h = 0; h < hidden; ++h) sum_of_squares += static_cast<double>(row[h]) * row[h];
    const double inverse_rms = 1.0 / std::sqrt(sum_of_squares / hidden + eps);
    float* out_row = out + static_cast<size_t>(r) * hidden;
    for (int h = 0; h < hidden; ++h) out_row[h] = static_cast<float>(row[h] * inverse_rms * weight[h]);
  }
}

void add_rms_norm(float* residual, const float* x, const float* weight, int rows, int hidden, float eps,
                  float* out, bool round_residual_to_bf16) {
  const size_t count = static_cast<size_t>(rows) * hidden;
  for (size_t i = 0; i < count; ++i) {
    residual[i] += x[i];
    if (round_residual_to_bf16) residual[i] = round_to_bf16(residual[i]);
  }
  rms_norm(residual, weight, rows, hidden, eps, out);
}

void apply_rope(float* x, int heads, int head_dim, int position, std::span<const double> inv_freq) {
  const int half = head_dim / 2;
  DF_CHECK(static_cast<int>(inv_freq.size()) == half, "apply_rope: inv_freq must hold head_dim/2 values");
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    const double c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < heads; ++h) {
      float* head = x + static_cast<size_t>(h) * head_dim;
      const double first = head[i], second = head[i + half];
      // rotate_half(x) = [-x2, x1], so out = x*cos + rotate_half(x)*sin.
      head[i] = static_cast<float>(first * c - second * s);
      head[i + half] = static_cast<float>(second * c + first * s);
    }
  }
}

void attention_decode(const float* q, const float* k_cache, const float* v_cache, int length, int q_heads,
                      int kv_heads, int head_dim, float scale, int sliding_window, float* out) {
  DF_CHECK(length > 0, "attention_decode: the KV cache is empty");
  DF_CHECK(kv_heads > 0 && q_heads % kv_heads == 0,
           "attention_decode: q_heads (" + std::to_string(q_heads) + ") must be a multiple of kv_heads (" +
               std::to_string(kv_heads) + ")");
  const int group = q_heads / kv_heads;
  // The query sits at length-1; a window of W sees positions length-W .. length-1.
  const int first = sliding_window > 0 ? std::max(0, length - sliding_window) : 0;
  const size_t position_stride = static_cast<size_t>(kv_heads) * head_dim;
  std::vector<double> scores(length);
  std::vector<double> accum(head_dim);
  for (int h = 0; h < q_heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * head_dim;
    const size_t kv_offset = static_cast<size_t>(h / group) * head_dim;
    double max_score = -std::numeric_limits<double>::infinity();
    for (int p = first; p < length; ++p) {
      const float* k = k_cache + p * position_stride + kv_offset;
      double dot = 0;
      for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(qh[d]) * k[d];
      scores[p] = dot * scale;
      max_score = std::max(max_score, scores[p]);
    }
    double denominator = 0;
    std::fill(accum.begin(), accum.end(), 0.0);
    for (int p = first; p < length; ++p) {
      const double weight = std::exp(scores[p] - max_score);
      denominator += weight;
      const float* v = v_cache + p * position_stride + kv_offset;
      for (int d = 0; d < head_dim; ++d) accum[d] += weight * v[d];
    }
    for (int d = 0; d < head_dim; ++d) out[static_cast<size_t>(h) * head_dim + d] = static_cast<float>(accum[d] / denominator);
  }
}

void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int q_start, int q_len,
                       int q_heads, int kv_heads, int head_dim, float scale, int sliding_window, float* out) {
  DF_CHECK(q_start >= 0 && q_len > 0, "attention_prefill: needs q_start >= 0 and q_len > 0 (got q_start " +
                                          std::to_string(q_start) + ", q_len " + std::to_string(q_len) + ")");
  const size_t row_elements = static_cast<size_t>(q_heads) * head_dim;
  for (int i = 0; i < q_len; ++i)
    attention_decode(q + i * row_elements, k_cache, v_cache, q_start + i + 1, q_heads, kv_heads, head_dim, scale,
                     sliding_window, out + i * row_elements);
}

namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// Lowest id among the largest values.
int32_t argmax(std::span<const double> values) {
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

// HF RepetitionPenaltyLogitsProcessor: each id seen before is penalised once, however often it
// appeared: negative logits are multiplied by the penalty, positive ones divided by it.
std::vector<double> penalised_logits(std::span<const float> logits, float penalty,
                                     std::span<const int32_t> previous) {
  std::vector<double> scores(logits.begin(), logits.end());
  if (penalty == 1.0f) return scores;
  std::vector<bool> seen(scores.size(), false);
  for (int32_t id : previous) {
    DF_CHECK(id >= 0 && static_cast<size_t>(id) < scores.size(),
             "previous token id " + std::to_string(id) + " is outside the vocabulary");
    if (seen[id]) continue;
    seen[id] = true;
    const double original = logits[id];
    scores[id] = original < 0 ? original * penalty : original / penalty;
  }
  return scores;
}

std::vector<double> softmax(std::span<const double> scores) {
  const double max_score = *std::max_element(scores.begin(), scores.end());
  std::vector<double> probs(scores.size());
  double total = 0;
  for (size_t i = 0; i < scores.size(); ++i) total += probs[i] = std::exp(scores[i] - max_score);
  for (double& p : probs) p /= total;
  return probs;
}

// HF TopKLogitsWarper: removes every score below the k-th largest (ties with it stay).
void keep_top_k(std::vector<double>& scores, int top_k) {
  if (top_k <= 0 || static_cast<size_t>(top_k) >= scores.size()) return;
  std::vector<double> sorted = scores;
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
  const double threshold = sorted[top_k - 1];
  for (double& s : scores)
    if (s < threshold) s = kNegativeInfinity;
}

// HF TopPLogitsWarper: walking from the least likely token up, removes tokens while their
// cumulative probability stays <= 1 - top_p; the most likely token always stays.
void keep_top_p(std::vector<double>& scores, float top_p) {
  if (top_p >= 1.0f) return;
  const std::vector<double> probs = softmax(scores);
  std::vector<size_t> ascending(scores.size());
  for (size_t i = 0; i < ascending.size(); ++i) ascending[i] = i;
  std::stable_sort(ascending.begin(), ascending.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double cumulative = 0;
  for (size_t rank = 0; rank + 1 < ascending.size(); ++rank) {
    cumulative += probs[ascending[rank]];
    if (cumulative > 1.0 - top_p) break;
    scores[ascending[rank]] = kNegativeInfinity;
  }
}

// HF MinPLogitsWarper: removes tokens less likely than min_p times the most likely one.
void keep_min_p(std::vector<double>& scores, float min_p) {
  if (min_p <= 0.0f) return;
  const std::vector<double> probs = softmax(scores);
  const double threshold = min_p * *std::max_element(probs.begin(), probs.end());
  for (size_t i = 0; i < scores.size(); ++i)
    if (probs[i] < threshold) scores[i] = kNegativeInfinity;
}

}  // namespace

void apply_presence_frequency_penalties(std::span<float> logits, float presence, float frequency,
                                        std::span<const int32_t> generated) {
  if (presence == 0.0f && frequency == 0.0f) return;
  std::unordered_map<int32_t, int> counts;
  for (const int32_t id : generated) {
    DF_CHECK(id >= 0 && static_cast<size_t>(id) < logits.size(),
             "generated token id " + std::to_string(id) + " is outside the vocabulary");
    ++counts[id];
  }
  for (const auto& [id, count] : counts) {
    const float penalty = presence + frequency * static_cast<float>(count);
    logits[id] -= penalty;
  }
}

void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask) {
  const int vocab = static_cast<int>(logits.size());
  DF_CHECK(bitmask.size() >= static_cast<size_t>(token_bitmask_words(vocab)),
           "token bitmask of " + std::to_string(bitmask.size()) + " words for a vocabulary of " +
               std::to_string(vocab));
  for (int id = 0; id < vocab; ++id)
    if (!token_allowed(bitmask.data(), id)) logits[id] = -std::numeric_limits<float>::infinity();
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          std::span<const int32_t> previous) {
  DF_CHECK(!logits.empty(), "sampling: empty logits");
  std::vector<double> scores = penalised_logits(logits, params.repetition_penalty, previous);
  if (params.temperature <= 0.0f) {
    std::vector<double> one_hot(scores.size(), 0.0);
    one_hot[argmax(scores)] = 1.0;
    return one_hot;
  }
  for (double& s : scores) s /= params.temperature;
  keep_top_k(scores, params.top_k);
  keep_top_p(scores, params.top_p);
  keep_min_p(scores, params.min_p);
  return softmax(scores);
}

// splitmix64's output function applied to the counter seed + (step + 1) * golden gamma: the
// step-th output of a splitmix64 generator seeded with `seed`, computable without the previous
// steps. The top 53 bits become a double in [0, 1).
double sampling_uniform(uint64_t seed, uint64_t step) {
  uint64_t z = seed + (step + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t sample(std::span<const float> logits, const SamplingParams& params, std::span<const int32_t> previous,
               uint64_t step) {
  if (params.temperature <= 0.0f) return argmax(penalised_logits(logits, params.repetition_penalty, previous));
  const std::vector<double> probs = sampling_distribution(logits, params, previous);
  const double u = sampling_uniform(params.seed, step);
  double cumulative = 0;
  int32_t last_possible = 0;
  for (size_t id = 0; id < probs.size(); ++id) {
    if (probs[id] == 0.0) continue;
    last_possible = static_cast<int32_t>(id);
    cumulative += probs[id];
    if (u < cumulative) return last_possible;
  }
  return last_possible;  // u landed in the rounding slack above the final cumulative sum
}

}  // namespace deepfuse::reference
