// FP8 weights onto the GPU (runtime/weight_sources.cpp), read back and compared bit for bit:
//   checkpoint  an FP8 checkpoint's slices and a 16-bit one quantized at load (--quantize fp8), as
//               the host makes them (runtime::Fp8Slice, itself checked against the reference
//               weights in test_fp8_slice), through the pinned staging, for each rank of two;
//   random      fp8_e4m3 weights are the bf16 draw of the same seed quantized per whole row by
//               the host quantizer's rules, on every rank (column slices keep their rows' scales);
//   built       the GPU weights of an FP8 model hold each group's bytes and scales in table order
//               (once the CUDA backend implements fp8_e4m3; skipped before).
// Device buffers are poisoned first, so a byte or scale never written shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
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

// A tiny Llama whose projections split over two ranks.
ModelConfig model_config() { return testing::block_friendly_config(); }

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

class Fp8FromCheckpoint : public ::testing::TestWithParam<bool> {};

TEST_P(Fp8FromCheckpoint, EveryRanksSliceIsWhatTheHostMakes) {
  DF_REQUIRE_GPU();
  const bool quantize_at_load = GetParam();
  ModelConfig config = model_config();
  if (!quantize_at_load) config.quantization = fp8_checkpoint_quantization();
  testing::ScratchDir dir;
  write_random_checkpoint(config, dir.path(), {.dtype = SafetensorsDType::BF16, .seed = 17});
  const ModelConfig model = load_model_config(dir.path());
  const Checkpoint checkpoint(dir.path());
  const WeightLoadOptions options{.quantize = quantize_at_load ? WeightFormat::fp8_e4m3 : WeightFormat::bf16};
  int checked = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const dist::RankShard shard = dist::shard_of(model, rank, 2);
    const std::unique_ptr<runtime::TensorSource> source = runtime::checkpoint_source(checkpoint, model, shard, nullptr, {});
    for (const ExpectedTensor& tensor : expected_tensors(model)) {
      const WeightFormat format = loaded_weight_format(model, tensor, options);
      if (format == WeightFormat::bf16) continue;
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

INSTANTIATE_TEST_SUITE_P(StoredOrQuantized, Fp8FromCheckpoint, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "quantized_at_load" : "stored_fp8"; });

// Each rank's fp8_e4m3 slice is the bf16 draw of one GPU's seed, quantized by whole rows.
TEST(Fp8Random, EachRanksSliceIsTheBf16DrawQuantizedByRows) {
  DF_REQUIRE_GPU();
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
      if (!tensor.spec->formats.has(WeightFormat::fp8_e4m3)) {  // the others keep drawing bf16
        DeviceBuffer skipped(slice.elements() * 2);
        part->fill(*tensor.spec, tensor.layer, slice, {WeightFormat::bf16, &skipped});
        continue;
      }
      const Fp8OnDevice device = fill(*part, tensor, slice, WeightFormat::fp8_e4m3);
      std::vector<uint8_t> row_bytes(all.row_length);
      std::vector<uint8_t> bytes;
      std::vector<float> scales;
      for (size_t r = slice.row_begin; r < slice.row_begin + slice.rows; ++r) {
        std::vector<float> row(all.row_length);
        for (size_t c = 0; c < all.row_length; ++c) row[c] = bf16_bits_to_float(bits[r * all.row_length + c]);
        scales.push_back(quantize_row_fp8(row, row_bytes));
        bytes.insert(bytes.end(), row_bytes.begin() + slice.column_begin,
                     row_bytes.begin() + slice.column_begin + slice.columns);
      }
      const std::string where = tensor.name + " rank " + std::to_string(rank);
      EXPECT_EQ(device.bytes, bytes) << where;
      EXPECT_EQ(device.scales, scales) << where;
    }
  }
}

// The built weights of an FP8 checkpoint: qkv and o_proj in their groups' rows, with the groups'
// scales, and every projection's format; the lm_head bf16.
TEST(Fp8Built, GroupsHoldTheirTensorsBytesAndScales) {
  DF_REQUIRE_GPU();
  if (!format_info(WeightFormat::fp8_e4m3).implemented)
    GTEST_SKIP() << "the CUDA backend does not implement fp8_e4m3 yet (WeightFormatInfo::implemented)";
  ModelConfig config = model_config();
  config.quantization = fp8_checkpoint_quantization();
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
        EXPECT_EQ(layer.formats[group], WeightFormat::fp8_e4m3) << static_cast<int>(group);
    for (TensorGroup group : {TensorGroup::qkv, TensorGroup::o_proj}) {
      std::vector<uint8_t> bytes;
      std::vector<float> scales;
      for (const ExpectedTensor& tensor : expected_tensors(model)) {
        if (tensor.layer != 0 || tensor.spec->group != group) continue;
        runtime::Fp8Slice host(checkpoint, model, shard, tensor, WeightFormat::fp8_e4m3);
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

}  // namespace
}  // namespace deepfuse
