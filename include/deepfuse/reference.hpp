// The CPU reference: plain fp32 math (fp64 where an oracle needs it), the ground truth every GPU
// op is tested against and the CPU backend. Clarity first; threads only where sizes demand.
#pragma once

#include <cstddef>

namespace deepfuse::reference {

// y[t, :] = down( silu(gate·x[t]) * (up·x[t]) ) (+ residual[t, :]) for t < tokens.
// gate, up: [I, H]; down: [H, I]; x, residual, y: [tokens, H]; residual may be null.
// Accumulates in double; `round_activation_to_bf16` rounds silu(g)*u through bf16 first, as the
// GPU variants do before their down projection (the default keeps full precision).
void swiglu_mlp(const float* x, const float* gate, const float* up, const float* down,
                const float* residual, double* y, int tokens, int hidden, int intermediate,
                bool round_activation_to_bf16 = false);

// silu(v) = v * sigmoid(v)
double silu(double v);

}  // namespace deepfuse::reference
