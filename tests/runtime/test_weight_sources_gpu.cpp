// FP8 weights onto the GPU (runtime/weight_sources.cpp), read back and compared bit for bit, in
// both FP8 formats (fp8_e4m3, per-channel scales; fp8_e4m3_block128, a scale per 128x128 block):
//   checkpoint  an FP8 checkpoint's slices and a 16-bit one quantized at load (--quantize), as
//               the host makes them (runtime::Fp8Slice, itself checked against the reference
//               weights in test_fp8_slice), through the pinned staging, for each rank of two;
//   random      FP8 weights are the bf16 draw of the same seed quantized per whole row or per
//               block of the whole tensor by the host quantizer's rules, on every rank (a slice
//               keeps the scales of its rows or of the blocks it covers);
//   built       the GPU weights of an FP8 model hold each group's bytes and scales in table order
//               (once the CUDA backend implements the format; skipped before).
// Device buffers are poisoned first, so a byte or scale never written shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "core/float8.hpp"
#include "deepfuse/make_model.hpp"
#include "deepfuse/model_weights.hpp"
#include "dist/tensor_split.hpp"
#include "model/fp8_weights.hpp"
#include "model/model_test_util.hpp"
#include "runtime/fp8_slice.hpp"
#include "runtime/gpu_weights.hpp"
#include "runtime/weight_sources.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

// A tiny Llama whose projections split over two ranks in whole 128x128 blocks (4 kv heads of 64).
ModelConfig model_config() {
  ModelConfig c = testing::block_friendly_config();
  c.num_key_value_heads = 4;
  return c;
}

constexpr WeightFormat kFp8Formats[] = {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128};

// Device memory filled with `byte` (0x7f: an e4m3 NaN; 0xff in floats: NaN).
DeviceBuffer poisoned(size_t bytes, uint8_t byte) {
  DeviceBuffer buffer(bytes);
  EXPECT_EQ(cudaMemset(buffer.data(), byte, bytes), cudaSuccess);
  return buffer;
}

struct Fp8OnDevice {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

// One tensor's slice through `source` into fresh poisoned buffers, read back.
Fp8OnDevice fill(runtime::TensorSource& source, const ExpectedTensor& tensor, const dist::TensorSlice& slice,
                 WeightFormat format) {
  const ScaleShape shape = scale_shape(format, slice.rows, slice.columns);
  const size_t scale_count = shape.rows * shape.columns;
  DeviceBuffer data = poisoned(slice.elements(), 0x7f), scales = poisoned(scale_count * sizeof(float), 0xff);
  source.fill(*tensor.spec, tensor.layer, slice, {format, &data, 0, &scales, 0});
  source.finish();
  return {data.to_host<uint8_t>(slice.elements()), scales.to_host<float>(scale_count)};
}

class Fp8FromCheckpoint : public ::testing::TestWithParam<std::tuple<WeightFormat, bool>> {};

TEST_P(Fp8FromCheckpoint, EveryRanksSliceIsWhatTheHostMakes) {
  DF_REQUIRE_GPU();
  const auto [format_made, quantize_at_load] = GetParam();
  ModelConfig config = model_config();
  if (!quantize_at_load) config.quantization = fp8_checkpoint_quantization(format_made);
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = SafetensorsDType::BF16, .seed = 17});
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const WeightLoadOptions options{.quantize = quantize_at_load ? format_made : WeightFormat::bf16};
  int checked = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const dist::RankShard shard = dist::shard_of(model, rank, 2);
    const std::unique_ptr<runtime::TensorSource> source = runtime::checkpoint_source(checkpoint, model, shard, nullptr, {});
    for (const ExpectedTensor& tensor : expected_tensors(model)) {
      const WeightFormat format = loaded_weight_format(model, tensor, options);
      if (format == WeightFormat::bf16) continue;
      EXPECT_EQ(format, format_made) << tensor.name;
      runtime::Fp8Slice host(checkpoint, model, shard, tensor, format);
      std::vector<uint8_t> bytes(host.slice().elements());
      host.rows(0, host.slice().rows, bytes.data());
      const Fp8OnDevice device = fill(*source, tensor, host.slice(), format);
      const std::string where = tensor.name + " rank " + std::to_string(rank);
      EXPECT_EQ(device.bytes, bytes) << where;
      EXPECT_EQ(device.scales, host.scales()) << where;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 7);
}

INSTANTIATE_TEST_SUITE_P(StoredOrQuantized, Fp8FromCheckpoint,
                         ::testing::Combine(::testing::ValuesIn(kFp8Formats), ::testing::Bool()), [](const auto& info) {
                           return std::string(weight_format_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_quantized_at_load" : "_stored");
                         });

// The host's bytes and scales of a whole [rows, columns] bf16 draw in `format`, cut to `slice`
// (and its scales to the rectangle dist::scale_slice_of says).
Fp8OnDevice host_quantized(const std::vector<uint16_t>& bits, const dist::TensorSlice& slice, WeightFormat format) {
  const size_t rows = slice.tensor_rows, columns = slice.row_length;
  std::vector<float> values(bits.size());
  for (size_t k = 0; k < bits.size(); ++k) values[k] = bf16_bits_to_float(bits[k]);
  std::vector<uint8_t> bytes(bits.size());
  std::vector<float> scales;
  const int side = format_info(format).scale_block;
  if (side > 0) {
    scales = quantize_blocks_fp8(values, static_cast<int64_t>(rows), static_cast<int64_t>(columns), side, bytes);
  } else {
    for (size_t r = 0; r < rows; ++r)
      scales.push_back(quantize_row_fp8(std::span(values).subspan(r * columns, columns),
                                        std::span(bytes).subspan(r * columns, columns)));
  }
  auto cut = [](const auto& whole, const dist::TensorSlice& s) {
    std::vector<typename std::decay_t<decltype(whole)>::value_type> out;
    for (size_t r = s.row_begin; r < s.row_begin + s.rows; ++r)
      for (size_t c = s.column_begin; c < s.column_begin + s.columns; ++c) out.push_back(whole[r * s.row_length + c]);
    return out;
  };
  return {cut(bytes, slice), cut(scales, dist::scale_slice_of(slice, format))};
}

// Each rank's FP8 slice is the bf16 draw of one GPU's seed, quantized by whole rows or by blocks
// of the whole tensor.
class Fp8Random : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(Fp8Random, EachRanksSliceIsTheBf16DrawQuantized) {
  DF_REQUIRE_GPU();
  const WeightFormat format = GetParam();
  const ModelConfig model = model_config();
  constexpr uint64_t kSeed = 23;
  for (int rank = 0; rank < 2; ++rank) {
    const dist::RankShard shard = dist::shard_of(model, rank, 2);
    // Two sources of one seed, asked for the same tensors in the same order: the draws match.
    const std::unique_ptr<runtime::TensorSource> whole = runtime::random_source(model, kSeed, nullptr);
    const std::unique_ptr<runtime::TensorSource> part = runtime::random_source(model, kSeed, nullptr);
    for (const ExpectedTensor& tensor : expected_tensors(model)) {
      if (tensor.spec->init == TensorInit::norm) continue;
      const dist::TensorSlice all = dist::slice_of(*tensor.spec, model, {});
      DeviceBuffer drawn(all.elements() * 2);
      whole->fill(*tensor.spec, tensor.layer, all, {WeightFormat::bf16, &drawn});
      whole->finish();
      const std::vector<uint16_t> bits = drawn.to_host<uint16_t>(all.elements());
      const dist::TensorSlice slice = dist::slice_of(*tensor.spec, model, shard);
      // The others keep drawing bf16 (and so does a weight that is not whole blocks: lm_head's 40 rows).
      const int side = std::max(format_info(format).scale_block, 1);
      if (!tensor.spec->formats.has(format) || all.tensor_rows % side != 0 || all.row_length % side != 0) {
        DeviceBuffer skipped(slice.elements() * 2);
        part->fill(*tensor.spec, tensor.layer, slice, {WeightFormat::bf16, &skipped});
        continue;
      }
      const Fp8OnDevice device = fill(*part, tensor, slice, format);
      const Fp8OnDevice host = host_quantized(bits, slice, format);
      const std::string where = tensor.name + " rank " + std::to_string(rank);
      EXPECT_EQ(device.bytes, host.bytes) << where;
      EXPECT_EQ(device.scales, host.scales) << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Random, ::testing::ValuesIn(kFp8Formats),
                         [](const auto& info) { return std::string(weight_format_name(info.param)); });

// The built weights of an FP8 checkpoint: qkv and o_proj in their groups' rows, with the groups'
// scales (per block: q's block rows, then k's, then v's), and every projection's format; the
// lm_head bf16.
class Fp8Built : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(Fp8Built, GroupsHoldTheirTensorsBytesAndScales) {
  DF_REQUIRE_GPU();
  const WeightFormat format = GetParam();
  if (!format_info(format).implemented)
    GTEST_SKIP() << "the CUDA backend does not implement " << weight_format_name(format)
                 << " yet (WeightFormatInfo::implemented)";
  ModelConfig config = model_config();
  config.quantization = fp8_checkpoint_quantization(format);
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = SafetensorsDType::BF16, .seed = 3});
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const runtime::WeightLayouts row_major{.mlp_fused = false, .mlp_unfused = true, .front_packed = false,
                                         .o_proj_packed = false, .max_tokens = 4};
  for (int ranks : {1, 2}) {
    const dist::RankShard shard = ranks > 1 ? dist::shard_of(model, 1, 2) : dist::RankShard{};
    const runtime::GpuWeights w = runtime::load_checkpoint_weights(checkpoint, model, row_major, nullptr, {}, shard);
    EXPECT_EQ(w.formats[TensorGroup::lm_head], WeightFormat::bf16);
    for (const runtime::GpuLayerWeights& layer : w.layers)
      for (TensorGroup group : {TensorGroup::qkv, TensorGroup::o_proj, TensorGroup::gate, TensorGroup::up, TensorGroup::down})
        EXPECT_EQ(layer.formats[group], format) << static_cast<int>(group);
    for (TensorGroup group : {TensorGroup::qkv, TensorGroup::o_proj}) {
      std::vector<uint8_t> bytes;
      std::vector<float> scales;
      for (const ExpectedTensor& tensor : expected_tensors(model)) {
        if (tensor.layer != 0 || tensor.spec->group != group) continue;
        runtime::Fp8Slice host(checkpoint, model, shard, tensor, format);
        std::vector<uint8_t> part(host.slice().elements());
        host.rows(0, host.slice().rows, part.data());
        bytes.insert(bytes.end(), part.begin(), part.end());
        scales.insert(scales.end(), host.scales().begin(), host.scales().end());
      }
      const DeviceBuffer& data = w.layers[0].row_major[group];
      EXPECT_EQ(data.to_host<uint8_t>(data.bytes()), bytes) << ranks << " ranks, group " << static_cast<int>(group);
      const DeviceBuffer& held = w.layers[0].scales[group];
      EXPECT_EQ(held.to_host<float>(held.bytes() / sizeof(float)), scales) << ranks << " ranks";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Built, ::testing::ValuesIn(kFp8Formats),
                         [](const auto& info) { return std::string(weight_format_name(info.param)); });

}  // namespace
}  // namespace deepfuse
