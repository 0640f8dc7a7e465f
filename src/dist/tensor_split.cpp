#include "dist/tensor_split.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse::dist {

namespace {

// The MLP kernels' tile: a rank's intermediate slice must stay a multiple of it.
constexpr int kMlpTile = 64;

std::string str(int value) { return std::to_string(value); }

struct Range {
  size_t begin, count;
};

// The part of an axis of `extent` that `s` holds.
Range rank_range(Extent extent, const ModelConfig& c, const RankShard& s) {
  const size_t head_dim = static_cast<size_t>(c.head_dim);
  switch (extent) {
    case Extent::q: return {s.q_head_begin * head_dim, s.q_heads * head_dim};
    case Extent::kv: return {s.kv_head_begin * head_dim, s.kv_heads * head_dim};
    case Extent::intermediate: return {static_cast<size_t>(s.intermediate_begin), static_cast<size_t>(s.intermediate)};
    case Extent::vocab: return {static_cast<size_t>(s.vocab_begin), static_cast<size_t>(s.vocab_real)};
    case Extent::none:
    case Extent::hidden: break;
  }
  throw Error("internal: the model table splits an axis that is never split");
}

// Whether the rectangle `w` starts and ends on the edges of `side` x `side` blocks.
bool whole_blocks(const TensorSlice& w, size_t side) {
  return w.row_begin % side == 0 && w.rows % side == 0 && w.column_begin % side == 0 && w.columns % side == 0;
}

}  // namespace

TensorSlice slice_of(const TensorSpec& spec, const ModelConfig& model, const RankShard& shard) {
  const size_t rows = static_cast<size_t>(extent_size(spec.rows, model));
  const size_t columns = static_cast<size_t>(extent_size(spec.columns, model));
  TensorSlice slice{0, rows, 0, columns, columns, rows};
  if (!shard.split() || spec.split == TensorSplit::replicated) return slice;
  if (spec.split == TensorSplit::rows) {
    const Range r = rank_range(spec.rows, model, shard);
    slice.row_begin = r.begin, slice.rows = r.count;
  } else {
    const Range r = rank_range(spec.columns, model, shard);
    slice.column_begin = r.begin, slice.columns = r.count;
  }
  return slice;
}

TensorSlice scale_slice_of(const TensorSlice& weight, WeightFormat format) {
  const ScaleShape whole = scale_shape(format, weight.tensor_rows, weight.row_length);
  switch (format_info(format).scales) {
    case ScaleGranularity::none: return {};
    case ScaleGranularity::channel: return {weight.row_begin, weight.rows, 0, 1, 1, whole.rows};
    case ScaleGranularity::block: break;
  }
  const size_t side = static_cast<size_t>(format_info(format).scale_block);
  DF_CHECK(whole_blocks(weight, side),
           "a weight slice of " + std::to_string(weight.rows) + "x" + std::to_string(weight.columns) + " at (" +
               std::to_string(weight.row_begin) + ", " + std::to_string(weight.column_begin) + ") is not whole " +
               str(static_cast<int>(side)) + "x" + str(static_cast<int>(side)) + " scale blocks");
  return {weight.row_begin / side, weight.rows / side, weight.column_begin / side, weight.columns / side, whole.columns,
          whole.rows};
}

TensorSlice scale_slice_of(const TensorSpec& spec, WeightFormat format, const ModelConfig& model,
                           const RankShard& shard) {
  const TensorSlice weight = slice_of(spec, model, shard);
  const size_t side = static_cast<size_t>(std::max(format_info(format).scale_block, 1));
  DF_CHECK(whole_blocks(weight, side),
           std::string(spec.name) + ": rank " + str(shard.rank) + "'s slice is not whole " + str(static_cast<int>(side)) +
               "x" + str(static_cast<int>(side)) + " scale blocks (--tp " + str(shard.ranks) + ")");
  return scale_slice_of(weight, format);
}

std::string why_not_splittable(const ModelConfig& c, int ranks) {
  const std::string tp = " (--tp " + str(ranks) + ")";
  if (ranks < 1) return "--tp is " + str(ranks) + "; it must be at least 1";
  if (ranks == 1) return "";
  if (c.num_attention_heads % ranks != 0)
    return "num_attention_heads " + str(c.num_attention_heads) + " is not divisible by " + str(ranks) + tp;
  const int kv = c.num_key_value_heads;
  if (kv >= ranks ? kv % ranks != 0 : ranks % kv != 0)
    return "num_key_value_heads " + str(kv) + " and " + str(ranks) +
           " ranks: one must divide the other (key/value heads are split, or replicated when fewer)" + tp;
  if (c.intermediate_size % (ranks * kMlpTile) != 0)
    return "intermediate_size " + str(c.intermediate_size) + " does not split into " + str(ranks) +
           " slices that are multiples of " + str(kMlpTile) + " (the MLP kernels' tile)" + tp;
  return "";
}

RankShard shard_of(const ModelConfig& c, int rank, int ranks) {
  if (const std::string why = why_not_splittable(c, ranks); !why.empty()) throw Error("cannot split the model: " + why);
  DF_CHECK(rank >= 0 && rank < ranks, "rank " + str(rank) + " outside 0.." + str(ranks - 1));
  RankShard s;
  s.rank = rank;
  s.ranks = ranks;
  s.q_heads = c.num_attention_heads / ranks;
  s.q_head_begin = rank * s.q_heads;
  const int kv = c.num_key_value_heads;
  if (kv >= ranks) {
    s.kv_heads = kv / ranks;
    s.kv_head_begin = rank * s.kv_heads;
  } else {
    // ranks / kv ranks share each key/value head: the one this rank's query heads belong to.
    s.kv_heads = 1;
    s.kv_head_begin = s.q_head_begin / (c.num_attention_heads / kv);
  }
  s.intermediate = c.intermediate_size / ranks;
  s.intermediate_begin = rank * s.intermediate;
  s.vocab_rows = (c.vocab_size + ranks - 1) / ranks;
  s.vocab_begin = rank * s.vocab_rows;
  s.vocab_real = std::max(0, std::min(s.vocab_rows, c.vocab_size - s.vocab_begin));
  return s;
}

ModelConfig rank_config(const ModelConfig& config, const RankShard& shard) {
  ModelConfig c = config;
  if (!shard.split()) return c;
  c.num_attention_heads = shard.q_heads;
  c.num_key_value_heads = shard.kv_heads;
  c.intermediate_size = shard.intermediate;
  return c;
}

}  // namespace deepfuse::dist
