// One-shot all-reduce for tensor parallelism inside one process, PUSH-based: every rank's kernel
// writes its bf16 contribution into a receive area on every peer's GPU over NVLink peer mappings
// (cudaDeviceEnablePeerAccess), posts a flag, waits for every peer's flag and then sums the
// contributions from its own GPU's memory. One kernel, one barrier, no NVLink round trip for data:
// for decode-sized messages (up to about 1 MB) it beats NCCL's ring/tree, whose steps cost a few
// microseconds each. docs/dist.md has the protocol.
//
// Contract (the caller's part):
// - Every rank launches the same sequence of calls with the same `elements` and `ranks`: each
//   block's barrier epoch counts the calls that launched that block, on every rank alike, and
//   block b of every rank pushes and sums the same chunk of elements.
// - A rank never rewrites its input, nor pushes into a peer's receive area, while that area may
//   still be read. Alternating two slots (each with its own input and receive areas) between
//   consecutive calls is enough: a rank cannot finish call k+1 (so cannot start call k+2, which
//   writes the slot of call k) before every peer has started call k+1, which is after that peer's
//   call k (the last reader of that slot's receive area) finished.
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

// Sum of every rank's bf16 contribution, pushed over NVLink peer mappings (cudaDeviceEnablePeerAccess
// in one process) into receive areas on every GPU, for decode-sized messages. All pointers are
// device pointers valid on this rank's GPU (peer access), 16-byte aligned.
struct OneShotAllReduceParams {
  // This rank's contribution [elements], on this rank's GPU; only this rank's kernel reads it.
  const __nv_bfloat16* own_input = nullptr;
  // receive[q]: rank q's receive area for this call's slot, on q's GPU: `ranks` regions of
  // receive_stride elements, region s written by rank s's kernel (rank q's own region is unused).
  // This rank pushes into receive[q] + rank * receive_stride for every peer q and sums from
  // receive[rank] + s * receive_stride.
  __nv_bfloat16* receive[kMaxTensorParallelRanks] = {};
  size_t receive_stride = 0;  // elements; >= elements and a multiple of 8 (keeps every region 16-byte aligned)
  __nv_bfloat16* out = nullptr;  // this rank's result [elements]; must not alias own_input or any receive area
  uint32_t* signals[kMaxTensorParallelRanks] = {};  // rank r's signal area (one_shot_signal_bytes() each, zeroed once at allocation)
  int ranks = 0, rank = 0;
  size_t elements = 0;
};

// Bytes of one rank's signal area: per block, a flag from each rank and the block's own epoch.
size_t one_shot_signal_bytes();

// The most blocks one call launches (each block owns a row of the signal area).
int one_shot_max_blocks();

// Blocks a call of `elements` launches (the same on every rank): few for small messages, more to
// push over NVLink at full bandwidth for large ones.
int one_shot_blocks(size_t elements);

// out[i] = bf16(sum over r = 0..ranks-1 in order of float(rank r's own_input[i])).
// cudaErrorInvalidValue on bad arguments (ranks outside 1..8, rank outside [0, ranks), null or
// unaligned pointers, receive_stride below elements or not a multiple of 8, out overlapping
// own_input or a receive area, own_input overlapping a receive area); elements == 0 launches nothing.
cudaError_t launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream);

}  // namespace deepfuse::kernels
