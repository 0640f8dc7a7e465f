// CUDA-graph timing shared by the benchmarks, the cuBLASLt tuner and the tensor-parallel engine's
// all-reduce choice: calls captured into one graph and the graph replayed, so the calls run back to
// back as in the engine's captured decode step, without host launch gaps.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace deepfuse {

// An instantiated CUDA graph, destroyed with the object.
class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  ~GraphExec();
  GraphExec(GraphExec&& other) noexcept;
  GraphExec& operator=(GraphExec&& other) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  cudaGraphExec_t get() const { return exec_; }
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// What enqueue() puts on `stream`, captured (thread-local mode: other threads may capture at the
// same time) and instantiated; empty (nothing instantiated) where enqueue returns false, as a
// caller whose call was refused during the capture does. When enqueue throws, the capture is ended
// and the error rethrown, so the stream stays usable.
GraphExec capture_graph(cudaStream_t stream, const std::function<bool()>& enqueue);

// Median device time in microseconds per call of a graph holding `calls_per_graph` calls: one
// replay to warm up, then `replays` replays back to back, an event pair around each.
double median_replay_us_per_call(const GraphExec& graph, int calls_per_graph, int replays, cudaStream_t stream);

}  // namespace deepfuse
