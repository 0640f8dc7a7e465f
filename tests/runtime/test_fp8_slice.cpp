// The host half of loading FP8 weights onto the GPU (runtime/fp8_slice.hpp), against the reference
// backend's weights (the oracle the FP8 kernels are compared with): every tensor-parallel rank's
// slice of every FP8 weight, dequantized from the bytes and scales the device would get, equals the
// reference weights cut to that slice, exactly. Stored checkpoints (compressed-tensors per channel
// and per tensor, fp8 128x128 blocks) and 16-bit checkpoints quantized at load (--quantize fp8,
// from BF16 and F32), whose bytes and scales must be the reference quantizer's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "dist/tensor_split.hpp"
#include "core/float8.hpp"
#include "model/fp8_test_util.hpp"
#include "model/model_test_util.hpp"
#include "runtime/fp8_slice.hpp"

namespace deepfuse {
namespace {

// The slice's rows made in chunks of a few rows (as the staging buffers take them), into bytes
// poisoned first so a row never written shows.
std::vector<uint8_t> made_rows(runtime::Fp8Slice& fp8) {
  const dist::TensorSlice& slice = fp8.slice();
  std::vector<uint8_t> bytes(slice.rows * slice.columns, 0x7f);  // e4m3 NaN
  constexpr size_t kChunkRows = 3;
  for (size_t first = 0; first < slice.rows; first += kChunkRows)
    fp8.rows(first, std::min(kChunkRows, slice.rows - first), bytes.data() + first * slice.columns);
  return bytes;
}

// w[r, c] of the slice from its e4m3 bytes and scales (per channel: one a row; per block: the
// slice's blocks, row-major).
std::vector<float> dequantized(const std::vector<uint8_t>& bytes, const std::vector<float>& scales,
                               const dist::TensorSlice& slice, WeightFormat format) {
  const int side = format_info(format).scale_block;
  std::vector<float> out(bytes.size());
  for (size_t r = 0; r < slice.rows; ++r)
    for (size_t c = 0; c < slice.columns; ++c) {
      const float scale = side > 0 ? scales[(r / side) * (slice.columns / side) + c / side] : scales[r];
      out[r * slice.columns + c] = float8_e4m3_to_float(bytes[r * slice.columns + c]) * scale;
    }
  return out;
}

std::vector<float> cut(const std::vector<float>& whole, const dist::TensorSlice& slice) {
  std::vector<float> out;
  for (size_t r = 0; r < slice.rows; ++r)
    for (size_t c = 0; c < slice.columns; ++c)
      out.push_back(whole[(slice.row_begin + r) * slice.row_length + slice.column_begin + c]);
  return out;
}

ExpectedTensor tensor_of(const ModelConfig& model, TensorRole role) {
  for (const ExpectedTensor& tensor : expected_tensors(model))
    if (tensor.spec->role == role) return tensor;
  throw Error("test: no tensor of that role");
}

const std::vector<float>& reference_of(const reference::DecoderWeights& weights, const ExpectedTensor& tensor) {
  return tensor.spec->scope == TensorScope::layer ? weights.layers[tensor.layer][tensor.spec->role]
                                                  : weights.model[tensor.spec->role];
}

// Checks every FP8 weight of the checkpoint in `dir` on every rank of `ranks`; returns how many.
int expect_slices_match_reference(const std::filesystem::path& dir, int ranks, const WeightLoadOptions& options) {
  const ModelConfig model = load_model_config(dir);
  const Checkpoint checkpoint(dir);
  const reference::DecoderWeights oracle = load_reference_weights(checkpoint, model, options);
  int checked = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const dist::RankShard shard = ranks > 1 ? dist::shard_of(model, rank, ranks) : dist::RankShard{};
    for (const ExpectedTensor& tensor : expected_tensors(model)) {
      const WeightFormat format = loaded_weight_format(model, tensor, options);
      if (format == WeightFormat::bf16) continue;
      const std::string where = tensor.name + " rank " + std::to_string(rank) + " of " + std::to_string(ranks);
      runtime::Fp8Slice fp8(checkpoint, model, shard, tensor, format);
      const dist::TensorSlice& slice = fp8.slice();
      const std::vector<uint8_t> bytes = made_rows(fp8);
      const ScaleShape blocks = scale_shape(format, slice.rows, slice.columns);
      EXPECT_EQ(fp8.scales().size(), blocks.rows * blocks.columns) << where;
      if (fp8.scales().size() != blocks.rows * blocks.columns) continue;
      EXPECT_EQ(dequantized(bytes, fp8.scales(), slice, format), cut(reference_of(oracle, tensor), slice)) << where;
      ++checked;
    }
  }
  return checked;
}

class StoredFp8 : public ::testing::TestWithParam<int> {};

TEST_P(StoredFp8, EveryRanksSliceDequantizesToTheReferenceWeights) {
  const testing::Fp8Case c = testing::fp8_cases()[GetParam()];
  const ModelConfig config = testing::block_friendly_config();
  testing::ScratchDir dir;
  testing::write_raw_checkpoint(dir.path(), testing::config_json_with(config, c.quantization_config),
                                testing::draw_fp8_pair(config, c.scope, c.scale_name, 21 + GetParam()).fp8);
  // 7 projections a block; 128x128 blocks split two ways only where a rank's k and v rows are
  // whole blocks, which 2 kv heads of 64 are not (below).
  const int ranks = c.scope == ScaleScope::block ? 1 : 2;
  EXPECT_EQ(expect_slices_match_reference(dir.path(), ranks, {}), 7 * ranks) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Formats, StoredFp8, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return std::string(testing::fp8_cases()[info.param].name); });

// A rank whose slice cuts a 128x128 scale block is refused, naming the tensor.
TEST(StoredFp8, BlocksARankWouldCutAreRefused) {
  const testing::Fp8Case c = testing::fp8_cases()[2];
  const ModelConfig config = testing::block_friendly_config();
  testing::ScratchDir dir;
  testing::write_raw_checkpoint(dir.path(), testing::config_json_with(config, c.quantization_config),
                                testing::draw_fp8_pair(config, c.scope, c.scale_name, 5).fp8);
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const ExpectedTensor k_proj = tensor_of(model, TensorRole::k_proj);
  testing::expect_error([&] { runtime::Fp8Slice(checkpoint, model, dist::shard_of(model, 1, 2), k_proj,
                                                WeightFormat::fp8_e4m3_block128); },
                        {"k_proj", "128x128", "--tp 2"});
}

// 128x128 blocks split over two ranks where every slice is whole blocks (4 kv heads of 64: 128
// k and v rows a rank; o_proj's and down's column slices 128 and 256 wide), in a checkpoint as
// make-model --dtype fp8-block128 writes it.
TEST(StoredFp8, WholeBlocksSplitOverTwoRanks) {
  ModelConfig config = testing::block_friendly_config();
  config.num_key_value_heads = 4;
  config.quantization = fp8_checkpoint_quantization(WeightFormat::fp8_e4m3_block128);
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.seed = 6});
  EXPECT_EQ(expect_slices_match_reference(dir.path(), 2, {}), 2 * 7);
}

class QuantizedAtLoad : public ::testing::TestWithParam<SafetensorsDType> {};

// --quantize fp8: the bytes and scales are the reference quantizer's, one absmax scale per whole
// row, so o_proj's and down's column slices keep the scales of their rows.
TEST_P(QuantizedAtLoad, EveryRanksSliceIsTheReferenceQuantizersOwn) {
  ModelConfig config = testing::block_friendly_config();
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = GetParam(), .seed = 9});
  for (bool lm_head : {false, true}) {
    const WeightLoadOptions options{.quantize = WeightFormat::fp8_e4m3, .quantize_lm_head = lm_head};
    EXPECT_EQ(expect_slices_match_reference(dir.path(), 2, options), 2 * (7 + (lm_head ? 1 : 0)));
  }
}

// --quantize in 128x128 blocks: each rank's slice holds the blocks the reference quantizer made of
// the whole tensor (bands of 128 whole rows), on one GPU and on two (4 kv heads: whole blocks).
TEST(QuantizedAtLoad, BlocksOfEveryRankAreTheReferenceQuantizersOwn) {
  ModelConfig config = testing::block_friendly_config();
  config.num_key_value_heads = 4;
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = SafetensorsDType::BF16, .seed = 10});
  const WeightLoadOptions options{.quantize = WeightFormat::fp8_e4m3_block128};
  EXPECT_EQ(expect_slices_match_reference(dir.path(), 1, options), 7);
  EXPECT_EQ(expect_slices_match_reference(dir.path(), 2, options), 2 * 7);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantizedAtLoad, ::testing::Values(SafetensorsDType::BF16, SafetensorsDType::F32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(QuantizedAtLoad, ScalesAreEachWholeRowsAbsmaxOver448) {
  const ModelConfig config = testing::block_friendly_config();
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = SafetensorsDType::F32, .seed = 4});
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const reference::DecoderWeights plain = load_reference_weights(checkpoint, model);
  const ExpectedTensor o_proj = tensor_of(model, TensorRole::o_proj);
  const std::vector<float>& whole = reference_of(plain, o_proj);
  const size_t columns = static_cast<size_t>(o_proj.shape[1]);
  runtime::Fp8Slice fp8(checkpoint, model, dist::shard_of(model, 1, 2), o_proj, WeightFormat::fp8_e4m3);
  ASSERT_LT(fp8.slice().columns, columns);  // a column slice
  made_rows(fp8);
  for (size_t r = 0; r < fp8.slice().rows; ++r) {
    float absmax = 0;
    for (size_t c = 0; c < columns; ++c) absmax = std::max(absmax, std::fabs(whole[r * columns + c]));
    EXPECT_EQ(fp8.scales()[r], absmax / kFloat8E4m3Max) << "row " << r;
  }
}

}  // namespace
}  // namespace deepfuse
