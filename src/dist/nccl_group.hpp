// NCCL for single-process tensor parallelism: one communicator per GPU, created together by one
// thread; each rank's collectives are then enqueued by the thread that drives that GPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace deepfuse::dist {

// One NCCL communicator per GPU of a single-process tensor-parallel group.
class NcclGroup {
 public:
  // devices[r] is rank r's CUDA ordinal. ncclCommInitRankConfig per rank inside
  // ncclGroupStart/End (one thread); throws deepfuse::Error naming the cause. Disables NVLink
  // multicast (NVLS) for the process first: see nccl_group.cpp.
  explicit NcclGroup(const std::vector<int>& devices);
  ~NcclGroup();  // ncclCommDestroy, or ncclCommAbort after abort()
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // A rank failed: abort every communicator, so no peer waits forever in a collective. Safe to
  // call from any thread while other threads are blocked in NCCL; idempotent.
  void abort();

  int size() const { return static_cast<int>(comms_.size()); }
  ncclComm_t comm(int rank) const;
  int device(int rank) const { return devices_.at(rank); }

 private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};  // then comms_ are freed handles, never used again
};

// Enqueue on `stream` (CUDA-graph capturable); each called from the thread driving that rank,
// with that rank's device current. Throw deepfuse::Error on failure.
void all_reduce_sum(ncclComm_t comm, const __nv_bfloat16* send, __nv_bfloat16* recv, size_t elements,
                    cudaStream_t stream);
// recv = [rank 0's send | rank 1's send | ...], elements_per_rank each.
void all_gather(ncclComm_t comm, const float* send, float* recv, size_t elements_per_rank, cudaStream_t stream);
// recv = root's send on every rank (send is read on the root only; may equal recv).
void broadcast(ncclComm_t comm, const int32_t* send, int32_t* recv, size_t count, int root, cudaStream_t stream);

// The loaded library's version, e.g. "2.28.9".
std::string nccl_version();

}  // namespace deepfuse::dist
