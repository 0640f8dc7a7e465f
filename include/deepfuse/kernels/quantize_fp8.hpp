// FP8 quantization on the device, one scale per row: random FP8 weights for benchmarks (drawn in
// bf16 and made FP8 here, without a trip through the host), and the activations of the FP8
// tensor-core GEMMs, quantized per token before each (kernels::CublasLtGemm::run_fp8).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepfuse::kernels {

// Row-major [rows, columns] bf16 -> e4m3 bytes [rows, columns] and one fp32 scale per row, bit for
// bit what the host quantizer makes (core/float8.hpp, quantize_row_fp8): scale = absmax / 448 (1 for an
// all-zero row), byte = e4m3(x / scale), rounded to nearest even and saturating at ±448.
// rows and columns positive; `in` must not overlap the outputs. Columns a multiple of 8 with `in`
// 16-byte and `out` 8-byte aligned take a vectorized path (the same bits).
cudaError_t quantize_rows_fp8(const __nv_bfloat16* in, uint8_t* out, float* scales, int rows, int columns,
                              cudaStream_t stream);

// The same with one scale per `side` x `side` block (side divides rows and columns): scales
// [rows / side, columns / side] row-major, bit for bit the host's quantize_blocks_fp8.
cudaError_t quantize_blocks_fp8(const __nv_bfloat16* in, uint8_t* out, float* scales, int rows, int columns, int side,
                                cudaStream_t stream);

}  // namespace deepfuse::kernels
