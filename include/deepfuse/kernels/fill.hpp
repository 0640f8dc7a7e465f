// Seeded random fill on the device: benchmarks and --random-weights models need gigabytes of
// plausible bf16 values without a trip through the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

// values[i] = uniform(-scale, scale) from a counter-based hash of (seed, i): reproducible.
cudaError_t fill_uniform_bf16(__nv_bfloat16* values, size_t count, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace deepfuse::kernels
