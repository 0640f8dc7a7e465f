// What timing cuBLASLt's candidate algorithms found for one GEMM shape of the decode step
// (EngineOptions::tune_gemms): cuBLASLt's heuristic suggests several algorithms per shape and
// ranks them without running them; the engine times each, and the split-K ones also unsplit, on
// its own weights and keeps the fastest (docs/runtime.md, "cuBLASLt algorithms timed as the step
// runs them").
#pragma once

#include <string>

namespace deepfuse {

struct GemmTuning {
  std::string op;             // "qkv", "o_proj", "mlp gate_up", "mlp down", "lm_head"
  int m = 0, n = 0, k = 0;    // y[m, n] = x[m, k] · w[n, k]^T
  int candidates = 0;         // candidates that ran: the suggestions, and the split-K ones unsplit
  int chosen = 0;             // index among the candidates; 0: the heuristic's first choice kept
  int chosen_splits = 0;      // split-K factor of the kept algorithm (0: not reported)
  double heuristic_us = 0.0;  // µs per call of the first choice, calls back to back in a graph,
  double chosen_us = 0.0;     // each call's weights from HBM (rotated over the layers)
};

}  // namespace deepfuse
