// `deepfuse bench qkv`: the attention block's two projections for decode, fused against the
// unfused path, as a fraction of the copy bandwidth measured in the same run: the front half
// (input RMSNorm + QKV + RoPE + KV append in one launch vs rms_norm, cuBLASLt GEMM and
// rope_kv_append) and the output projection with the residual (cluster GEMV vs cuBLASLt).
#pragma once

#include <string>
#include <vector>

namespace deepfuse::bench {

struct QkvBenchShape {
  std::string name;
  int hidden, q_heads, kv_heads, head_dim;
  bool bias;
  int intermediate;  // the MLP's, for its projections' rows
  size_t weight_bytes() const {
    return static_cast<size_t>(q_heads + 2 * kv_heads) * head_dim * hidden * 2;
  }
};

struct QkvBenchOptions {
  std::vector<QkvBenchShape> shapes;
  std::vector<int> token_counts{1, 8, 16, 32};
  int repetitions = 100;
  int warmup = 10;
  double l2_multiple = 4.0;
  std::string json_path;
};

// Llama-3-8B, Llama-3.2-1B, Qwen2.5-7B, Llama-3-70B at TP8.
std::vector<QkvBenchShape> default_qkv_bench_shapes();

// Needs a CUDA device. Prints the table; returns 0, or 1 when a row beats the physical floor
// (ImpossibleRows, bench/timing.hpp).
int run_qkv_bench(const QkvBenchOptions& options);

}  // namespace deepfuse::bench
