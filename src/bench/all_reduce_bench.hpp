// `deepfuse bench allreduce`: tensor-parallel all-reduce of decode-sized messages (tokens x hidden
// bf16) across --tp GPUs of this host, NCCL against the one-shot peer-to-peer kernel, each timed
// per call inside CUDA graphs that every rank's thread replays concurrently.
#pragma once

#include <string>
#include <vector>

namespace deepfuse::bench {

struct AllReduceBenchOptions {
  int tp = 2;                 // GPUs 0..tp-1
  std::vector<int> hiddens;   // default: 4096, 8192
  std::vector<int> tokens;    // default: 1, 2, 4, ..., 64
  int calls_per_graph = 100;  // all-reduces captured back to back in one graph
  int replays = 20;           // timed replays per case (median)
  std::string json_path;      // empty: no JSON
};

std::vector<int> default_all_reduce_bench_hiddens();
std::vector<int> default_all_reduce_bench_tokens();

// Prints the table (µs per call for both, and NCCL / one-shot); returns 0. Fewer GPUs than --tp,
// no peer access, or bad sizes: deepfuse::Error.
int run_all_reduce_bench(const AllReduceBenchOptions& options);

}  // namespace deepfuse::bench
