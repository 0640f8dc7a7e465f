// How a checkpoint's linear weights are quantized: config.json's quantization_config reduced to
// what the loader needs (parsed in src/model/quantization.cpp). A plain data type, part of
// ModelConfig. Two methods load:
//   compressed-tensors  FP8 ("float-quantized"): F8_E4M3 weights, a "weight_scale" beside each,
//                       [out, 1] per channel or [1] per tensor; activations dynamic per token
//                       or unquantized; modules in "ignore" stay 16-bit (typically lm_head).
//   fp8                 F8_E4M3 weights with "weight_scale_inv" per 128x128 block
//                       ("weight_block_size": [128, 128]), or, without a block size, a
//                       per-tensor "weight_scale"; dynamic activations; modules in
//                       "modules_to_not_convert" / "ignored_layers" stay 16-bit, and lm_head
//                       always (transformers never converts it).
// Every other method (AWQ, GPTQ, bitsandbytes, ...) is refused by the parser, naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepfuse/weight_format.hpp"

namespace deepfuse {

enum class QuantizationMethod : uint8_t { none, compressed_tensors, fp8 };

enum class ScaleScope : uint8_t { channel, tensor, block };

struct WeightQuantization {
  QuantizationMethod method = QuantizationMethod::none;
  WeightFormat format = WeightFormat::bf16;  // of every quantized linear
  ScaleScope scale_scope = ScaleScope::channel;  // what one checkpoint scale covers
  std::string scale_name;                    // beside "<module>.weight": "weight_scale" or "weight_scale_inv"
  std::vector<std::string> ignore;           // modules kept 16-bit: names, or "re:" + a regex
  bool ignore_by_substring = false;          // fp8's lists match any module containing the entry

  bool quantized() const { return method != QuantizationMethod::none; }
};

// "compressed-tensors", "fp8" or "none".
const char* quantization_method_name(QuantizationMethod method);

// Whether the checkpoint stores module `module` (e.g. "lm_head", "model.layers.0.mlp.down_proj")
// in `q.format`, i.e. the method quantizes and the ignore list does not name it.
bool quantizes_module(const WeightQuantization& q, const std::string& module);

}  // namespace deepfuse
