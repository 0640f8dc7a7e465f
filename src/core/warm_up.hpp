// Warming the GPU up before timing it: a GPU coming out of a pause runs its first milliseconds at
// lower clocks (with 5 warm-up calls the fused MLP's first token count after loading its weights
// read up to 10% slow, docs/kernels/swiglu_fused.md; the copy-bandwidth probe read 1% low).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>

namespace deepfuse {

inline constexpr std::chrono::milliseconds kWarmUpTime{100};

// Runs call(0), call(1), ... at least `min_calls` times and for at least kWarmUpTime of wall time
// (synchronizing `stream` every few calls; null: each call synchronizes itself).
void warm_up(const std::function<void(int rep)>& call, int min_calls, cudaStream_t stream);

}  // namespace deepfuse
