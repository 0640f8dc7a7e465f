// `deepfuse bench sampling`: the GPU sampler (kernels/sampling) per vocabulary, batch and
// sampling mode, per call in a CUDA graph as the decode step runs it and launched one by one.
#pragma once

#include <string>
#include <vector>

namespace deepfuse::bench {

struct SamplingBenchOptions {
  std::vector<int> vocabs;       // default: 128256 (Llama 3), 152064 (Qwen2.5)
  std::vector<int> batches;      // default: 1, 8, 32
  std::vector<std::string> modes;  // names from sampling_bench_modes(); default: all
  int cluster_size = 0;  // 0: the launcher's choice; 1, 4, 8, 16: forced (compare choices)
  int repetitions = 200;
  int warmup = 20;
  std::string json_path;  // empty: no JSON
};

// The named parameter sets: greedy, temperature, top-k, top-p, top-k+top-p, min-p.
std::vector<std::string> sampling_bench_modes();

// Runs on the GPU when one is present, otherwise times the CPU reference (rows say which).
// Prints the table to stdout; returns 0, or 1 when a GPU row beats the physical floor
// (ImpossibleRows, bench/timing.hpp). Unknown modes or non-positive sizes: deepfuse::Error.
int run_sampling_bench(const SamplingBenchOptions& options);

}  // namespace deepfuse::bench
