// Where a kernel's epilogue sums its output over the tensor-parallel ranks itself, with no
// all-reduce kernel of its own: the fused MLP's finish (swiglu_fused.hpp; its start sums its input
// the same way, SwigluFusedParams::x_exchange, on the other slot). Each thread that
// finishes four consecutive output values pushes them to every peer as one line of the one-shot
// all-reduce's flags_in_data protocol (one_shot_all_reduce.hpp), waits for the peers' lines of the
// same four values and stores their sum in rank order, rounded once: the same result, bit for bit,
// as writing the partial and running the one-shot all-reduce.
//
// The buffers and the contract are the one-shot all-reduce's (dist::OneShotBuffers, the line
// areas of one slot, the signal area's epoch words): consecutive exchanges alternate slots, and
// every rank runs the same sequence of exchanges, one-shot calls included (they share the epoch).
// The blocks that exchange must be resident at once on every rank (each waits on the peers' blocks
// that finish the same values).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "deepfuse/kernels/one_shot_all_reduce.hpp"

namespace deepfuse::kernels {

struct LineExchange {
  // lines[q]: rank q's line area of the slot, on q's GPU: `ranks` regions of line_stride lines,
  // region s written by rank s; line i of a region holds output values 4i..4i+3.
  uint4* lines[kMaxTensorParallelRanks] = {};
  size_t line_stride = 0;
  uint32_t* signals = nullptr;  // this rank's signal area (its epoch words)
  int ranks = 0, rank = 0;

  __host__ __device__ bool active() const { return ranks > 1; }
  // Whether a call of `elements` outputs fits: every pointer set and the regions long enough.
  bool holds(size_t elements) const {
    if (ranks < 2 || ranks > kMaxTensorParallelRanks || rank < 0 || rank >= ranks || !signals) return false;
    if (line_stride < (elements + 3) / 4) return false;
    for (int r = 0; r < ranks; ++r)
      if (!lines[r]) return false;
    return true;
  }
};

}  // namespace deepfuse::kernels
