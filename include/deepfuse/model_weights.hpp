// The tensors a config implies, checked against a checkpoint, and loaded as fp32 for the
// reference backend.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/model_tensors.hpp"
#include "deepfuse/reference_decoder.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse {

struct ExpectedTensor {
  std::string name;             // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  const TensorSpec* spec = nullptr;  // its row of the model table
  int layer = 0;                     // its block (layer tensors)
};

// Every tensor a checkpoint for `config` must hold, in model order: the model table's rows the
// config asks for, the block's rows once per layer.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// The device weight format a checkpoint dtype loads as (BF16, F16, F32: bf16; F8_E4M3: fp8_e4m3),
// or none for a dtype no weight may have.
std::optional<WeightFormat> checkpoint_weight_format(SafetensorsDType dtype);

// Throws deepfuse::Error naming the first missing, unexpected, mis-shaped or non-float tensor, and any
// tensor in a format the table does not allow it or no loader implements yet (fp8).
// Tolerated extras: rotary_emb.inv_freq buffers some exports keep, and lm_head.weight in a tied
// checkpoint (ignored: the embedding is used, as transformers does).
void validate_checkpoint(const Checkpoint& checkpoint, const ModelConfig& config);

// BF16, F16 or F32 bytes -> fp32.
std::vector<float> to_float32(std::span<const std::byte> data, SafetensorsDType dtype);

// Validates, then converts every tensor to fp32 in the reference decoder's layout.
reference::DecoderWeights load_reference_weights(const Checkpoint& checkpoint, const ModelConfig& config);

}  // namespace deepfuse
