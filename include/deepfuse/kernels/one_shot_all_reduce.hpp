// One-shot all-reduce for tensor parallelism inside one process, PUSH-based: every rank's kernel
// writes its bf16 contribution into a receive area on every peer's GPU over NVLink peer mappings
// (cudaDeviceEnablePeerAccess) and sums the contributions from its own GPU's memory once they are
// there. One kernel, no NVLink round trip for data: for decode-sized messages (up to about 1 MB)
// it beats NCCL's ring/tree, whose steps cost a few microseconds each. Two protocols tell a reader
// that the data arrived (docs/dist.md):
// - flag_after_data: the pushes, one system-scope fence, then a flag per (block, peer);
// - flags_in_data: every 8-byte word pushed carries the call's epoch beside 4 bytes of data, so
//   neither a fence nor a flag is waited for, at twice the bytes (the faster for small messages).
//
// Contract (the caller's part):
// - Every rank launches the same sequence of calls with the same `elements`, `ranks` and
//   `protocol`: the epochs (per block for flag_after_data, per call for flags_in_data) count calls
//   on every rank alike, and block b of every rank pushes and sums the same chunk of elements.
// - A rank never rewrites its input, nor pushes into a peer's receive area, while that area may
//   still be read. Alternating two slots (each with its own input and receive areas) between
//   consecutive calls is enough: a rank cannot finish call k+1 (so cannot start call k+2, which
//   writes the slot of call k) before every peer has started call k+1, which is after that peer's
//   call k (the last reader of that slot's receive area) finished.
// - The kernel launches as a programmatic dependent: it may be scheduled while the kernel before
//   it on the stream finishes, and reads nothing before that kernel completed; the kernel after
//   it may be scheduled early too and must wait for this grid (griddepcontrol.wait) before reading
//   `out`, as every programmatic kernel here does.
// - The signal and receive areas are zeroed once at allocation (a line holding garbage could look
//   like this call's) and then owned by these kernels. All ranks' kernels of one call run
//   concurrently (one per GPU), so a grid never exceeds what one GPU keeps resident
//   (one_shot_max_blocks() is far below any SM count).
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

enum class OneShotProtocol {
  automatic,        // flags_in_data up to a message size measured per rank count (where line areas are given), else flag_after_data
  flag_after_data,  // data into `receive`, fence, flag
  flags_in_data,    // lines of {data, epoch, data, epoch} into `lines`
};

// Sum of every rank's bf16 contribution, pushed over NVLink peer mappings (cudaDeviceEnablePeerAccess
// in one process) into areas on every GPU, for decode-sized messages. All pointers are device
// pointers valid on this rank's GPU (peer access), 16-byte aligned. Each protocol has its own
// areas: a flag_after_data call leaves raw data that a later flags_in_data call on shared bytes
// could take for lines.
struct OneShotAllReduceParams {
  // This rank's contribution [elements], on this rank's GPU; only this rank's kernel reads it.
  const __nv_bfloat16* own_input = nullptr;
  // flag_after_data. receive[q]: rank q's receive area for this call's slot, on q's GPU: `ranks`
  // regions of receive_stride elements, region s written by rank s's kernel (rank q's own region
  // is unused). This rank pushes into receive[q] + rank * receive_stride for every peer q and sums
  // from receive[rank] + s * receive_stride. receive_stride: at least `elements`, a multiple of 8.
  __nv_bfloat16* receive[kMaxTensorParallelRanks] = {};
  size_t receive_stride = 0;
  // flags_in_data. lines[q]: rank q's line area for this call's slot, regions of line_stride
  // 16-byte lines laid out as `receive` is; line_stride at least one_shot_lines(elements).
  uint4* lines[kMaxTensorParallelRanks] = {};
  size_t line_stride = 0;
  __nv_bfloat16* out = nullptr;  // this rank's result [elements]; must not alias own_input or any area above
  uint32_t* signals[kMaxTensorParallelRanks] = {};  // rank r's signal area (one_shot_signal_bytes() each)
  int ranks = 0, rank = 0;
  size_t elements = 0;
  OneShotProtocol protocol = OneShotProtocol::automatic;
};

// Bytes of one rank's signal area: per block, a flag from each rank and the block's own epoch
// (flag_after_data); the epoch of the last call and a count of finished blocks (flags_in_data).
size_t one_shot_signal_bytes();

// Lines of a region that flags_in_data fills for a message of `elements`: two per 8 elements
// (16 bytes of data), a started group of 8 counting whole. Twice the message's bytes.
size_t one_shot_lines(size_t elements);

// The most blocks one call launches (each block owns a row of the signal area).
int one_shot_max_blocks();

// What automatic runs for a message of `elements` among `ranks` where line areas hold it.
OneShotProtocol one_shot_automatic_protocol(size_t elements, int ranks);

// Blocks a call of `elements` launches with `protocol` (flag_after_data or flags_in_data; the same
// on every rank): few for small messages, more to push over NVLink at full bandwidth for large ones.
int one_shot_blocks(size_t elements, OneShotProtocol protocol);

// out[i] = bf16(sum over r = 0..ranks-1 in order of float(rank r's own_input[i])).
// cudaErrorInvalidValue on bad arguments (ranks outside 1..8, rank outside [0, ranks), null or
// unaligned pointers, the protocol's areas missing or their regions too short, receive_stride
// not a multiple of 8, out overlapping own_input or an area the call uses, own_input overlapping
// such an area); elements == 0 launches nothing.
cudaError_t launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream);

}  // namespace deepfuse::kernels
