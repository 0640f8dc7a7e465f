// The reference decoder: Hugging Face's LlamaModel / Qwen2Model / MistralModel forward in fp32,
// op by op, with every op taken from reference.hpp so the GPU kernels and this decoder share one
// oracle. A prompt runs all its tokens through each layer together (keys and values appended
// first, then each query attends causally), exactly the arithmetic of one token at a time.
#include <cmath>
#include <string>

#include "core/float8.hpp"
#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "reference/parallel.hpp"

namespace deepfuse::reference {

namespace {

using R = TensorRole;

// y[t, o] = W[o, :] · x[t, :] (+ bias[o]); W is [out, in] (torch.nn.Linear's layout).
std::vector<float> linear(std::span<const float> x, const std::vector<float>& weight, const std::vector<float>& bias,
                          int tokens, int in, int out) {
  std::vector<float> y(static_cast<size_t>(tokens) * out);
  parallel_for(out, [&](size_t begin, size_t end) {
    for (size_t o = begin; o < end; ++o)
      for (int t = 0; t < tokens; ++t) {
        double v = dot(weight.data() + o * in, x.data() + static_cast<size_t>(t) * in, in);
        if (!bias.empty()) v += bias[o];
        y[static_cast<size_t>(t) * out + o] = static_cast<float>(v);
      }
  });
  return y;
}

}  // namespace

Decoder::Decoder(ModelConfig config, DecoderWeights weights, DecoderOptions options)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      options_(options),
      inv_freq_(rope_inverse_frequencies(config_.rope)) {
  DF_CHECK(static_cast<int>(weights_.layers.size()) == config_.num_hidden_layers,
           "reference decoder: weights hold " + std::to_string(weights_.layers.size()) + " layers, config says " +
               std::to_string(config_.num_hidden_layers));
}

void KvCache::truncate(int new_length) {
  DF_CHECK(new_length >= 0 && new_length <= length, "reference KV cache: cannot truncate " + std::to_string(length) +
                                                        " positions to " + std::to_string(new_length));
  for (size_t layer = 0; layer < keys.size(); ++layer) {
    const size_t per_position = length > 0 ? keys[layer].size() / length : 0;
    keys[layer].resize(per_position * new_length);
    values[layer].resize(per_position * new_length);
  }
  length = new_length;
}

void Decoder::as_gemm_input(std::vector<float>& x, int tokens, int columns) const {
  if (!options_.e4m3_activations) return;
  for (float& v : x) v = round_to_bf16(v);
  quantize_rows_fp8(x, tokens, columns);
}

KvCache Decoder::new_cache() const {
  KvCache cache;
  cache.keys.resize(config_.num_hidden_layers);
  cache.values.resize(config_.num_hidden_layers);
  return cache;
}

std::vector<float> Decoder::forward(std::span<const int32_t> ids, KvCache& cache) const {
  const int tokens = static_cast<int>(ids.size());
  const int hidden_size = config_.hidden_size;
  DF_CHECK(tokens > 0, "reference decoder: no tokens to run");
  DF_CHECK(cache.length + tokens <= config_.max_position_embeddings,
           "sequence of " + std::to_string(cache.length + tokens) + " tokens exceeds max_position_embeddings (" +
               std::to_string(config_.max_position_embeddings) + ")");

  std::vector<float> hidden(static_cast<size_t>(tokens) * hidden_size);
  embedding(weights_.model[R::embed_tokens].data(), config_.vocab_size, hidden_size, ids.data(), tokens, hidden.data());
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    attention_block(weights_.layers[l], l, hidden, tokens, cache);
    mlp_block(weights_.layers[l], hidden, tokens);
  }
  cache.length += tokens;

  std::vector<float> normed(hidden.size());
  rms_norm(hidden.data(), weights_.model[R::final_norm].data(), tokens, hidden_size, static_cast<float>(config_.rms_norm_eps),
           normed.data());
  const auto& lm_head = weights_.model[config_.tie_word_embeddings ? R::embed_tokens : R::lm_head];
  return linear(normed, lm_head, {}, tokens, hidden_size, config_.vocab_size);
}

// hidden += o_proj(attention(rope(q), rope(k), v)) over the cache, for each of `tokens` rows.
void Decoder::attention_block(const LayerWeights& layer, int layer_index, std::span<float> hidden, int tokens,
                              KvCache& cache) const {
  const int hidden_size = config_.hidden_size, head_dim = config_.head_dim;
  const int q_heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int q_size = config_.q_size(), kv_size = config_.kv_size();
  const int first_position = cache.length;

  std::vector<float> normed(hidden.size());
  rms_norm(hidden.data(), layer[R::input_norm].data(), tokens, hidden_size, static_cast<float>(config_.rms_norm_eps),
           normed.data());
  as_gemm_input(normed, tokens, hidden_size);
  std::vector<float> q = linear(normed, layer[R::q_proj], layer[R::q_bias], tokens, hidden_size, q_size);
  std::vector<float> k = linear(normed, layer[R::k_proj], layer[R::k_bias], tokens, hidden_size, kv_size);
  const std::vector<float> v = linear(normed, layer[R::v_proj], layer[R::v_bias], tokens, hidden_size, kv_size);
  for (int t = 0; t < tokens; ++t) {
    apply_rope(q.data() + static_cast<size_t>(t) * q_size, q_heads, head_dim, first_position + t, inv_freq_);
    apply_rope(k.data() + static_cast<size_t>(t) * kv_size, kv_heads, head_dim, first_position + t, inv_freq_);
  }
  auto& keys = cache.keys[layer_index];
  auto& values = cache.values[layer_index];
  keys.insert(keys.end(), k.begin(), k.end());
  values.insert(values.end(), v.begin(), v.end());

  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> attended(static_cast<size_t>(tokens) * q_size);
  for (int t = 0; t < tokens; ++t)
    attention_decode(q.data() + static_cast<size_t>(t) * q_size, keys.data(), values.data(), first_position + t + 1,
                     q_heads, kv_heads, head_dim, scale, config_.sliding_window,
                     attended.data() + static_cast<size_t>(t) * q_size);
  as_gemm_input(attended, tokens, q_size);
  const std::vector<float> out = linear(attended, layer[R::o_proj], layer[R::o_bias], tokens, q_size, hidden_size);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += out[i];
}

// hidden += down(silu(gate(x)) * up(x)) with x = post_attention_norm(hidden).
void Decoder::mlp_block(const LayerWeights& layer, std::span<float> hidden, int tokens) const {
  const int hidden_size = config_.hidden_size, intermediate = config_.intermediate_size;
  std::vector<float> normed(hidden.size());
  rms_norm(hidden.data(), layer[R::post_attention_norm].data(), tokens, hidden_size,
           static_cast<float>(config_.rms_norm_eps), normed.data());
  if (options_.e4m3_activations) {
    // Each GEMM's input through e4m3 per token: x before gate/up, silu(g) * u before down.
    as_gemm_input(normed, tokens, hidden_size);
    const std::vector<float> gate = linear(normed, layer[R::gate_proj], {}, tokens, hidden_size, intermediate);
    const std::vector<float> up = linear(normed, layer[R::up_proj], {}, tokens, hidden_size, intermediate);
    std::vector<float> act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = static_cast<float>(silu(gate[i]) * up[i]);
    as_gemm_input(act, tokens, intermediate);
    const std::vector<float> out = linear(act, layer[R::down_proj], {}, tokens, intermediate, hidden_size);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += out[i];
    return;
  }
  std::vector<double> out(hidden.size());
  swiglu_mlp(normed.data(), layer[R::gate_proj].data(), layer[R::up_proj].data(), layer[R::down_proj].data(), hidden.data(),
             out.data(), tokens, hidden_size, intermediate);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>(out[i]);
}

}  // namespace deepfuse::reference
