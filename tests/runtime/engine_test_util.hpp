// What the engine's GPU tests share: tiny model configurations, random prompts, and the check of
// greedy tokens against the reference decoder's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deepfuse/engine.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "logits_check.hpp"

namespace deepfuse::testing {

// The engine computes in bf16 with fp32 accumulation, the reference in fp32 on the same bf16
// weights: per position, relative error of the logits and top-1 agreement (logits_check.hpp).
inline constexpr double kMaxLogitsError = 2e-2;
inline constexpr double kMinTop1Agreement = 0.99;

struct TinyModel {
  std::string name;
  ModelConfig config;
};

inline ModelConfig tiny_config(Architecture architecture, int vocab, int hidden, int intermediate, int layers,
                               int heads, int kv_heads, int head_dim, double rope_theta, int max_position = 256) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = max_position;
  c.rms_norm_eps = 1e-5;
  c.rope.head_dim = head_dim;
  c.rope.theta = rope_theta;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

// Llama 3 RoPE scaling with all three wavelength bands inside theta 500000's spectrum.
inline void use_llama3_rope_scaling(ModelConfig& c) {
  c.rope.llama3_scaling = true;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position = 64;
}

// One per architecture feature the engine must get right. Vocabularies are odd-sized on purpose.
inline std::vector<TinyModel> tiny_models() {
  using A = Architecture;
  std::vector<TinyModel> models;
  // GQA 4:2, head_dim 64.
  models.push_back({"llama_gqa", tiny_config(A::llama, 512, 256, 512, 2, 4, 2, 64, 10000.0)});
  // head_dim 128 with q_size 512 != hidden 256, Llama 3 rope scaling with all three wavelength
  // bands inside theta 500000's spectrum.
  ModelConfig llama3 = tiny_config(A::llama, 1000, 256, 384, 3, 4, 2, 128, 500000.0);
  testing::use_llama3_rope_scaling(llama3);
  models.push_back({"llama3_rope_headdim128", llama3});
  // q/k/v biases, tied embeddings, GQA 4:1.
  ModelConfig qwen2 = tiny_config(A::qwen2, 997, 256, 448, 2, 4, 1, 64, 1000000.0);
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  models.push_back({"qwen2_bias_tied", qwen2});
  // A 24-token sliding window, shorter than the prompts below; GQA 3:1.
  ModelConfig mistral = tiny_config(A::mistral, 771, 192, 320, 3, 3, 1, 64, 10000.0);
  mistral.sliding_window = 24;
  models.push_back({"mistral_window24", mistral});
  return models;
}

inline std::vector<int32_t> random_ids(std::mt19937_64& rng, int count, int vocab) {
  std::uniform_int_distribution<int32_t> any(0, vocab - 1);
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = any(rng);
  return ids;
}

// A greedy request: `prompt`, then up to `max_new_tokens` tokens (SequenceRequest's defaults otherwise).
inline SequenceRequest greedy_request(std::vector<int32_t> prompt, int max_new_tokens) {
  SequenceRequest request;
  request.prompt = std::move(prompt);
  request.max_new_tokens = max_new_tokens;
  return request;
}

// How many of `ours` (greedy tokens after `prompt`) equal the reference's greedy decode, one token
// at a time; the first divergence must be a near tie of the reference, after which the two
// continue from different text and are not compared.
inline int reference_greedy_matches(const reference::Decoder& reference, std::span<const int32_t> prompt,
                                    std::span<const int32_t> ours, int vocab, const std::string& what,
                                    double near_tie_fraction = kNearTieFraction) {
  reference::KvCache cache = reference.new_cache();
  std::vector<float> logits = reference.forward(prompt, cache);
  for (size_t t = 0; t < ours.size(); ++t) {
    const std::span<const float> row(logits.data() + logits.size() - vocab, vocab);
    const auto best = static_cast<int32_t>(argmax(row));
    if (ours[t] != best) {
      const bool in_range = ours[t] >= 0 && ours[t] < vocab;
      EXPECT_TRUE(in_range && near_tie(row, ours[t], best, near_tie_fraction))
          << what << " token " << t << ": engine " << ours[t] << ", reference " << best << " (logits "
          << (in_range ? row[ours[t]] : 0.0f) << " vs " << row[best] << ", row RMS " << rms(row) << ")";
      return static_cast<int>(t);
    }
    logits = reference.forward(ours.subspan(t, 1), cache);
  }
  return static_cast<int>(ours.size());
}

// `ours` equals `alone` (both after `prompt`), or the two part where the reference's logits
// after their common prefix rate both picks a near tie. Returns whether they are equal.
inline bool same_or_parted_at_near_tie(const reference::Decoder& reference, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& ours, const std::vector<int32_t>& alone,
                                       const std::string& what) {
  const auto parted = std::mismatch(ours.begin(), ours.end(), alone.begin(), alone.end());
  if (parted.first == ours.end() && parted.second == alone.end()) return true;
  if (parted.first == ours.end() || parted.second == alone.end()) {
    ADD_FAILURE() << what << ": " << ours.size() << " tokens, " << alone.size() << " alone, equal as far as both go";
    return false;
  }
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), ours.begin(), parted.first);
  reference::KvCache cache = reference.new_cache();
  const std::vector<float> logits = reference.forward(ids, cache);
  const size_t vocab = reference.config().vocab_size;
  const std::span<const float> last(logits.data() + logits.size() - vocab, vocab);
  EXPECT_TRUE(testing::near_tie(last, *parted.first, *parted.second))
      << what << ": token " << (parted.first - ours.begin()) << " is " << *parted.first << ", alone "
      << *parted.second << ", not a near tie of the reference (logits " << last[*parted.first] << " vs "
      << last[*parted.second] << ")";
  return false;
}

}  // namespace deepfuse::testing
