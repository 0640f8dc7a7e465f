// The whole decoder in plain C++ fp32 (Llama, Qwen2, Mistral): the CPU reference backend and the
// end-to-end oracle for the GPU runtime. Built from the per-op references in reference.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/model_tensors.hpp"

namespace deepfuse::reference {

// Row-major fp32 weights by role (include/deepfuse/model_tensors.hpp, whose table also says each
// one's shape) in Hugging Face's layouts (a Linear's weight is [out, in]); a tensor the config
// does not ask for (a bias) stays empty.
struct TensorSet {
  std::array<std::vector<float>, kTensorRoleCount> tensors;
  std::vector<float>& operator[](TensorRole role) { return tensors[static_cast<int>(role)]; }
  const std::vector<float>& operator[](TensorRole role) const { return tensors[static_cast<int>(role)]; }
};

using LayerWeights = TensorSet;  // a block's roles

struct DecoderWeights {
  TensorSet model;                  // embed_tokens, final_norm, lm_head (empty when tied)
  std::vector<LayerWeights> layers;
};

// Keys and values of every position seen so far, per layer: [positions, kv_heads, head_dim].
struct KvCache {
  std::vector<std::vector<float>> keys, values;
  int length = 0;

  // Drops every position from `new_length` on (a verify step's rejected drafts).
  void truncate(int new_length);
};

// How the decoder computes, beyond its weights.
struct DecoderOptions {
  // Emulates the FP8 tensor-core GEMMs (GemmChoice::fp8): the input of every block projection
  // (q/k/v, o_proj, gate/up, down; not lm_head) rounded to bf16, then through e4m3 with one absmax
  // scale per token (quantize_rows_fp8), as the GPU quantizes its activations. Off: the oracle on
  // the dequantized weights with float activations.
  bool e4m3_activations = false;
};

class Decoder {
 public:
  Decoder(ModelConfig config, DecoderWeights weights, DecoderOptions options = {});

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

  // A projection's input as the GEMM reads it (DecoderOptions::e4m3_activations), in place.
  void as_gemm_input(std::vector<float>& x, int tokens, int columns) const;

  ModelConfig config_;
  DecoderWeights weights_;
  DecoderOptions options_;
  std::vector<double> inv_freq_;
};

}  // namespace deepfuse::reference
