// Where the GPU weights' values come from, one tensor slice at a time: a checkpoint (read,
// converted to bf16 or made FP8 (fp8_slice.hpp), copied through pinned staging) or seeded random
// numbers (drawn in bf16 on the device, quantized there for an FP8 target). build_weights
// (gpu_weights.cpp) walks the model table once and asks a source for each tensor.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "deepfuse/engine.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/model_tensors.hpp"
#include "deepfuse/safetensors.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/weight_format.hpp"
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

// Where one tensor slice goes on the device: its elements in `format`, row after row, from element
// `offset` of `data`; in a format with scales, also its scales (dist::scale_slice_of's rectangle,
// row-major) from element `scale_offset` of `scales` (fp32).
struct SliceTarget {
  WeightFormat format = WeightFormat::bf16;
  DeviceBuffer* data = nullptr;
  size_t offset = 0;
  DeviceBuffer* scales = nullptr;
  size_t scale_offset = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // `slice` of tensor `spec` (in block `layer`) -> `target`. Stream-ordered.
  virtual void fill(const TensorSpec& spec, int layer, const dist::TensorSlice& slice, const SliceTarget& target) = 0;
  // Every tensor enqueued and the stream synchronised.
  virtual void finish() {}
};

// Reads `shard`'s slices of `model` (the whole model's config) from the checkpoint; progress (may
// be empty) gets checkpoint bytes read / the rank's total.
std::unique_ptr<TensorSource> checkpoint_source(const Checkpoint& checkpoint, const ModelConfig& model,
                                                const dist::RankShard& shard, cudaStream_t stream,
                                                const LoadProgress& progress);

// Uniform random values by the table's TensorInit: embedding ±1, norms exactly 1, biases ±0.1,
// linear weights at std 1/sqrt(fan_in). Each tensor is drawn whole from its own stream of numbers
// and then sliced, so tensor-parallel ranks and one GPU of one seed hold the same model. An FP8
// target gets the same bf16 numbers quantized per output row (fp8_e4m3, kernels::quantize_rows_fp8)
// or per 128x128 block of the whole tensor (fp8_e4m3_block128, kernels::quantize_blocks_fp8), the
// host quantizer's bits, so bf16 and FP8 weights of one seed are one model up to FP8 rounding.
std::unique_ptr<TensorSource> random_source(const ModelConfig& model, uint64_t seed, cudaStream_t stream);

}  // namespace deepfuse::runtime
