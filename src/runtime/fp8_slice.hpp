// A rank's slice of one linear weight in an FP8 format, made on the host from the checkpoint as
// the device stores it: e4m3 bytes, row-major, and fp32 scales. A tensor the checkpoint stores in
// FP8 gives its own bytes and scales (a per-tensor scale repeated for every row; per block the
// blocks the slice covers, dist::scale_slice_of); a 16-bit tensor is quantized at load exactly as
// the reference backend quantizes it (round_through_fp8: fp8_e4m3 one absmax scale per whole row,
// so a column slice, o_proj's or down's under tensor parallelism, keeps its rows' scales;
// fp8_e4m3_block128 one per 128x128 block, made a band of 128 whole rows at a time). Host only:
// the checkpoint source streams the rows through its pinned staging (weight_sources.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "deepfuse/model_weights.hpp"
#include "dist/tensor_split.hpp"

namespace deepfuse::runtime {

class Fp8Slice {
 public:
  // `tensor` of `model` (the whole model's config), as rank `shard` holds it, in `format` (an FP8
  // format: the stored one, or either for a 16-bit tensor quantized at load). Throws
  // deepfuse::Error for a format the tensor cannot be made in, or blocks the slice would cut.
  Fp8Slice(const Checkpoint& checkpoint, const ModelConfig& model, const dist::RankShard& shard,
           const ExpectedTensor& tensor, WeightFormat format);

  const dist::TensorSlice& slice() const { return slice_; }

  // Rows [first, first + count) of the slice: count x slice().columns bytes to `out`.
  void rows(size_t first, size_t count, uint8_t* out);

  // The slice's scales, row-major: per channel one per slice row, per block scale_slice_of's
  // rectangle. Those of a quantized tensor are complete once rows() has made every row.
  const std::vector<float>& scales() const { return scales_; }

 private:
  // Quantizes the band of whole rows slice row `r` is in (one row per channel, `side_` per block)
  // into band_bytes_, and its scales into scales_.
  void quantize_band(size_t r);

  const Checkpoint::Entry& entry_;
  dist::TensorSlice slice_;
  dist::TensorSlice scale_slice_;
  bool quantize_ = false;        // a 16-bit tensor made FP8 here
  size_t side_ = 1;              // rows a scale spans: 1 per channel, the block side per block
  std::vector<float> scales_;
  std::vector<uint8_t> band_bytes_;  // one band of whole quantized rows
  size_t band_ = SIZE_MAX;           // the band band_bytes_ holds
};

}  // namespace deepfuse::runtime
