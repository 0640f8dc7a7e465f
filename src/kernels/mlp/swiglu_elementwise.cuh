// The elementwise pieces of the unfused MLP baselines.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace deepfuse::kernels {

// unfused (SGLang/vLLM): act[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i], 16-byte vectors.
cudaError_t silu_and_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* act, int tokens, int intermediate,
                         cudaStream_t stream);

// naive (eager PyTorch), one op per launch, each a bf16 round trip through memory.
cudaError_t silu_inplace(__nv_bfloat16* values, size_t count, cudaStream_t stream);
cudaError_t multiply(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                     cudaStream_t stream);
cudaError_t add(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                cudaStream_t stream);

}  // namespace deepfuse::kernels
