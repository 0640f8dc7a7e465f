// Building blocks shared by the streaming kernels (the fused MLP, the fused QKV projection):
// a per-thread cp.async load ring and even work splits; the cluster helpers (cluster_sync.cuh)
// come with it.
#pragma once

#include <cstdint>

#include "kernels/common/cluster_sync.cuh"
#include "kernels/common/l2_policy.cuh"

namespace deepfuse::kernels {

// The load ring. Each thread streams its own fragments through its own column of shared
// memory with cp.async (no registers held by loads in flight, no barriers: a thread reads only
// what it copied). Stage i of kSteps k-steps is one commit group; S-1 stages are in flight
// while one is consumed.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes of which only the first `bytes` are read (0, 4, 8 or 16); the rest are zero-filled.
__device__ __forceinline__ void copy16_async_prefix(void* shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(shared)), "l"(global), "r"(bytes));
}
__device__ __forceinline__ void copy16_async(void* shared, const void* global, bool valid = true) {
  copy16_async_prefix(shared, global, valid ? 16 : 0);  // src-size 0 zero-fills
}
// A weight stream's copy: evict-first in L2 (l2_policy.cuh), the policy made once per thread.
__device__ __forceinline__ void copy16_async_streamed(void* shared, const void* global, uint64_t policy,
                                                      bool valid = true) {
  copy16_async_with_policy(shared_address(shared), global, policy, valid);
}
__device__ __forceinline__ void copy8_async(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void copy4_async(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// issue(k, stage, step) starts the copies of k-step k into ring stage `stage`, position `step`.
template <int S, int Steps, typename Issue>
__device__ __forceinline__ void ring_issue_stage(int stage_index, int k_begin, int k_end, Issue issue) {
#pragma unroll
  for (int step = 0; step < Steps; ++step) {
    const int k = k_begin + stage_index * Steps + step;
    if (k < k_end) issue(k, stage_index % S, step);
  }
  commit_async();  // empty groups too: keeps the group count per stage uniform
}

template <int S, int Steps, typename Issue>
__device__ __forceinline__ void ring_prime(int k_begin, int k_end, Issue issue) {
#pragma unroll
  for (int stage = 0; stage < S - 1; ++stage) ring_issue_stage<S, Steps>(stage, k_begin, k_end, issue);
}

// After ring_prime with the same arguments: consume(k, stage, step) for every k-step in order.
// Both issue and consume see each k-step once, in increasing order, so callers may keep running
// positions (pointers, tile counters) instead of deriving them from k (the fused MLP does).
template <int S, int Steps, typename Issue, typename Consume>
__device__ __forceinline__ void ring_run(int k_begin, int k_end, Issue issue, Consume consume) {
  const int stages = (k_end - k_begin + Steps - 1) / Steps;
  for (int i = 0; i < stages; ++i) {
    ring_issue_stage<S, Steps>(i + S - 1, k_begin, k_end, issue);
    wait_async<S - 1>();  // stage i, the oldest in flight, has landed
#pragma unroll
    for (int step = 0; step < Steps; ++step) {
      const int k = k_begin + i * Steps + step;
      if (k < k_end) consume(k, i % S, step);
    }
  }
}

__device__ __forceinline__ int split_point(int total, int parts, int index) {
  return static_cast<int>(static_cast<long long>(total) * index / parts);
}
// The part that holds `index` when [0, total) is cut at split_point(total, parts, 0..parts).
__device__ __forceinline__ int split_owner(int total, int parts, int index) {
  return min(parts - 1, static_cast<int>((static_cast<long long>(index + 1) * parts + total - 1) / total) - 1);
}

}  // namespace deepfuse::kernels
