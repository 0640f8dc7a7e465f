// The elementwise pieces of the unfused MLP baselines.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "deepfuse/kernels/folded_norm.hpp"

namespace deepfuse::kernels {

// unfused (SGLang/vLLM): act[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i], 16-byte vectors.
// With a folded norm (gate_up computed from raw rows x by weights holding the norm weight), both
// halves are first scaled by 1/rms(x[t]): act = silu(r g) * (r u). One block row per token then
// (at most 65535 tokens), each block finding r itself while its gate_up loads are in flight.
cudaError_t silu_and_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* act, int tokens, int intermediate,
                         cudaStream_t stream, const FoldedRmsNorm& norm = {});

// naive (eager PyTorch), one op per launch, each a bf16 round trip through memory.
cudaError_t silu_inplace(__nv_bfloat16* values, size_t count, cudaStream_t stream);
cudaError_t multiply(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                     cudaStream_t stream);
cudaError_t add(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, size_t count,
                cudaStream_t stream);

}  // namespace deepfuse::kernels
