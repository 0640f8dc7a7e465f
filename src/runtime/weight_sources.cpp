#include "runtime/weight_sources.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/fill.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/model_weights.hpp"
#include "core/float16.hpp"
#include "runtime/fp8_slice.hpp"
#include "runtime/pinned_buffer.hpp"

namespace deepfuse::runtime {

namespace {

size_t bf16_bytes(size_t elements) { return elements * sizeof(__nv_bfloat16); }

// ---- checkpoint -> device

// n elements of `dtype` (BF16, F16 or F32, possibly unaligned in the mapping) -> bf16 bits.
void convert_to_bf16(const std::byte* source, SafetensorsDType dtype, size_t n, uint16_t* out) {
  switch (dtype) {
    case SafetensorsDType::BF16:
      std::memcpy(out, source, n * 2);
      return;
    case SafetensorsDType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        out[i] = float_to_bf16_bits(half_bits_to_float(bits));
      }
      return;
    case SafetensorsDType::F32:
      for (size_t i = 0; i < n; ++i) {
        float value;
        std::memcpy(&value, source + 4 * i, 4);
        out[i] = float_to_bf16_bits(value);
      }
      return;
    default:
      throw Error(std::string("cannot load a ") + dtype_name(dtype) + " tensor as bf16");
  }
}

// Copies checkpoint tensors to device memory, chunk by chunk through two pinned buffers used in
// turn: the host fills one (converting, or making FP8) while the previous chunk's copy from the
// other runs.
class StagedUploader {
 public:
  StagedUploader(size_t total_bytes, cudaStream_t stream, const LoadProgress& progress)
      : stream_(stream), progress_(progress), total_(total_bytes) {
    for (PinnedBuffer& buffer : staging_) buffer = PinnedBuffer(kChunkBytes);
    if (progress_) progress_(0, total_);
  }
  // Pending copies read the staging buffers: let them finish before the buffers are freed.
  ~StagedUploader() { cudaStreamSynchronize(stream_); }
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // `items` items of `item_bytes` each -> `destination`, in chunks: produce(first, count, chunk)
  // writes items [first, first + count) to the staging chunk.
  template <typename Produce>
  void copy(void* destination, size_t items, size_t item_bytes, Produce produce) {
    DF_CHECK(item_bytes > 0 && item_bytes <= kChunkBytes, "internal: a row larger than the staging buffer");
    const size_t per_chunk = kChunkBytes / item_bytes;
    auto* out = static_cast<std::byte*>(destination);
    for (size_t first = 0; first < items; first += per_chunk) {
      const size_t count = std::min(per_chunk, items - first);
      staging_read_[next_].wait();  // the copy that last read this buffer is done
      produce(first, count, staging_[next_].as<std::byte>());
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first * item_bytes, staging_[next_].data(), count * item_bytes,
                                    cudaMemcpyHostToDevice, stream_));
      staging_read_[next_].record(stream_);
      next_ ^= 1;
    }
  }

  // `bytes` of the checkpoint read: below the total until finish(), which comes once every copy
  // is enqueued and the stream synchronised.
  void read(size_t bytes) {
    done_ += bytes;
    if (progress_) progress_(std::min(done_, total_ > 0 ? total_ - 1 : 0), total_);
  }
  void finish() {
    if (progress_) progress_(total_, total_);
  }

 private:
  static constexpr size_t kChunkBytes = size_t{16} << 20;  // per staging buffer

  cudaStream_t stream_;
  LoadProgress progress_;  // a copy: callers may pass a temporary (the source outlives the call)
  size_t done_ = 0;
  size_t total_;
  PinnedBuffer staging_[2];
  CopyEvent staging_read_[2];
  int next_ = 0;
};

// Rank `shard`'s slice of each tensor: rows [row_begin, +rows) x columns [column_begin, +columns)
// of the checkpoint's tensor (a vector is one column), read from the file and nothing else, as
// bf16 or, for an FP8 target, as Fp8Slice makes it.
class CheckpointSource final : public TensorSource {
 public:
  CheckpointSource(const Checkpoint& checkpoint, const ModelConfig& model, const dist::RankShard& shard,
                   size_t total_bytes, cudaStream_t stream, const LoadProgress& progress)
      : checkpoint_(checkpoint), model_(model), shard_(shard), stream_(stream),
        uploader_(total_bytes, stream, progress) {}

  void fill(const TensorSpec& spec, int layer, const dist::TensorSlice& slice, const SliceTarget& target) override {
    const std::string name = tensor_name(spec, layer);
    const Checkpoint::Entry* entry = checkpoint_.find(name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + name + "'");
    const SafetensorsDType dtype = entry->info->dtype;
    const size_t element_bytes = dtype_size(dtype);
    DF_CHECK((slice.row_begin + slice.rows) * slice.row_length * element_bytes <= checkpoint_.data(*entry).size(),
             "internal: slice outside tensor '" + name + "'");
    if (target.format == WeightFormat::bf16)
      upload_bf16(*entry, slice, target.data->as<uint16_t>() + target.offset);
    else
      upload_fp8({name, tensor_shape(spec, model_), &spec, layer}, target);
    uploader_.read(slice.elements() * element_bytes);
  }
  void finish() override {
    DF_CHECK_CUDA(cudaStreamSynchronize(stream_));
    uploader_.finish();
  }

 private:
  void upload_bf16(const Checkpoint::Entry& entry, const dist::TensorSlice& slice, uint16_t* out) {
    const std::span<const std::byte> source = checkpoint_.data(entry);
    const SafetensorsDType dtype = entry.info->dtype;
    const size_t element_bytes = dtype_size(dtype);
    uploader_.copy(out, slice.rows, bf16_bytes(slice.columns), [&](size_t first, size_t count, std::byte* chunk) {
      for (size_t r = 0; r < count; ++r) {
        const size_t element = (slice.row_begin + first + r) * slice.row_length + slice.column_begin;
        convert_to_bf16(source.data() + element * element_bytes, dtype, slice.columns,
                        reinterpret_cast<uint16_t*>(chunk) + r * slice.columns);
      }
    });
  }

  void upload_fp8(const ExpectedTensor& tensor, const SliceTarget& target) {
    Fp8Slice fp8(checkpoint_, model_, shard_, tensor, target.format);
    const dist::TensorSlice& slice = fp8.slice();
    uploader_.copy(target.data->as<uint8_t>() + target.offset, slice.rows, slice.columns,
                   [&](size_t first, size_t count, std::byte* chunk) {
                     fp8.rows(first, count, reinterpret_cast<uint8_t*>(chunk));
                   });
    const std::vector<float>& scales = fp8.scales();  // complete now that every row is made
    uploader_.copy(target.scales->as<float>() + target.scale_offset, scales.size(), sizeof(float),
                   [&](size_t first, size_t count, std::byte* chunk) {
                     std::memcpy(chunk, scales.data() + first, count * sizeof(float));
                   });
  }

  const Checkpoint& checkpoint_;
  const ModelConfig& model_;
  dist::RankShard shard_;
  cudaStream_t stream_;
  StagedUploader uploader_;
};

// ---- random weights

class RandomSource final : public TensorSource {
 public:
  RandomSource(const ModelConfig& model, uint64_t seed, cudaStream_t stream)
      : seed_(seed), stream_(stream) {
    size_t longest_norm = 0;
    for (const TensorSpec& spec : kModelTensors)
      if (spec.init == TensorInit::norm)
        longest_norm = std::max(longest_norm, static_cast<size_t>(extent_size(spec.rows, model) *
                                                                  extent_size(spec.columns, model)));
    ones_.assign(longest_norm, float_to_bf16_bits(1.0f));
  }

  void fill(const TensorSpec& spec, int, const dist::TensorSlice& slice, const SliceTarget& target) override {
    if (spec.init == TensorInit::norm) {  // exactly 1 (and no numbers drawn)
      // ones_ never changes and outlives the copies (finish() synchronises).
      DF_CHECK_CUDA(cudaMemcpyAsync(target.data->as<__nv_bfloat16>() + target.offset, ones_.data(),
                                    bf16_bytes(slice.elements()), cudaMemcpyHostToDevice, stream_));
      return;
    }
    const size_t elements = slice.tensor_rows * slice.row_length;
    const uint64_t tensor_seed = seed_ + (++tensors_) * 0x9e3779b97f4a7c15ull;
    if (target.format == WeightFormat::bf16 && slice.whole()) {
      DF_CHECK_CUDA(kernels::fill_uniform_bf16(target.data->as<__nv_bfloat16>() + target.offset, elements, tensor_seed,
                                               scale(spec, slice), stream_));
      return;
    }
    // Drawn whole (the numbers one GPU's engine draws), then this rank's rectangle copied out.
    reserve(whole_, bf16_bytes(elements));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(whole_.as<__nv_bfloat16>(), elements, tensor_seed, scale(spec, slice), stream_));
    if (target.format == WeightFormat::bf16) {
      copy_rectangle(whole_.as<std::byte>(), sizeof(__nv_bfloat16), slice,
                     target.data->as<std::byte>() + bf16_bytes(target.offset));
      return;
    }
    // One scale per whole row, or per 128x128 block of the whole tensor: a slice keeps the scales
    // of its rows (a column slice) or of the blocks it covers.
    const dist::TensorSlice scale_slice = dist::scale_slice_of(slice, target.format);
    const int side = format_info(target.format).scale_block;
    const auto rows = static_cast<int>(slice.tensor_rows), columns = static_cast<int>(slice.row_length);
    reserve(whole_fp8_, elements);
    reserve(whole_scales_, scale_slice.tensor_rows * scale_slice.row_length * sizeof(float));
    if (side > 0)
      DF_CHECK_CUDA(kernels::quantize_blocks_fp8(whole_.as<__nv_bfloat16>(), whole_fp8_.as<uint8_t>(),
                                                 whole_scales_.as<float>(), rows, columns, side, stream_));
    else
      DF_CHECK_CUDA(kernels::quantize_rows_fp8(whole_.as<__nv_bfloat16>(), whole_fp8_.as<uint8_t>(),
                                               whole_scales_.as<float>(), rows, columns, stream_));
    copy_rectangle(whole_fp8_.as<std::byte>(), 1, slice, target.data->as<std::byte>() + target.offset);
    copy_rectangle(whole_scales_.as<std::byte>(), sizeof(float), scale_slice,
                   target.scales->as<std::byte>() + target.scale_offset * sizeof(float));
  }
  void finish() override { DF_CHECK_CUDA(cudaStreamSynchronize(stream_)); }
  ~RandomSource() override { cudaStreamSynchronize(stream_); }

 private:
  // uniform(-scale, scale): the statistics of trained weights, so activations stay finite over
  // 80 layers. Linear weights: std 1/sqrt(fan_in), fan_in the whole tensor's columns.
  static float scale(const TensorSpec& spec, const dist::TensorSlice& slice) {
    switch (spec.init) {
      case TensorInit::embedding: return 1.0f;
      case TensorInit::bias: return 0.1f;
      case TensorInit::linear: return std::sqrt(3.0f / static_cast<float>(slice.row_length));
      case TensorInit::norm: break;
    }
    throw Error("internal: norm weights are not drawn");
  }

  // Scratch of at least `bytes`; an older, smaller one may still be read by queued work.
  void reserve(DeviceBuffer& scratch, size_t bytes) {
    if (scratch.bytes() >= bytes) return;
    DF_CHECK_CUDA(cudaStreamSynchronize(stream_));
    scratch = DeviceBuffer(bytes);
  }
  // The slice's rectangle of a whole row-major tensor of `element_bytes` elements -> out, packed.
  void copy_rectangle(const std::byte* whole, size_t element_bytes, const dist::TensorSlice& slice, std::byte* out) {
    const std::byte* source = whole + (slice.row_begin * slice.row_length + slice.column_begin) * element_bytes;
    DF_CHECK_CUDA(cudaMemcpy2DAsync(out, slice.columns * element_bytes, source, slice.row_length * element_bytes,
                                    slice.columns * element_bytes, slice.rows, cudaMemcpyDeviceToDevice, stream_));
  }

  uint64_t seed_;
  uint64_t tensors_ = 0;
  cudaStream_t stream_;
  std::vector<uint16_t> ones_;  // bf16 1.0, as long as the longest norm weight
  DeviceBuffer whole_;          // a whole tensor drawn in bf16
  DeviceBuffer whole_fp8_, whole_scales_;  // ... and quantized
};

}  // namespace

std::unique_ptr<TensorSource> checkpoint_source(const Checkpoint& checkpoint, const ModelConfig& model,
                                                const dist::RankShard& shard, cudaStream_t stream,
                                                const LoadProgress& progress) {
  // Bytes this rank reads: its slice of every tensor (a tied lm_head's slice is copied from the
  // embedding on the device, not read).
  size_t total_bytes = 0;
  for (const ExpectedTensor& tensor : expected_tensors(model))
    total_bytes += dist::slice_of(*tensor.spec, model, shard).elements() *
                   dtype_size(checkpoint.find(tensor.name)->info->dtype);
  return std::make_unique<CheckpointSource>(checkpoint, model, shard, total_bytes, stream, progress);
}

std::unique_ptr<TensorSource> random_source(const ModelConfig& model, uint64_t seed, cudaStream_t stream) {
  return std::make_unique<RandomSource>(model, seed, stream);
}

}  // namespace deepfuse::runtime
