// The batch-1 decode step's transformer blocks as one persistent launch
// (kernels/persistent/persistent_decode.cuh; EngineOptions::persistent_decode). Built once per
// engine: the table of every layer's weight and KV-pool pointers on the device, and the kernel's
// workspace. The embedding, every block, and the residual stream's final state come from the one
// launch; the final norm, lm_head and sampler run after it as in the other steps.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "deepfuse/model_config.hpp"
#include "deepfuse/tensor.hpp"
#include "kernels/persistent/persistent_decode.cuh"
#include "runtime/gpu_weights.hpp"
#include "runtime/kv_cache.hpp"

namespace deepfuse::runtime {

class PersistentDecodeStep {
 public:
  // Empty (available() false, with why_not() saying why) when the device, shape or weights
  // cannot take it: sm_90 and row-major MLP weights (the unfused variant or its copy) needed.
  PersistentDecodeStep(const ModelConfig& config, const GpuWeights& weights, const KvCache& kv, int device,
                       cudaStream_t stream);

  bool available() const { return !layers_.empty(); }
  const std::string& why_not() const { return why_not_; }

  // Block-table row 0's sequence, one token: ids, positions and lengths from entry 0 of the
  // step's decode inputs; leaves the last block's output in residual row 0.
  void run(const int32_t* id, const int32_t* position, const int32_t* seq_len, __nv_bfloat16* residual,
           cudaStream_t stream) const;

 private:
  kernels::PersistentDecodeParams params_;
  DeviceBuffer layers_;  // kernels::PersistentDecodeLayer [layers]
  DeviceBuffer workspace_;
  std::string why_not_;
};

}  // namespace deepfuse::runtime
