// What one tensor-parallel rank's forward pass needs to reach the others (docs/dist.md): its
// slice of the model, its NCCL communicator, and the two partial-sum buffers the all-reduces read
// (peer-visible for the one-shot all-reduce when the GPUs can map each other's memory).
#pragma once

#include <cuda_bf16.h>
#include <nccl.h>

#include "dist/peer_exchange.hpp"
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

struct RankLink {
  dist::RankShard shard;
  ncclComm_t comm = nullptr;
  // Null where peer access is unavailable: every all-reduce is NCCL's.
  const dist::OneShotBuffers* one_shot = nullptr;
  // [max_tokens, hidden] each: partial[0] takes the attention block's o_proj, partial[1] the MLP's
  // down projection. Alternating them is what lets the one-shot all-reduce skip an end barrier.
  __nv_bfloat16* partial[2] = {nullptr, nullptr};
};

}  // namespace deepfuse::runtime
