// Where the GPU weights' values come from, one tensor slice at a time: a checkpoint (read,
// converted to bf16 and copied through pinned staging) or seeded random numbers. build_weights
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
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // `slice` of tensor `spec` (in block `layer`) -> `destination` as 16-bit elements from element
  // `offset` on, slice.columns per row. Stream-ordered.
  virtual void fill(const TensorSpec& spec, int layer, const dist::TensorSlice& slice, DeviceBuffer& destination,
                    size_t offset) = 0;
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
// and then sliced, so tensor-parallel ranks and one GPU of one seed hold the same model.
std::unique_ptr<TensorSource> random_source(const ModelConfig& model, uint64_t seed, cudaStream_t stream);

}  // namespace deepfuse::runtime
