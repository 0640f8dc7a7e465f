// FP8 linear weights widened to bf16 for a GEMM: the path of every call the FP8 streams do not
// take (prefill chunks and decode batches above their token limit), where cuBLASLt runs a bf16
// GEMM on the widened copy. w[o, i] = e4m3[o, i] * scale (per row, or per 128x128 block), rounded
// once to bf16 (docs/kernels/fp8.md says why this and not FP8 tensor cores).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "deepfuse/weight_format.hpp"

namespace deepfuse::kernels {

// `weight` row-major in an FP8 format (scales as LinearWeight describes them); out [rows, columns]
// bf16. cudaErrorInvalidValue for another format or layout, a tensor scale, or null pointers.
cudaError_t launch_dequantize_to_bf16(const LinearWeight& weight, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace deepfuse::kernels
