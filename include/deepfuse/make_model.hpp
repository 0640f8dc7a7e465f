// Synthetic checkpoints: a Hugging Face-style directory (config.json, model.safetensors or shards
// with model.safetensors.index.json) with seeded random weights, for any supported architecture
// and size. Used by `deepfuse make-model`, tests, and benchmarks that need no download.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "deepfuse/model_config.hpp"
#include "deepfuse/safetensors.hpp"

namespace deepfuse {

// Names accepted by model_preset, the first being the default.
std::vector<std::string> model_preset_names();

// tiny (a 2-layer Llama small enough for CI), llama3.2-1b, llama3-8b, qwen2.5-7b, mistral-7b.
ModelConfig model_preset(const std::string& name);

// config.json text for `config`, in the field names transformers writes; a quantized config gets
// its quantization_config (what fp8_checkpoint_quantization makes only).
std::string model_config_json(const ModelConfig& config, SafetensorsDType dtype);

// What `make-model --dtype fp8` writes (fp8_e4m3): compressed-tensors FP8, a BF16 "weight_scale"
// [out, 1] per projection, activations dynamic per token, lm_head kept 16-bit (listed in "ignore").
// `--dtype fp8-block128` (fp8_e4m3_block128): quant_method fp8 with weight_block_size [128, 128],
// an F32 "weight_scale_inv" [out / 128, in / 128] per projection, dynamic activations, lm_head
// 16-bit (as Qwen's and DeepSeek's FP8 releases: transformers never converts it). Throws for
// other formats.
WeightQuantization fp8_checkpoint_quantization(WeightFormat format = WeightFormat::fp8_e4m3);

struct MakeModelOptions {
  // BF16, F16 or F32: every tensor's dtype, except the F8_E4M3 projections (and their scales)
  // of a config whose quantization is fp8_checkpoint_quantization()'s. A block format's
  // projections must be whole blocks (an error naming the first that is not).
  SafetensorsDType dtype = SafetensorsDType::BF16;
  uint64_t seed = 0;
  int shards = 1;  // > 1: model-0000i-of-0000n.safetensors plus the index
};

// Writes the checkpoint into `dir` (created if needed). Weights are drawn tensor by tensor so
// even an 8B model never needs more memory than its largest tensor.
void write_random_checkpoint(const ModelConfig& config, const std::filesystem::path& dir,
                             const MakeModelOptions& options);

}  // namespace deepfuse
