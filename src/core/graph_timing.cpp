#include "core/graph_timing.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/cuda_event.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse {

GraphExec::~GraphExec() {
  if (exec_) cudaGraphExecDestroy(exec_);
}

GraphExec::GraphExec(GraphExec&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

GraphExec& GraphExec::operator=(GraphExec&& other) noexcept {
  if (this != &other) {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

GraphExec capture_graph(cudaStream_t stream, const std::function<bool()>& enqueue) {
  cudaGraph_t graph = nullptr;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool complete = false;
  try {
    complete = enqueue();
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    throw;
  }
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  if (!complete) {
    cudaGraphDestroy(graph);
    return {};
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DF_CHECK_CUDA(instantiated);
  return GraphExec(exec);
}

double median_replay_us_per_call(const GraphExec& graph, int calls_per_graph, int replays, cudaStream_t stream) {
  DF_CHECK(calls_per_graph >= 1 && replays >= 1, "graph timing needs at least one call and one replay");
  DF_CHECK_CUDA(cudaGraphLaunch(graph.get(), stream));  // warm-up
  std::vector<CudaEvent> events(2 * replays);
  for (int r = 0; r < replays; ++r) {
    events[2 * r].record(stream);
    DF_CHECK_CUDA(cudaGraphLaunch(graph.get(), stream));
    events[2 * r + 1].record(stream);
  }
  events.back().synchronize();
  std::vector<double> us(replays);
  for (int r = 0; r < replays; ++r) us[r] = events[2 * r + 1].ms_since(events[2 * r]) * 1e3 / calls_per_graph;
  std::nth_element(us.begin(), us.begin() + replays / 2, us.end());
  return us[replays / 2];
}

}  // namespace deepfuse
