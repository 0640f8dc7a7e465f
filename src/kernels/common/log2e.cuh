// log2(e): the kernels take exponentials in base 2 (exp2f, one instruction), so e^x = 2^(x * kLog2e).
#pragma once

namespace deepfuse::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;

}  // namespace deepfuse::kernels
