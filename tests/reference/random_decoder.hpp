// A small reference decoder for tests (the decoder's own tests, speculative verify): config, random
// weights, random ids.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "deepfuse/model_tensors.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "test_util.hpp"

namespace deepfuse::testing {

// A small model of each architecture: GQA, head_dim != hidden / heads, Qwen2's biases and tied
// embedding, Mistral's sliding window of 3, Llama 3's RoPE scaling.
inline ModelConfig small_decoder_config(Architecture architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.vocab_size = 50;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 10;  // != hidden / heads
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-5;
  c.rope.head_dim = c.head_dim;
  c.qkv_bias = architecture == Architecture::qwen2;
  c.tie_word_embeddings = architecture == Architecture::qwen2;
  c.sliding_window = architecture == Architecture::mistral ? 3 : 0;
  if (architecture == Architecture::llama) {
    c.rope.llama3_scaling = true;
    c.rope.factor = 4;
    c.rope.original_max_position = 16;
  }
  return c;
}

// Every tensor the model table asks of `c`, in its shape: norms around 1, the embedding ±1,
// the rest ±0.3.
inline reference::DecoderWeights random_decoder_weights(const ModelConfig& c, std::mt19937_64& rng) {
  auto draw = [&](const TensorSpec& spec) {
    const std::vector<int64_t> shape = tensor_shape(spec, c);
    const size_t count = static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1));
    const float scale = spec.init == TensorInit::norm ? 0.2f : spec.init == TensorInit::embedding ? 1.0f : 0.3f;
    auto w = random_uniform(rng, count, scale);
    if (spec.init == TensorInit::norm)
      for (float& v : w) v += 1.0f;
    return w;
  };
  reference::DecoderWeights w;
  w.layers.resize(c.num_hidden_layers);
  for (const TensorSpec& spec : kModelTensors) {
    if (!spec.present(c)) continue;
    if (spec.scope != TensorScope::layer) w.model[spec.role] = draw(spec);
    else
      for (auto& layer : w.layers) layer[spec.role] = draw(spec);
  }
  return w;
}

inline std::vector<int32_t> random_ids(std::mt19937_64& rng, int count, int vocab) {
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

}  // namespace deepfuse::testing
