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

// "[4096, 1]": a shape as the loader's errors print it.
std::string shape_text(const std::vector<int64_t>& shape);

// Every tensor a checkpoint for `config` must hold, in model order: the model table's rows the
// config asks for, the block's rows once per layer.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// The format `tensor` is stored in: config.quantization's format where the method quantizes the
// module and the model table allows the format for it; bf16 (BF16, F16 or F32 bytes) otherwise.
WeightFormat stored_weight_format(const ModelConfig& config, const ExpectedTensor& tensor);

// Throws deepfuse::Error naming the first missing, unexpected, mis-shaped or non-float tensor, any
// tensor whose dtype is not its stored format's (an FP8 weight without quantization_config, a
// quantized one in 16 bits, F8_E5M2), and an FP8 weight's scale tensor missing, mis-shaped or
// non-finite, or its shape not whole 128x128 blocks. Tolerated extras: rotary_emb.inv_freq
// buffers some exports keep, and lm_head.weight in a tied checkpoint (ignored: the embedding is
// used, as transformers does).
void validate_checkpoint(const Checkpoint& checkpoint, const ModelConfig& config);

// BF16, F16, F32, F8_E4M3 or F8_E5M2 bytes -> fp32 (8-bit values unscaled).
std::vector<float> to_float32(std::span<const std::byte> data, SafetensorsDType dtype);

// The format `tensor` runs in once loaded with `options`: its stored format, or the quantize
// format for a 16-bit linear weight (lm_head only with quantize_lm_head).
WeightFormat loaded_weight_format(const ModelConfig& config, const ExpectedTensor& tensor,
                                  const WeightLoadOptions& options);

// Throws deepfuse::Error for a --quantize the checkpoint cannot take: a checkpoint already
// quantized, --quantize-lm-head on a tied lm_head (the 16-bit embedding), fp8_e4m3_block128 on a
// weight that is not whole 128x128 blocks (naming it). fp8_e4m3 gets one absmax scale per output
// row, fp8_e4m3_block128 one per block (round_through_fp8). Both backends check it before loading.
void check_weight_load_options(const ModelConfig& config, const WeightLoadOptions& options);

// The format the decoder blocks' linear weights load in: the first non-bf16 one (the checkpoint's
// quantized format or --quantize's), bf16 when every one stays 16-bit. What the decode plan's
// choices depend on (the fused MLP reads bf16 only).
WeightFormat block_weight_format(const ModelConfig& config, const WeightLoadOptions& options);

// Validates, then converts every tensor to fp32 in the reference decoder's layout: FP8 weights
// dequantized with their scales (the oracle for the FP8 kernels), 16-bit ones as stored or
// quantized as `options` asks. Throws deepfuse::Error for a --quantize the checkpoint cannot
// take (already quantized; a tied lm_head, which is the 16-bit embedding).
reference::DecoderWeights load_reference_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                                                 const WeightLoadOptions& options = {});

}  // namespace deepfuse
