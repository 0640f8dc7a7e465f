#include "runtime/graph_cache.hpp"

#include <string>
#include <vector>

#include "deepfuse/error.hpp"

namespace deepfuse::runtime {

namespace {

// Kernel nodes of `graph` into `kernels`; an error code instead of a throw, so the caller can
// still destroy the graph.
cudaError_t count_kernel_nodes(cudaGraph_t graph, int& kernels) {
  size_t count = 0;
  if (cudaError_t e = cudaGraphGetNodes(graph, nullptr, &count); e != cudaSuccess) return e;
  std::vector<cudaGraphNode_t> nodes(count);
  if (cudaError_t e = cudaGraphGetNodes(graph, nodes.data(), &count); e != cudaSuccess) return e;
  kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaError_t e = cudaGraphNodeGetType(node, &type); e != cudaSuccess) return e;
    if (type == cudaGraphNodeTypeKernel) ++kernels;
  }
  return cudaSuccess;
}

}  // namespace

std::vector<int> decode_buckets(int max_batch) {
  DF_CHECK(max_batch >= 1, "max_batch must be at least 1 (got " + std::to_string(max_batch) + ")");
  std::vector<int> buckets;
  for (int size = 1; size < max_batch; size *= 2) buckets.push_back(size);
  buckets.push_back(max_batch);
  return buckets;
}

DecodeGraphCache::DecodeGraphCache(int max_batch, bool use_graphs, int plans)
    : use_graphs_(use_graphs),
      buckets_(decode_buckets(max_batch)),
      plans_(plans),
      state_(buckets_.size() * plans),
      last_plan_(buckets_.size(), 0) {
  DF_CHECK(plans >= 1, "a decode graph cache needs at least one plan per bucket (got " + std::to_string(plans) + ")");
}

DecodeGraphCache::~DecodeGraphCache() {
  for (Bucket& bucket : state_)
    if (bucket.graph) cudaGraphExecDestroy(bucket.graph);
}

int DecodeGraphCache::bucket_index(int sequences) const {
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i] >= sequences) return static_cast<int>(i);
  throw Error("decode step of " + std::to_string(sequences) + " sequences exceeds max_batch " +
              std::to_string(buckets_.back()));
}

void DecodeGraphCache::capture(Bucket& bucket, cudaStream_t stream,
                               const std::function<void(cudaStream_t)>& enqueue) {
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue(stream);
  } catch (...) {
    // Leave the stream usable: end (and drop) the half-made capture before reporting.
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    throw;
  }
  cudaGraph_t graph = nullptr;
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaError_t status = cudaGraphInstantiate(&bucket.graph, graph, 0);
  if (status == cudaSuccess) status = count_kernel_nodes(graph, bucket.kernel_nodes);
  cudaGraphDestroy(graph);
  DF_CHECK_CUDA(status);
}

void DecodeGraphCache::run(int index, int plan, cudaStream_t stream,
                           const std::function<void(cudaStream_t)>& enqueue) {
  DF_CHECK(index >= 0 && index < static_cast<int>(buckets_.size()), "no decode bucket " + std::to_string(index));
  DF_CHECK(plan >= 0 && plan < plans_, "no attention plan " + std::to_string(plan) + " for a decode graph");
  Bucket& bucket = state_[index * plans_ + plan];
  last_plan_[index] = plan;
  if (!use_graphs_ || !bucket.warmed_up) {
    enqueue(stream);
    if (!use_graphs_) return;
    capture(bucket, stream, enqueue);  // records only: nothing runs twice
    bucket.warmed_up = true;
    return;
  }
  DF_CHECK_CUDA(cudaGraphLaunch(bucket.graph, stream));
}

const DecodeGraphCache::Bucket& DecodeGraphCache::last_run(int index) const {
  return state_[index * plans_ + last_plan_[index]];
}

bool DecodeGraphCache::captured(int index) const {
  return index >= 0 && index < static_cast<int>(buckets_.size()) && last_run(index).graph != nullptr;
}

cudaError_t DecodeGraphCache::replay(int index, cudaStream_t stream) const {
  return captured(index) ? cudaGraphLaunch(last_run(index).graph, stream) : cudaErrorInvalidValue;
}

int DecodeGraphCache::kernel_nodes(int index) const {
  DF_CHECK(index >= 0 && index < static_cast<int>(buckets_.size()), "no decode bucket " + std::to_string(index));
  return last_run(index).kernel_nodes;
}

void DecodeGraphCache::reset(int index) {
  for (int plan = 0; plan < plans_; ++plan) {
    Bucket& bucket = state_[index * plans_ + plan];
    if (bucket.graph) cudaGraphExecDestroy(bucket.graph);
    bucket = Bucket{};
  }
}

int DecodeGraphCache::graphs_captured() const {
  int count = 0;
  for (const Bucket& bucket : state_) count += bucket.graph ? 1 : 0;
  return count;
}

}  // namespace deepfuse::runtime
