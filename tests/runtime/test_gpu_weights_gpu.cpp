// The GPU weights built by the one walk over the model table (runtime/gpu_weights.cpp), read back
// and compared bit for bit with what the table says they hold: every group its tensors' rows
// (a tensor-parallel rank's slices) in table order, converted to bf16; the row-major QKV with the
// input norm folded in; the lm_head slice padded with zeros. Random weights: each rank's are the
// slices of one GPU's of the same seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_tensors.hpp"
#include "deepfuse/model_weights.hpp"
#include "dist/tensor_split.hpp"
#include "model/model_test_util.hpp"
#include "runtime/gpu_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using Bits = std::vector<uint16_t>;

// The row-major layouts only: what the checkpoint holds, once (the packed copies are the kernels'
// own tests' concern).
constexpr runtime::WeightLayouts kRowMajor{.mlp_fused = false, .mlp_unfused = true, .front_packed = false,
                                          .o_proj_packed = false, .max_tokens = 4};

constexpr TensorGroup kBlockGroups[] = {TensorGroup::input_norm, TensorGroup::qkv, TensorGroup::qkv_bias,
                                        TensorGroup::o_proj, TensorGroup::o_bias, TensorGroup::post_attention_norm};

Bits download(const DeviceBuffer& buffer) { return buffer.empty() ? Bits{} : buffer.to_host<uint16_t>(buffer.bytes() / 2); }

// The rectangle `slice` of a whole tensor [rows, slice.row_length] given as bf16 bits.
Bits cut(const uint16_t* whole, const dist::TensorSlice& slice) {
  Bits out;
  for (size_t r = 0; r < slice.rows; ++r)
    for (size_t c = 0; c < slice.columns; ++c)
      out.push_back(whole[(slice.row_begin + r) * slice.row_length + slice.column_begin + c]);
  return out;
}

// What `group` holds on the rank of `shard`: each present tensor's slice, in table order, cut
// from its whole bf16 tensor (whole_of(spec)).
template <typename WholeOf>
Bits expected_group(TensorGroup group, const ModelConfig& model, const dist::RankShard& shard, WholeOf whole_of) {
  Bits out;
  for (const TensorSpec& spec : kModelTensors) {
    if (spec.group != group || !spec.present(model)) continue;
    const Bits part = cut(whole_of(spec).data(), dist::slice_of(spec, model, shard));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// rows x columns bits times the norm weight per column, rounded as launch_fold_norm_weight does.
Bits fold(const Bits& matrix, const Bits& norm) {
  Bits out(matrix.size());
  for (size_t i = 0; i < matrix.size(); ++i)
    out[i] = float_to_bf16_bits(bf16_bits_to_float(matrix[i]) * bf16_bits_to_float(norm[i % norm.size()]));
  return out;
}

// A tiny Llama with attention_bias (every optional block tensor) and a vocabulary that leaves the
// last rank's lm_head slice padded.
ModelConfig tiny_with_biases(bool tied) {
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 321;
  c.qkv_bias = c.o_proj_bias = true;
  c.tie_word_embeddings = tied;
  return c;
}

class GpuWeightsFromCheckpoint : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GpuWeightsFromCheckpoint, EveryGroupHoldsItsTensorsSlicesInTableOrder) {
  DF_REQUIRE_GPU();
  const auto [ranks, tied] = GetParam();
  testing::ScratchDir dir;
  write_random_checkpoint(tiny_with_biases(tied), dir.path(), {.dtype = SafetensorsDType::F32, .seed = 11});
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const reference::DecoderWeights host = load_reference_weights(checkpoint, model);
  for (int rank = 0; rank < ranks; ++rank) {
    const dist::RankShard shard = ranks > 1 ? dist::shard_of(model, rank, ranks) : dist::RankShard{};
    const runtime::GpuWeights w = runtime::load_checkpoint_weights(checkpoint, model, kRowMajor, nullptr, {}, shard);
    const std::string where = "rank " + std::to_string(rank) + " of " + std::to_string(ranks);
    for (int l = 0; l < model.num_hidden_layers; ++l) {
      auto whole_of = [&](const TensorSpec& spec) {
        return to_bf16_bits(spec.scope == TensorScope::layer ? host.layers[l][spec.role] : host.model[spec.role]);
      };
      for (TensorGroup group : kBlockGroups) {
        Bits expected = expected_group(group, model, shard, whole_of);
        if (group == TensorGroup::qkv) expected = fold(expected, whole_of(tensor_spec(TensorRole::input_norm)));
        EXPECT_EQ(download(w.layers[l].row_major[group]), expected) << where << " layer " << l << " group "
                                                                    << static_cast<int>(group);
      }
    }
    EXPECT_EQ(download(w.groups[TensorGroup::embed_tokens]), to_bf16_bits(host.model[TensorRole::embed_tokens])) << where;
    EXPECT_EQ(download(w.groups[TensorGroup::final_norm]), to_bf16_bits(host.model[TensorRole::final_norm])) << where;
    const Bits lm_head = download(w.groups[TensorGroup::lm_head]);
    if (ranks == 1) {
      EXPECT_EQ(lm_head, tied ? Bits{} : to_bf16_bits(host.model[TensorRole::lm_head])) << where;
      continue;
    }
    // The rank's vocabulary rows (of the embedding when tied), then zero rows up to vocab_rows.
    const TensorRole source = tied ? TensorRole::embed_tokens : TensorRole::lm_head;
    Bits expected = cut(to_bf16_bits(host.model[source]).data(), dist::slice_of(tensor_spec(TensorRole::lm_head), model, shard));
    expected.resize(static_cast<size_t>(shard.vocab_rows) * model.hidden_size, 0);
    EXPECT_EQ(lm_head, expected) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndTying, GpuWeightsFromCheckpoint,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()));

TEST(GpuWeightsRandom, EachRankHoldsSlicesOfOneGpusWeights) {
  DF_REQUIRE_GPU();
  const ModelConfig model = tiny_with_biases(false);
  constexpr uint64_t kSeed = 5;
  const runtime::GpuWeights one = runtime::make_random_weights(model, kRowMajor, kSeed, nullptr);
  for (int rank = 0; rank < 2; ++rank) {
    const dist::RankShard shard = dist::shard_of(model, rank, 2);
    const runtime::GpuWeights part = runtime::make_random_weights(model, kRowMajor, kSeed, nullptr, shard);
    for (int l = 0; l < model.num_hidden_layers; ++l) {
      for (TensorGroup group : kBlockGroups) {
        const Bits whole_group = download(one.layers[l].row_major[group]);
        // Norms are exactly 1, so the folded QKV is the drawn one on either side.
        auto whole_of = [&](const TensorSpec& spec) {
          const size_t first = static_cast<size_t>(row_in_group(spec, model) * group_columns(group, model));
          const size_t count = static_cast<size_t>(extent_size(spec.rows, model) * group_columns(group, model));
          return Bits(whole_group.begin() + first, whole_group.begin() + first + count);
        };
        EXPECT_EQ(download(part.layers[l].row_major[group]), expected_group(group, model, shard, whole_of))
            << "rank " << rank << " layer " << l << " group " << static_cast<int>(group);
      }
    }
    const Bits lm_head = download(one.groups[TensorGroup::lm_head]);
    Bits expected = cut(lm_head.data(), dist::slice_of(tensor_spec(TensorRole::lm_head), model, shard));
    expected.resize(static_cast<size_t>(shard.vocab_rows) * model.hidden_size, 0);
    EXPECT_EQ(download(part.groups[TensorGroup::lm_head]), expected) << "rank " << rank;
  }
}

}  // namespace
}  // namespace deepfuse
