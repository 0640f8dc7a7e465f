// `deepfuse bench attention`: split-KV paged decode attention over (batch, context) cases, each as
// a fraction of the copy bandwidth measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace deepfuse::bench {

struct AttentionBenchCase {
  int batch = 1;
  int context = 0;  // keys per sequence (every sequence of the batch has this length)
};

struct AttentionBenchOptions {
  std::vector<AttentionBenchCase> cases;
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int repetitions = 100;
  int warmup = 10;
  int splits = 0;            // > 0: force the split count (compare plans); 0: the plan's choice
  int warps = 0;             // 4 or 8: force the warps per block; 0: the plan's choice
  std::string merge = "auto";  // "workspace" or "cluster": force where splits merge; "auto": the plan's choice
  double l2_multiple = 4.0;  // KV copies rotated per call cover at least this many L2s
  std::string json_path;     // empty: no JSON
  std::string trace_path;    // per-block timelines of a few calls per case (a -DDEEPFUSE_TRACE=ON build)
};

// 1x8k, 1x32k, 8x32k, 32x8k: one long sequence, a batch of long ones, many shorter ones.
std::vector<AttentionBenchCase> default_attention_bench_cases();

// "8x32768" (or "8x32k") -> {8, 32768}; throws deepfuse::Error naming the text otherwise.
AttentionBenchCase parse_attention_bench_case(const std::string& text);

// Runs on the GPU when one is present, otherwise times the CPU reference (rows say which).
// Prints the table to stdout; returns 0, or 1 when a GPU row beats the physical floor
// (ImpossibleRows, bench/timing.hpp).
int run_attention_bench(const AttentionBenchOptions& options);

}  // namespace deepfuse::bench
