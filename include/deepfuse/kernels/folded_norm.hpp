// An RMSNorm folded into the projection after it: rms_norm(x)·w·W^T = (1/rms(x))·(x·(W∘w)^T), with
// (W∘w)[n, k] = W[n, k]·w[k]. The norm weight is multiplied into the projection's columns once at
// load (launch_fold_norm_weight), the projection reads the raw residual stream, and the kernel that
// consumes the projection's output scales each token's values by 1/rms(x) (row_inverse_rms,
// src/kernels/common/row_rms.cuh). The norm's own launch, and its bf16 round trip of the
// normalised rows, disappear. Rounding: one
// bf16 rounding of W∘w at load where Hugging Face rounds the normalised row; the same trade the
// fused kernels make (docs/kernels/swiglu_fused.md, "v6: the norm weight in the packed columns").
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

// What a consumer kernel needs to apply a folded norm; input == nullptr: no norm.
struct FoldedRmsNorm {
  const __nv_bfloat16* input = nullptr;  // [tokens, hidden] the raw rows the projection read
  int hidden = 0;                        // multiple of 8
  float eps = 1e-6f;
};

// matrix[r, c] = bf16(matrix[r, c] * weight[c]) for a row-major [rows, cols] matrix (cols a
// multiple of 8, both 16-byte aligned).
cudaError_t launch_fold_norm_weight(__nv_bfloat16* matrix, int rows, int cols, const __nv_bfloat16* weight,
                                    cudaStream_t stream);

}  // namespace deepfuse::kernels
