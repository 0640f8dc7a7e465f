#include "runtime/fp8_slice.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "deepfuse/error.hpp"
#include "core/float8.hpp"
#include "model/fp8_weights.hpp"

namespace deepfuse::runtime {

Fp8Slice::Fp8Slice(const Checkpoint& checkpoint, const ModelConfig& model, const dist::RankShard& shard,
                   const ExpectedTensor& tensor, WeightFormat format)
    : entry_(*checkpoint.find(tensor.name)), slice_(dist::slice_of(*tensor.spec, model, shard)) {
  const WeightFormat stored = stored_weight_format(model, tensor);
  quantize_ = stored == WeightFormat::bf16;
  DF_CHECK(format != WeightFormat::bf16 && (quantize_ || format == stored),
           "internal: " + tensor.name + " (stored " + weight_format_name(stored) + ") cannot be made " +
               weight_format_name(format) + " at load");
  scale_slice_ = dist::scale_slice_of(*tensor.spec, format, model, shard);
  if (quantize_) {
    side_ = std::max(format_info(format).scale_block, 1);
    scales_.assign(scale_slice_.rows * scale_slice_.columns, 0.0f);
    band_bytes_.resize(side_ * slice_.row_length);
    return;
  }
  const std::vector<float> whole = stored_fp8_scales(checkpoint, model, tensor);
  for (size_t r = 0; r < scale_slice_.rows; ++r) {
    const float* row = whole.data() + (scale_slice_.row_begin + r) * scale_slice_.row_length + scale_slice_.column_begin;
    scales_.insert(scales_.end(), row, row + scale_slice_.columns);
  }
}

void Fp8Slice::quantize_band(size_t r) {
  band_ = r / side_;
  const std::span<const std::byte> data = entry_.file->data(*entry_.info);
  const size_t element_bytes = dtype_size(entry_.info->dtype);
  const size_t first_row = slice_.row_begin + band_ * side_;
  const std::vector<float> values = to_float32(
      data.subspan(first_row * slice_.row_length * element_bytes, side_ * slice_.row_length * element_bytes),
      entry_.info->dtype);
  // Whole rows set the scales, as the reference quantizer's (columns beyond the slice too); the
  // slice keeps those of its columns.
  if (side_ == 1) {
    scales_[band_] = quantize_row_fp8(values, band_bytes_);
    return;
  }
  const std::vector<float> band_scales = quantize_blocks_fp8(values, static_cast<int64_t>(side_),
                                                             static_cast<int64_t>(slice_.row_length),
                                                             static_cast<int>(side_), band_bytes_);
  std::copy_n(band_scales.begin() + static_cast<std::ptrdiff_t>(scale_slice_.column_begin), scale_slice_.columns,
              scales_.begin() + static_cast<std::ptrdiff_t>(band_ * scale_slice_.columns));
}

void Fp8Slice::rows(size_t first, size_t count, uint8_t* out) {
  DF_CHECK(first + count <= slice_.rows, "internal: rows past the slice");
  const std::span<const std::byte> data = entry_.file->data(*entry_.info);
  for (size_t r = first; r < first + count; ++r) {
    uint8_t* destination = out + (r - first) * slice_.columns;
    if (!quantize_) {
      const size_t row = slice_.row_begin + r;
      std::memcpy(destination, data.data() + row * slice_.row_length + slice_.column_begin, slice_.columns);
      continue;
    }
    if (r / side_ != band_) quantize_band(r);
    std::memcpy(destination, band_bytes_.data() + (r % side_) * slice_.row_length + slice_.column_begin, slice_.columns);
  }
}

}  // namespace deepfuse::runtime
