// How a model splits over tensor-parallel ranks (the Deep Kernel Fusion paper's layout, Megatron's
// before it): each rank holds a slice of every block so that a block needs one sum after
// attention and one after the MLP.
//   attention  query heads split evenly; key/value heads split with them, or replicated when
//              there are fewer than ranks (each rank keeps the one its query heads read);
//              QKV (and its bias) column-split by heads, o_proj row-split (its input columns).
//   MLP        intermediate split: gate/up rows, down columns; the fused MLP runs on I/tp.
//   vocabulary lm_head rows split in slices of ceil(V/tp) (the last padded with zero rows); the
//              embedding table is replicated (a step gathers a few of its rows).
// A rank's model is then an ordinary ModelConfig (rank_config) with fewer heads and a narrower
// MLP, so every kernel and plan of the one-GPU engine serves it unchanged.
#pragma once

#include <string>

#include "deepfuse/model_config.hpp"

namespace deepfuse::dist {

struct RankShard {
  int rank = 0;
  int ranks = 1;
  int q_head_begin = 0, q_heads = 0;        // this rank's query heads
  int kv_head_begin = 0, kv_heads = 0;      // the key/value heads they read
  int intermediate_begin = 0, intermediate = 0;
  int vocab_begin = 0;                       // first lm_head row of this rank's slice
  int vocab_rows = 0;                        // ceil(V / ranks): every rank's slice, padded
  int vocab_real = 0;                        // rows of the slice inside the vocabulary (the rest are zero)

  bool split() const { return ranks > 1; }
};

// Why `config` cannot be split over `ranks` (heads, key/value heads or the MLP width not
// divisible as the layout needs), or empty when it can.
std::string why_not_splittable(const ModelConfig& config, int ranks);

// Rank `rank`'s slice; throws deepfuse::Error with why_not_splittable's reason.
RankShard shard_of(const ModelConfig& config, int rank, int ranks);

// The model one rank runs: its heads, key/value heads and intermediate size (vocabulary, hidden
// size and everything else as the whole model's).
ModelConfig rank_config(const ModelConfig& config, const RankShard& shard);

}  // namespace deepfuse::dist
