// RMSNorm and the fused residual add + RMSNorm that sits between transformer blocks. One block
// per row, one pass over 16-byte vectors, fp32 statistics (CPU references: reference::rms_norm,
// reference::add_rms_norm).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace deepfuse::kernels {

struct RmsNormParams {
  __nv_bfloat16* residual = nullptr;     // [rows, hidden]; add_rms_norm: residual += x in place
  const __nv_bfloat16* x = nullptr;      // [rows, hidden]; add_rms_norm only (may be null: no add)
  const __nv_bfloat16* weight = nullptr; // [hidden]
  __nv_bfloat16* out = nullptr;          // [rows, hidden]; must not alias residual or x
  int rows = 0;
  int hidden = 0;                        // multiple of 8
  float eps = 1e-6f;
};

// out = rms_norm(residual) * weight (residual is only read).
cudaError_t launch_rms_norm(const RmsNormParams& params, cudaStream_t stream);

// residual = bf16(residual + x); out = rms_norm(residual) * weight. With x == null this is
// launch_rms_norm.
cudaError_t launch_add_rms_norm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
