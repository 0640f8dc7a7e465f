#include "runtime/fp8_slice.hpp"

#include <cstring>
#include <span>
#include <string>

#include "deepfuse/error.hpp"
#include "model/fp8_weights.hpp"

namespace deepfuse::runtime {

Fp8Slice::Fp8Slice(const Checkpoint& checkpoint, const ModelConfig& model, const dist::RankShard& shard,
                   const ExpectedTensor& tensor, WeightFormat format)
    : entry_(*checkpoint.find(tensor.name)), slice_(dist::slice_of(*tensor.spec, model, shard)) {
  const WeightFormat stored = stored_weight_format(model, tensor);
  quantize_ = stored == WeightFormat::bf16;
  DF_CHECK(format != WeightFormat::bf16 && (quantize_ ? format == WeightFormat::fp8_e4m3 : format == stored),
           "internal: " + tensor.name + " (stored " + weight_format_name(stored) + ") cannot be made " +
               weight_format_name(format) + " at load");
  const dist::TensorSlice scale_slice = dist::scale_slice_of(*tensor.spec, format, model, shard);
  if (quantize_) {
    scales_.assign(slice_.rows, 0.0f);
    row_bytes_.resize(slice_.row_length);
    return;
  }
  const std::vector<float> whole = stored_fp8_scales(checkpoint, model, tensor);
  for (size_t r = 0; r < scale_slice.rows; ++r) {
    const float* row = whole.data() + (scale_slice.row_begin + r) * scale_slice.row_length + scale_slice.column_begin;
    scales_.insert(scales_.end(), row, row + scale_slice.columns);
  }
}

void Fp8Slice::rows(size_t first, size_t count, uint8_t* out) {
  DF_CHECK(first + count <= slice_.rows, "internal: rows past the slice");
  const std::span<const std::byte> data = entry_.file->data(*entry_.info);
  const size_t element_bytes = dtype_size(entry_.info->dtype);
  for (size_t r = first; r < first + count; ++r) {
    const size_t row = slice_.row_begin + r;
    uint8_t* destination = out + (r - first) * slice_.columns;
    const std::span<const std::byte> source = data.subspan(row * slice_.row_length * element_bytes,
                                                           slice_.row_length * element_bytes);
    if (!quantize_) {
      std::memcpy(destination, source.data() + slice_.column_begin, slice_.columns);
      continue;
    }
    // The whole row sets its scale, as the reference quantizer's (its columns beyond the slice too).
    scales_[r] = quantize_row_fp8(to_float32(source, entry_.info->dtype), row_bytes_);
    std::memcpy(destination, row_bytes_.data() + slice_.column_begin, slice_.columns);
  }
}

}  // namespace deepfuse::runtime
