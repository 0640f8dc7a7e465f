// SiLU (x * sigmoid(x)) as every SwiGLU kernel computes it, one fast exponential.
#pragma once

namespace deepfuse::kernels {

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

}  // namespace deepfuse::kernels
