// Warming the GPU up before timing it: a GPU coming out of a pause runs its first milliseconds at
// lower clocks, and the first rows timed read slow (docs/kernels/swiglu_fused.md, "`bench mlp`
// timing").
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
