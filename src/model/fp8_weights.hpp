// FP8 linear weights in a checkpoint: which format each tensor is stored in, the scale tensor
// beside it, their checks (one line naming the tensor), dequantization to fp32 for the reference
// backend, and FP8 quantization at load (--quantize fp8).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/model_weights.hpp"

namespace deepfuse {

// The scale tensor of a quantized weight: its name and the shapes it may have.
struct ExpectedScale {
  std::string name;                              // "<module>.weight_scale" / "<module>.weight_scale_inv"
  std::vector<std::vector<int64_t>> shapes;      // per channel [out, 1]; per tensor [] or [1];
                                                 // per block [out / 128, in / 128]
};

// The scale tensor `tensor` has in `config`'s checkpoint, none when it is stored 16-bit.
std::optional<ExpectedScale> expected_scale(const ModelConfig& config, const ExpectedTensor& tensor);

// Throws deepfuse::Error (naming the file and tensor) unless `entry` is stored as `format`
// requires: its dtype, its block divisibility, and its scale tensor present, well-shaped,
// 16/32-bit and finite.
void check_stored_weight(const Checkpoint& checkpoint, const ModelConfig& config, const ExpectedTensor& tensor);

// w[o, i] in fp32: e4m3 bytes times their scales (per channel, tensor or block, as `config`
// says). `weight` and `scales` are the checkpoint's tensors, already checked.
std::vector<float> dequantize_fp8(const Checkpoint& checkpoint, const ModelConfig& config,
                                  const ExpectedTensor& tensor);

// The fp32 scales of a stored FP8 tensor as the device keeps them: per channel [rows] (a
// per-tensor checkpoint scale repeated for every row), per block [rows / 128, columns / 128].
std::vector<float> stored_fp8_scales(const Checkpoint& checkpoint, const ModelConfig& config,
                                     const ExpectedTensor& tensor);


// A [rows, columns] weight through FP8 e4m3 with one absmax scale per `side` x `side` block (per
// block what quantize_row_fp8 does per row; side divides both): writes the e4m3 bytes to `out`
// and returns the scales, row-major [rows / side, columns / side].
std::vector<float> quantize_blocks_fp8(std::span<const float> weight, int64_t rows, int64_t columns, int side,
                                       std::span<uint8_t> out);

// Rounds a [rows, columns] fp32 weight through `format` (an FP8 one) in place, with its scales
// (per row, or per block): what --quantize makes of it.
void round_through_fp8(std::span<float> weight, int64_t rows, int64_t columns, WeightFormat format);

}  // namespace deepfuse
