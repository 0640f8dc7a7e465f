// One-shot all-reduce for tensor parallelism inside one process: every rank's kernel reads every
// rank's bf16 buffer over NVLink peer mappings (cudaDeviceEnablePeerAccess) and sums them itself.
// One kernel, one barrier, no intermediate buffer: for decode-sized messages (up to about 1 MB) it
// beats NCCL's ring/tree, whose steps cost a few microseconds each. docs/dist.md has the protocol.
//
// Contract (the caller's part):
// - Every rank launches the same sequence of calls with the same `elements` and `ranks`: each
//   block's barrier epoch counts the calls that launched that block, on every rank alike.
// - A rank never rewrites an input buffer a peer may still be reading. Alternating two input
//   buffers between consecutive calls is enough: the kernel has only a start barrier, and a rank
//   cannot finish call k+1 (so cannot start writing the buffer of call k+2) before every peer has
//   started call k+1, which is after that peer's call k (the last reader of the buffer) finished.
// - The kernel must not be launched as a programmatic dependent (it relies on the previous
//   kernel on its stream having completed when it starts).
// - The signal areas are zeroed once at allocation and then owned by these kernels; all ranks'
//   kernels of one call run concurrently (one per GPU), so a grid never exceeds what one GPU keeps
//   resident (one_shot_max_blocks() is far below any SM count).
//
// The result is bit-identical on every rank: fp32 sum in rank order 0..ranks-1, one rounding.
// Capturable in CUDA graphs and replayable any number of times (the epochs live in device memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

constexpr int kMaxTensorParallelRanks = 8;

// Sum of every rank's bf16 buffer, read over NVLink peer mappings (cudaDeviceEnablePeerAccess in
// one process), for decode-sized messages.
struct OneShotAllReduceParams {
  // rank r's input buffer (a device pointer valid on this GPU: peer access), [elements], 16-byte aligned
  const __nv_bfloat16* inputs[kMaxTensorParallelRanks] = {};
  __nv_bfloat16* out = nullptr;  // this rank's result [elements], 16-byte aligned; must not alias any inputs[] (peers read them)
  uint32_t* signals[kMaxTensorParallelRanks] = {};  // rank r's signal area (one_shot_signal_bytes() each, zeroed once at allocation)
  int ranks = 0, rank = 0;
  size_t elements = 0;
};

// Bytes of one rank's signal area: per block, a flag from each rank and the block's own epoch.
size_t one_shot_signal_bytes();

// The most blocks one call launches (each block owns a row of the signal area).
int one_shot_max_blocks();

// Blocks a call of `elements` launches (the same on every rank): few for small messages, more to
// pull NVLink bandwidth for large ones.
int one_shot_blocks(size_t elements);

// out[i] = bf16(sum over r = 0..ranks-1 in order of float(inputs[r][i])). cudaErrorInvalidValue
// on bad arguments (ranks outside 1..8, rank outside [0, ranks), null or unaligned pointers, out
// overlapping an input); elements == 0 launches nothing.
cudaError_t launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream);

}  // namespace deepfuse::kernels
