// Environment switches for A/B measurements of the kernels' and the engine's rules (DEEPFUSE_PDL,
// DEEPFUSE_OPROJ_GEMV, DEEPFUSE_FOLD_NORMS, ...): read once by the caller (a function-local
// static), never needed in normal use.
#pragma once

#include <cstdlib>

namespace deepfuse {

// The integer value of environment variable `name`, or `unset` when it is not set.
inline int ab_switch(const char* name, int unset) {
  const char* text = std::getenv(name);
  return text ? std::atoi(text) : unset;
}

}  // namespace deepfuse
