// How models split over tensor-parallel ranks (dist/tensor_split.hpp), and the per-GPU weight
// bytes of a rank's slice.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_tensors.hpp"
#include "dist/tensor_split.hpp"
#include "model/model_test_util.hpp"
#include "runtime/gpu_weights.hpp"

namespace deepfuse {
namespace {

TEST(TensorSplit, Llama3_70bOverFourRanks) {
  const ModelConfig c = random_arch_config("llama3-70b");
  for (int r = 0; r < 4; ++r) {
    const dist::RankShard s = dist::shard_of(c, r, 4);
    EXPECT_EQ(s.q_heads, 16);
    EXPECT_EQ(s.q_head_begin, 16 * r);
    EXPECT_EQ(s.kv_heads, 2);
    EXPECT_EQ(s.kv_head_begin, 2 * r);
    EXPECT_EQ(s.intermediate, 7168);
    EXPECT_EQ(s.intermediate_begin, 7168 * r);
    EXPECT_EQ(s.vocab_rows, 32064);
    EXPECT_EQ(s.vocab_real, 32064);
    const ModelConfig local = dist::rank_config(c, s);
    EXPECT_EQ(local.num_attention_heads, 16);
    EXPECT_EQ(local.num_key_value_heads, 2);
    EXPECT_EQ(local.intermediate_size, 7168);
    EXPECT_EQ(local.hidden_size, c.hidden_size);
    EXPECT_EQ(local.vocab_size, c.vocab_size);
    EXPECT_EQ(local.head_dim, c.head_dim);
  }
}

// Issue 41's layout (not run: no 8-GPU machine yet): one key/value head per rank.
TEST(TensorSplit, Llama3_70bOverEightRanks) {
  const ModelConfig c = random_arch_config("llama3-70b");
  int vocab = 0;
  for (int r = 0; r < 8; ++r) {
    const dist::RankShard s = dist::shard_of(c, r, 8);
    EXPECT_EQ(s.q_heads, 8);
    EXPECT_EQ(s.kv_heads, 1);
    EXPECT_EQ(s.kv_head_begin, r);
    EXPECT_EQ(s.intermediate, 3584);
    vocab += s.vocab_real;
  }
  EXPECT_EQ(vocab, c.vocab_size);
  EXPECT_TRUE(dist::why_not_splittable(c, 8).empty());
}

TEST(TensorSplit, FewerKeyValueHeadsThanRanksAreReplicated) {
  ModelConfig c = random_arch_config("qwen2.5-7b");  // 28 query heads, 4 key/value heads
  c.num_key_value_heads = 2;
  for (int r = 0; r < 4; ++r) {
    const dist::RankShard s = dist::shard_of(c, r, 4);
    EXPECT_EQ(s.q_heads, 7);
    EXPECT_EQ(s.kv_heads, 1);
    // Query heads 0-13 read key/value head 0, 14-27 head 1.
    EXPECT_EQ(s.kv_head_begin, r < 2 ? 0 : 1) << "rank " << r;
  }
}

TEST(TensorSplit, VocabularyNotDivisibleIsPaddedOnTheLastRank) {
  ModelConfig c = random_arch_config("llama3-8b");
  c.vocab_size = 1001;
  const dist::RankShard last = dist::shard_of(c, 3, 4);
  EXPECT_EQ(last.vocab_rows, 251);
  EXPECT_EQ(last.vocab_begin, 753);
  EXPECT_EQ(last.vocab_real, 248);
  int covered = 0;
  for (int r = 0; r < 4; ++r) covered += dist::shard_of(c, r, 4).vocab_real;
  EXPECT_EQ(covered, 1001);
}

TEST(TensorSplit, OneRankIsTheWholeModel) {
  const ModelConfig c = random_arch_config("llama3-8b");
  const dist::RankShard s = dist::shard_of(c, 0, 1);
  EXPECT_FALSE(s.split());
  EXPECT_EQ(dist::rank_config(c, s).num_attention_heads, c.num_attention_heads);
}

TEST(TensorSplit, ShapesThatCannotSplitAreNamed) {
  const ModelConfig qwen = random_arch_config("qwen2.5-7b");  // 28 heads
  const std::string heads = dist::why_not_splittable(qwen, 8);
  EXPECT_NE(heads.find("num_attention_heads 28 is not divisible by 8"), std::string::npos) << heads;
  ModelConfig odd_kv = random_arch_config("llama3-8b");
  odd_kv.num_key_value_heads = 8;
  odd_kv.num_attention_heads = 24;
  EXPECT_NE(dist::why_not_splittable(odd_kv, 3).find("num_key_value_heads 8"), std::string::npos);
  ModelConfig narrow = random_arch_config("llama3-8b");
  narrow.intermediate_size = 64 * 6;  // 6 tiles do not split into 4 slices of whole tiles
  EXPECT_NE(dist::why_not_splittable(narrow, 4).find("intermediate_size 384"), std::string::npos);
  EXPECT_THROW(dist::shard_of(qwen, 0, 8), Error);
  EXPECT_TRUE(dist::why_not_splittable(qwen, 4).empty());
  EXPECT_TRUE(dist::why_not_splittable(qwen, 2).empty());
}

// Per GPU: the layers' slices, the replicated embedding and the lm_head slice.
TEST(TensorSplit, WeightBytesOfARank) {
  const ModelConfig c = random_arch_config("llama3-70b");
  const runtime::WeightLayouts one{.mlp_fused = false, .mlp_unfused = true, .front_packed = false, .o_proj_packed = false};
  const dist::RankShard s = dist::shard_of(c, 0, 4);
  const ModelConfig local = dist::rank_config(c, s);
  const size_t whole = runtime::gpu_weight_bytes(c, one);
  const size_t embedding = size_t{128256} * 8192 * 2;
  // Everything but the embedding splits four ways (the lm_head exactly: 128256 = 4 x 32064); the
  // norms (replicated) are a rounding error.
  const size_t rank = runtime::gpu_weight_bytes(local, one, s);
  const double split_part = static_cast<double>(rank - embedding) * 4;
  EXPECT_NEAR(split_part / static_cast<double>(whole - embedding), 1.0, 1e-3);
  EXPECT_EQ(runtime::decode_weight_bytes(local, s), rank - embedding);
}

// FP8 under tensor parallelism: a rank holds its slice's bytes and the scales that go with it,
// its rows' for a row-split weight and every row's for a column-split one (o_proj, down).
TEST(TensorSplit, Fp8WeightBytesOfARank) {
  const ModelConfig c = random_arch_config("llama3-70b");
  runtime::WeightLayouts one{.mlp_fused = false, .mlp_unfused = true, .front_packed = false, .o_proj_packed = false};
  one.load.quantize = WeightFormat::fp8_e4m3;
  const dist::RankShard s = dist::shard_of(c, 2, 4);
  const size_t H = 8192, I = 28672 / 4, Q = 8192 / 4, KV = 1024 / 4, V = 128256, layers = 80;
  const size_t elements = H * (Q + 2 * KV) + H * Q + 3 * I * H;
  const size_t scales = (Q + 2 * KV) + H /* o_proj: every row */ + 2 * I + H /* down: every row */;
  const size_t read = layers * (elements + 4 * scales + 2 * H * 2) + V * H * 2 /* embedding */ +
                      size_t{32064} * H * 2 /* the bf16 lm_head slice */ + H * 2;
  // The unfused FP8 MLP also holds its packed copy.
  EXPECT_EQ(runtime::gpu_weight_bytes(dist::rank_config(c, s), one, s), read + layers * 3 * I * H);
  EXPECT_EQ(runtime::decode_weight_bytes(dist::rank_config(c, s), s, one.load), read - V * H * 2);
}

// Every tensor of the model table, split by its row's TensorSplit: the ranks' slices cover each
// split axis exactly once (key/value heads: ranks / kv_heads times when replicated), replicated
// tensors are whole on every rank, and each slice has the shape of the rank's own model.
void expect_slices_tile_the_table(const ModelConfig& model, int ranks) {
  for (const TensorSpec& spec : kModelTensors) {
    if (!spec.present(model)) continue;
    const std::vector<int64_t> shape = tensor_shape(spec, model);
    const bool by_rows = spec.split == TensorSplit::rows;
    const size_t axis = static_cast<size_t>(spec.split == TensorSplit::columns ? shape.at(1) : shape[0]);
    std::vector<int> covered(axis, 0);
    for (int r = 0; r < ranks; ++r) {
      const dist::RankShard shard = dist::shard_of(model, r, ranks);
      const dist::TensorSlice slice = dist::slice_of(spec, model, shard);
      const std::string where = std::string(spec.name) + " rank " + std::to_string(r) + "/" + std::to_string(ranks);
      EXPECT_EQ(slice.row_length, static_cast<size_t>(shape.size() > 1 ? shape[1] : 1)) << where;
      EXPECT_EQ(slice.tensor_rows, static_cast<size_t>(shape[0])) << where;
      if (spec.split == TensorSplit::replicated) {
        EXPECT_EQ(slice.rows, static_cast<size_t>(shape[0])) << where;
        EXPECT_EQ(slice.columns, slice.row_length) << where;
        EXPECT_TRUE(slice.whole()) << where;
        continue;
      }
      // A rank's part of a split tensor is never taken for the whole (rank 0's rows start at 0),
      // unless it is the whole (a single key/value head every rank shares).
      EXPECT_EQ(slice.whole(), slice.elements() == static_cast<size_t>(shape[0]) * slice.row_length) << where;
      const size_t begin = by_rows ? slice.row_begin : slice.column_begin;
      const size_t count = by_rows ? slice.rows : slice.columns;
      ASSERT_LE(begin + count, axis) << where;
      for (size_t i = begin; i < begin + count; ++i) ++covered[i];
      // The other axis whole; the split one as long as the rank's model says (lm_head: its rows
      // inside the vocabulary).
      EXPECT_EQ(by_rows ? slice.columns : slice.rows, static_cast<size_t>(by_rows ? slice.row_length : shape[0])) << where;
      const ModelConfig local = dist::rank_config(model, shard);
      const size_t local_extent = spec.rows == Extent::vocab
                                      ? static_cast<size_t>(shard.vocab_real)
                                      : static_cast<size_t>(extent_size(by_rows ? spec.rows : spec.columns, local));
      EXPECT_EQ(count, local_extent) << where;
    }
    if (spec.split == TensorSplit::replicated) continue;
    const Extent split_extent = by_rows ? spec.rows : spec.columns;
    const int kv = model.num_key_value_heads;
    const int copies = split_extent == Extent::kv && kv < ranks ? ranks / kv : 1;
    for (size_t i = 0; i < axis; ++i) ASSERT_EQ(covered[i], copies) << spec.name << " index " << i << " tp " << ranks;
  }
}

TEST(TensorSplit, EveryTableTensorSlicesOverTheRanks) {
  expect_slices_tile_the_table(random_arch_config("llama3-70b"), 4);
  expect_slices_tile_the_table(random_arch_config("llama3-70b"), 8);
  ModelConfig qwen = model_preset("qwen2.5-7b");  // q/k/v biases, 4 key/value heads
  qwen.vocab_size = 1001;                          // the last lm_head slice padded
  expect_slices_tile_the_table(qwen, 2);
  qwen.num_key_value_heads = 2;  // fewer than the ranks: replicated
  expect_slices_tile_the_table(qwen, 4);
  ModelConfig llama = model_preset("llama3.2-1b");  // tied
  llama.qkv_bias = llama.o_proj_bias = true;         // Llama attention_bias
  expect_slices_tile_the_table(llama, 2);
}

// FP8 weights split with their scales: a rank's slice of the weight, scaled by its slice of the
// scales, is exactly its slice of the whole dequantized weight (per channel: the slice's rows, a
// column-split weight keeping all of them; per 128x128 block: the blocks it covers).
TEST(TensorSplit, Fp8ScalesSplitWithTheirRows) {
  const ModelConfig c = testing::block_friendly_config();
  for (const WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128}) {
    for (const TensorRole role : {TensorRole::q_proj, TensorRole::o_proj, TensorRole::gate_proj, TensorRole::down_proj}) {
      const TensorSpec& spec = tensor_spec(role);
      const size_t rows = static_cast<size_t>(extent_size(spec.rows, c)), columns = static_cast<size_t>(extent_size(spec.columns, c));
      const ScaleShape scales_shape = scale_shape(format, rows, columns);
      std::mt19937 rng(static_cast<uint32_t>(rows * 31 + columns));
      std::vector<float> codes(rows * columns), scales(scales_shape.rows * scales_shape.columns);
      for (float& v : codes) v = static_cast<float>(static_cast<int>(rng() % 33) - 16);
      for (float& v : scales) v = static_cast<float>(rng() % 1000 + 1) / 4096.0f;
      const size_t side = format == WeightFormat::fp8_e4m3 ? SIZE_MAX : 128;
      auto scale_at = [&](const std::vector<float>& s, size_t s_columns, size_t o, size_t i) {
        return side == SIZE_MAX ? s[o] : s[(o / side) * s_columns + i / side];
      };
      for (int rank = 0; rank < 2; ++rank) {
        const dist::RankShard shard = dist::shard_of(c, rank, 2);
        const dist::TensorSlice w = dist::slice_of(spec, c, shard);
        const dist::TensorSlice s = dist::scale_slice_of(spec, format, c, shard);
        if (format == WeightFormat::fp8_e4m3) {
          EXPECT_EQ(s.row_begin, w.row_begin) << spec.name;
          EXPECT_EQ(s.rows, w.rows) << spec.name;  // o_proj / down_proj: every row
        }
        std::vector<float> rank_scales;  // the rank's scales, as its device copy would hold them
        for (size_t r = 0; r < s.rows; ++r)
          for (size_t k = 0; k < s.columns; ++k) rank_scales.push_back(scales[(s.row_begin + r) * s.row_length + s.column_begin + k]);
        for (size_t o = 0; o < w.rows; ++o)
          for (size_t i = 0; i < w.columns; ++i) {
            const size_t go = w.row_begin + o, gi = w.column_begin + i;
            const float whole = codes[go * columns + gi] * scale_at(scales, scales_shape.columns, go, gi);
            const float sliced = codes[go * columns + gi] * scale_at(rank_scales, s.columns, o, i);
            ASSERT_EQ(sliced, whole) << spec.name << " " << weight_format_name(format) << " rank " << rank;
          }
      }
    }
  }
  // Slices that cut through the 128x128 blocks are refused, naming the tensor.
  ModelConfig narrow = c;
  narrow.intermediate_size = 128;  // 64 rows a rank
  EXPECT_THROW(dist::scale_slice_of(tensor_spec(TensorRole::gate_proj), WeightFormat::fp8_e4m3_block128, narrow,
                                    dist::shard_of(narrow, 1, 2)),
               Error);
  EXPECT_EQ(dist::scale_slice_of(tensor_spec(TensorRole::gate_proj), WeightFormat::bf16, c, dist::RankShard{}).elements(), 0u);
}

TEST(TensorSplit, OneGpuHoldsEveryTensorWhole) {
  const ModelConfig c = model_preset("qwen2.5-7b");
  for (const TensorSpec& spec : kModelTensors) {
    const dist::TensorSlice slice = dist::slice_of(spec, c, dist::RankShard{});
    const std::vector<int64_t> shape = tensor_shape(spec, c);
    EXPECT_EQ(slice.row_begin + slice.column_begin, 0u) << spec.name;
    EXPECT_TRUE(slice.whole()) << spec.name;
    EXPECT_EQ(slice.elements(), static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1))) << spec.name;
  }
}

TEST(PlanOverrides, AllReduce) {
  const std::vector<PlanOverride> o = parse_plan_overrides("all_reduce@1=one_shot,all_reduce=nccl");
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].op, "all_reduce");
  EXPECT_EQ(*o[0].bucket, 1);
  EXPECT_THROW(parse_plan_overrides("all_reduce=custom"), Error);
}

}  // namespace
}  // namespace deepfuse
