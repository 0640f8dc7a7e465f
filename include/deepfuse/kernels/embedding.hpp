// Embedding gather: out[t, :] = table[ids[t], :] with 16-byte vectors. An id outside [0, vocab)
// (or a padded slot, id < 0) writes a zero row: the GPU cannot throw, and zeros keep later
// layers finite. CPU reference: reference::embedding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

struct EmbeddingParams {
  const __nv_bfloat16* table = nullptr;  // [vocab, hidden]
  const int32_t* ids = nullptr;          // [tokens] (device)
  __nv_bfloat16* out = nullptr;          // [tokens, hidden]
  int vocab = 0;
  int hidden = 0;                        // multiple of 8
  int tokens = 0;
};

// cudaErrorInvalidValue on bad sizes or null pointers; otherwise the launch's error.
cudaError_t launch_embedding(const EmbeddingParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
