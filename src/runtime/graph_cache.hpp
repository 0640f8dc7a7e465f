// One CUDA graph per decode batch bucket and variant of the step (the bucket's attention plan, and
// for short sequences the engine's short-context plan; steps with presence/frequency penalties add
// their kernel).
//
// Buckets are 1, 2, 4, ... below max_batch, and max_batch itself; a step with n running sequences
// runs the smallest bucket >= n with the surplus entries padded. A bucket's first step runs its
// ops eagerly: that initialises whatever the ops set up lazily on the host (cuBLASLt plans, kernel
// attributes) outside any capture; the same op list is then captured (global capture mode, on the
// engine's non-default stream) and every later step of that bucket is one cudaGraphLaunch.
// With graphs off, every step runs eagerly: the same launches in the same order, so the same results.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

namespace deepfuse::runtime {

// Buckets for max_batch: powers of two below it, then max_batch.
std::vector<int> decode_buckets(int max_batch);

class DecodeGraphCache {
 public:
  // plans: the variants a bucket's steps may run as, each captured as its own graph (the engine's:
  // the bucket's attention plan or its short-context one, each without or with the penalty kernel).
  DecodeGraphCache(int max_batch, bool use_graphs, int plans = 1);
  ~DecodeGraphCache();
  DecodeGraphCache(const DecodeGraphCache&) = delete;
  DecodeGraphCache& operator=(const DecodeGraphCache&) = delete;

  const std::vector<int>& buckets() const { return buckets_; }
  // Index into buckets() of the smallest bucket holding `sequences` entries.
  int bucket_index(int sequences) const;

  // Enqueues the step of bucket `index` under attention plan `plan` on `stream`: `enqueue` (the
  // ops) eagerly, or the graph.
  void run(int index, int plan, cudaStream_t stream, const std::function<void(cudaStream_t)>& enqueue);

  // The queries below are about the graph bucket `index` ran last (either plan).
  // Whether it is captured; replay() launches it once more (benchmarks).
  bool captured(int index) const;
  cudaError_t replay(int index, cudaStream_t stream) const;

  int graphs_captured() const;
  // Drops bucket `index`'s graphs (both plans): its next step runs eagerly, then captures anew
  // (the profiler changes a bucket's plan between timings).
  void reset(int index);
  // Kernel nodes in the captured graph, counted from the graph itself (library calls included: a
  // cuBLASLt split-K GEMM shows as its two kernels); 0 before capture or without graphs.
  int kernel_nodes(int index) const;

 private:
  struct Bucket {
    bool warmed_up = false;
    cudaGraphExec_t graph = nullptr;
    int kernel_nodes = 0;
  };
  void capture(Bucket& bucket, cudaStream_t stream, const std::function<void(cudaStream_t)>& enqueue);
  const Bucket& last_run(int index) const;

  bool use_graphs_;
  std::vector<int> buckets_;
  int plans_;
  std::vector<Bucket> state_;  // [bucket][plan]
  std::vector<int> last_plan_;  // [bucket]
};

}  // namespace deepfuse::runtime
