// `deepfuse bench mlp`: naive vs unfused vs fused vs fused_batched (and fused_wgmma on request) SwiGLU MLP over
// shapes and token counts, each as a fraction of the copy bandwidth measured in the same run.
#pragma once

#include <string>
#include <vector>

#include "deepfuse/mlp.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::bench {

struct MlpBenchOptions {
  std::vector<MlpShape> shapes;
  std::vector<int> token_counts;
  std::vector<MlpVariant> variants{MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused,
                                   MlpVariant::fused_batched};
  int repetitions = 50;
  int warmup = 5;
  bool residual = true;
  bool norm = false;         // fold an RMSNorm of x in, as the decode engine does
  WeightFormat weights = WeightFormat::bf16;  // fp8_e4m3: random e4m3 bytes, per-row scales
  double l2_multiple = 4.0;  // weight copies rotated per call cover at least this many L2s
  std::string json_path;     // empty: no JSON
  // Per-block timelines of a graph of calls per row (needs -DDEEPFUSE_TRACE=ON): CSV rows
  // labelled "<variant>-<H>x<I>", batch = M, context = 0 (scripts/profile/summarize_trace.py).
  std::string trace_path;
  // Extra fused rows with explicit launch tuning, named like "fused[b2c8]" (see parse below).
  std::vector<std::string> fused_tunings;
};

// "b2c8" = 2 blocks/SM, clusters of 8.
FusedMlpTuning parse_fused_tuning(const std::string& text);

// The default shape list (Llama-3.2-1B ... Llama-3-70B at TP8 and TP4) and token counts.
std::vector<MlpShape> default_mlp_bench_shapes();
std::vector<int> default_mlp_bench_tokens();

// Runs on the GPU when one is present, otherwise times the CPU reference (rows say which).
// Prints the table to stdout; returns 0, or 1 when a GPU row beats the physical floor
// (ImpossibleRows, bench/timing.hpp).
int run_mlp_bench(const MlpBenchOptions& options);

}  // namespace deepfuse::bench
