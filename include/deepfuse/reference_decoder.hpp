// The whole decoder in plain C++ fp32 (Llama, Qwen2, Mistral): the CPU reference backend and the
// end-to-end oracle for the GPU runtime. Built from the per-op references in reference.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepfuse/model_config.hpp"

namespace deepfuse::reference {

// Row-major fp32 weights with Hugging Face's layouts (a Linear's weight is [out, in]).
struct LayerWeights {
  std::vector<float> input_norm;                       // [hidden]
  std::vector<float> q_proj, k_proj, v_proj, o_proj;   // [q_size, hidden], [kv_size, hidden] x2, [hidden, q_size]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;   // empty when the architecture has none
  std::vector<float> post_attention_norm;              // [hidden]
  std::vector<float> gate_proj, up_proj, down_proj;    // [inter, hidden] x2, [hidden, inter]
};

struct DecoderWeights {
  std::vector<float> embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;    // [hidden]
  std::vector<float> lm_head;       // [vocab, hidden]; empty when tied to embed_tokens
};

// Keys and values of every position seen so far, per layer: [positions, kv_heads, head_dim].
struct KvCache {
  std::vector<std::vector<float>> keys, values;
  int length = 0;
};

class Decoder {
 public:
  Decoder(ModelConfig config, DecoderWeights weights);

  const ModelConfig& config() const { return config_; }
  KvCache new_cache() const;

  // Runs `ids` at positions cache.length .. cache.length + ids.size() - 1, appending their keys
  // and values to the cache; returns logits [ids.size(), vocab]. A prompt in one call and the
  // same tokens one call at a time give the same logits.
  std::vector<float> forward(std::span<const int32_t> ids, KvCache& cache) const;

 private:
  void attention_block(const LayerWeights& layer, int layer_index, std::span<float> hidden, int tokens,
                       KvCache& cache) const;
  void mlp_block(const LayerWeights& layer, std::span<float> hidden, int tokens) const;

  ModelConfig config_;
  DecoderWeights weights_;
  std::vector<double> inv_freq_;
};

}  // namespace deepfuse::reference
