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
#include "deepfuse/model_weights.hpp"
#include "model/float16.hpp"
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

// Copies checkpoint tensors to device memory as bf16, chunk by chunk through two pinned buffers
// used in turn: the host fills one while the previous chunk's copy from the other runs.
class StagedUploader {
 public:
  StagedUploader(const Checkpoint& checkpoint, size_t total_bytes, cudaStream_t stream, const LoadProgress& progress)
      : checkpoint_(checkpoint), stream_(stream), progress_(progress), total_(total_bytes) {
    for (PinnedBuffer& buffer : staging_) buffer = PinnedBuffer(bf16_bytes(kChunkElements));
    if (progress_) progress_(0, total_);
  }
  // Pending copies read the staging buffers: let them finish before the buffers are freed.
  ~StagedUploader() { cudaStreamSynchronize(stream_); }
  // Every tensor uploaded: the progress reaches its total.
  void finish() {
    if (progress_) progress_(total_, total_);
  }
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // Tensor `name` -> destination, which holds its element count of bf16.
  void upload(const std::string& name, void* destination) {
    const Checkpoint::Entry* entry = checkpoint_.find(name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + name + "'");
    const std::span<const std::byte> source = checkpoint_.data(*entry);
    const SafetensorsDType dtype = entry->info->dtype;
    const size_t source_element_bytes = dtype_size(dtype);
    const size_t elements = source.size() / source_element_bytes;
    auto* out = static_cast<uint16_t*>(destination);
    for (size_t first = 0; first < elements; first += kChunkElements) {
      const size_t count = std::min(kChunkElements, elements - first);
      staging_read_[next_].wait();  // the copy that last read this buffer is done
      convert_to_bf16(source.data() + first * source_element_bytes, dtype, count, staging_[next_].as<uint16_t>());
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first, staging_[next_].data(), bf16_bytes(count), cudaMemcpyHostToDevice,
                                    stream_));
      staging_read_[next_].record(stream_);
      next_ ^= 1;
    }
    done_ += source.size();
    report();
  }

  // Uploads into `buffer` at element `offset` (one of q/k/v into the merged qkv).
  void upload(const std::string& name, DeviceBuffer& buffer, size_t offset = 0) {
    upload(name, buffer.as<uint16_t>() + offset);
  }

  // Rows [block.row_begin, +block.rows) x columns [block.column_begin, +block.columns) of tensor
  // `name` (a matrix of `block.row_length` columns; a vector is one column) -> `buffer` at element
  // `offset`, packed: a tensor-parallel rank's slice, read from the file and nothing else.
  void upload(const std::string& name, DeviceBuffer& buffer, size_t offset, const dist::TensorSlice& block) {
    const Checkpoint::Entry* entry = checkpoint_.find(name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + name + "'");
    const std::span<const std::byte> source = checkpoint_.data(*entry);
    const SafetensorsDType dtype = entry->info->dtype;
    const size_t element_bytes = dtype_size(dtype);
    DF_CHECK(block.columns <= kChunkElements && (block.row_begin + block.rows) * block.row_length * element_bytes <=
                                                    source.size(),
             "internal: slice outside tensor '" + name + "'");
    auto* out = buffer.as<uint16_t>() + offset;
    const size_t rows_per_chunk = kChunkElements / block.columns;
    for (size_t first = 0; first < block.rows; first += rows_per_chunk) {
      const size_t rows = std::min(rows_per_chunk, block.rows - first);
      staging_read_[next_].wait();
      for (size_t r = 0; r < rows; ++r) {
        const size_t element = (block.row_begin + first + r) * block.row_length + block.column_begin;
        convert_to_bf16(source.data() + element * element_bytes, dtype, block.columns,
                        staging_[next_].as<uint16_t>() + r * block.columns);
      }
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first * block.columns, staging_[next_].data(), bf16_bytes(rows * block.columns),
                                    cudaMemcpyHostToDevice, stream_));
      staging_read_[next_].record(stream_);
      next_ ^= 1;
    }
    done_ += block.rows * block.columns * element_bytes;
    report();
  }

 private:
  // Below the total until finish(): done only when every copy is enqueued and the stream synchronised.
  void report() const {
    if (progress_) progress_(std::min(done_, total_ > 0 ? total_ - 1 : 0), total_);
  }

  static constexpr size_t kChunkElements = size_t{8} << 20;  // 16 MiB of bf16 per staging buffer

  const Checkpoint& checkpoint_;
  cudaStream_t stream_;
  const LoadProgress& progress_;
  size_t done_ = 0;
  size_t total_;
  PinnedBuffer staging_[2];
  CopyEvent staging_read_[2];
  int next_ = 0;
};

class CheckpointSource final : public TensorSource {
 public:
  CheckpointSource(const Checkpoint& checkpoint, size_t total_bytes, cudaStream_t stream, const LoadProgress& progress)
      : stream_(stream), uploader_(checkpoint, total_bytes, stream, progress) {}
  void fill(const TensorSpec& spec, int layer, const dist::TensorSlice& slice, DeviceBuffer& destination,
            size_t offset) override {
    if (slice.whole()) uploader_.upload(tensor_name(spec, layer), destination, offset);
    else uploader_.upload(tensor_name(spec, layer), destination, offset, slice);
  }
  void finish() override {
    DF_CHECK_CUDA(cudaStreamSynchronize(stream_));
    uploader_.finish();
  }

 private:
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

  void fill(const TensorSpec& spec, int, const dist::TensorSlice& slice, DeviceBuffer& destination,
            size_t offset) override {
    auto* out = destination.as<__nv_bfloat16>() + offset;
    if (spec.init == TensorInit::norm) {  // exactly 1 (and no numbers drawn)
      // ones_ never changes and outlives the copies (finish() synchronises).
      DF_CHECK_CUDA(cudaMemcpyAsync(out, ones_.data(), bf16_bytes(slice.elements()), cudaMemcpyHostToDevice, stream_));
      return;
    }
    const size_t elements = slice.tensor_rows * slice.row_length;
    const uint64_t tensor_seed = seed_ + (++tensors_) * 0x9e3779b97f4a7c15ull;
    if (slice.whole()) {
      DF_CHECK_CUDA(kernels::fill_uniform_bf16(out, elements, tensor_seed, scale(spec, slice), stream_));
      return;
    }
    // Drawn whole (the numbers one GPU's engine draws), then this rank's rectangle copied out.
    if (whole_.bytes() < bf16_bytes(elements)) {
      DF_CHECK_CUDA(cudaStreamSynchronize(stream_));  // the old scratch may still be read
      whole_ = DeviceBuffer(bf16_bytes(elements));
    }
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(whole_.as<__nv_bfloat16>(), elements, tensor_seed, scale(spec, slice), stream_));
    const auto* source = whole_.as<__nv_bfloat16>() + slice.row_begin * slice.row_length + slice.column_begin;
    DF_CHECK_CUDA(cudaMemcpy2DAsync(out, bf16_bytes(slice.columns), source, bf16_bytes(slice.row_length),
                                    bf16_bytes(slice.columns), slice.rows, cudaMemcpyDeviceToDevice, stream_));
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

  uint64_t seed_;
  uint64_t tensors_ = 0;
  cudaStream_t stream_;
  std::vector<uint16_t> ones_;  // bf16 1.0, as long as the longest norm weight
  DeviceBuffer whole_;
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
  return std::make_unique<CheckpointSource>(checkpoint, total_bytes, stream, progress);
}

std::unique_ptr<TensorSource> random_source(const ModelConfig& model, uint64_t seed, cudaStream_t stream) {
  return std::make_unique<RandomSource>(model, seed, stream);
}

}  // namespace deepfuse::runtime
