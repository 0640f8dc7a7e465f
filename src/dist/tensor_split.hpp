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

#include <cstddef>
#include <string>

#include "deepfuse/model_config.hpp"
#include "deepfuse/model_tensors.hpp"

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

// A rectangle of a row-major tensor (a vector is one column wide): what one rank holds of it.
struct TensorSlice {
  size_t row_begin = 0, rows = 0;
  size_t column_begin = 0, columns = 0;
  size_t row_length = 0;   // the whole tensor's columns
  size_t tensor_rows = 0;  // the whole tensor's rows

  size_t elements() const { return rows * columns; }
  bool whole() const { return rows == tensor_rows && columns == row_length; }
};

// The slice of `spec` (a row of the model table) that `shard`'s rank holds, by the table's
// TensorSplit: the whole tensor when replicated or for one GPU. `model` is the whole model's
// config. lm_head: the rows of the rank's slice inside the vocabulary (vocab_real; the device
// pads them to vocab_rows with zeros).
TensorSlice slice_of(const TensorSpec& spec, const ModelConfig& model, const RankShard& shard);

// The slice of a linear weight's fp32 scales (scale_shape(format, ...), row-major) that goes with
// the rank's slice of the weight: per channel, the slice's rows (a column-split weight such as
// o_proj keeps every row's scale); per 128x128 block, the blocks the slice covers. Throws
// deepfuse::Error naming the tensor when the slice is not whole blocks; empty for bf16.
TensorSlice scale_slice_of(const TensorSpec& spec, WeightFormat format, const ModelConfig& model,
                           const RankShard& shard);
// The same for any rectangle `weight` of a tensor (its tensor_rows and row_length the whole
// tensor's); throws deepfuse::Error when it is not whole blocks.
TensorSlice scale_slice_of(const TensorSlice& weight, WeightFormat format);

// The model one rank runs: its heads, key/value heads and intermediate size (vocabulary, hidden
// size and everything else as the whole model's).
ModelConfig rank_config(const ModelConfig& config, const RankShard& shard);

}  // namespace deepfuse::dist
