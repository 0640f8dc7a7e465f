// How a linear weight is stored on the device: its element format (WeightFormat, one table of
// what each format is) and a LinearWeight, the view of one projection that flows from the loader
// through packing to the kernel dispatch. Only linear weights ([out, in] projections) have
// formats; norm weights, biases and the embedding table stay 16-bit in every format.
//
//   bf16       one bfloat16 per element; no scales. Implemented.
//   fp8_e4m3   one e4m3 byte per element, times a per-output-channel fp32 scale (scales[out]) and,
//              when present, one per-tensor fp32 scale: w[o, i] = e4m3[o, i] * scales[o] * tensor.
//              (compressed-tensors FP8; a per-tensor checkpoint scale is every channel's.)
//   fp8_e4m3_block128
//              one e4m3 byte per element, times one fp32 scale per 128x128 block:
//              w[o, i] = e4m3[o, i] * scales[o / 128][i / 128] (DeepSeek/Qwen-style `fp8`).
//   The model layer loads both (checks, dequantizes for the reference backend); no CUDA packing
//   or kernel takes them yet (issue 51): the CUDA backend refuses them in one line.
#pragma once

#include <cuda_bf16.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace deepfuse {

enum class WeightFormat : uint8_t { bf16, fp8_e4m3, fp8_e4m3_block128 };
inline constexpr int kWeightFormatCount = 3;

// Which elements share one fp32 scale.
enum class ScaleGranularity : uint8_t {
  none,     // no scales
  channel,  // one per output channel (row)
  block,    // one per square block of scale_block x scale_block elements
};

// One row per format: everything the rest of the code needs to know about it.
struct WeightFormatInfo {
  WeightFormat format;
  const char* name;          // as printed and parsed ("bf16", "fp8_e4m3")
  size_t element_bytes;      // bytes per weight element
  ScaleGranularity scales;   // which elements share an fp32 scale
  int scale_block;           // block: the side of a scale's square block (it must divide the shape)
  // An RMSNorm's weight is multiplied into the input columns of the projection after it at load
  // (folded_norm.hpp). Only where the product stays exact enough in the format: otherwise the
  // norm weight is applied to the activations as the kernels stage them (docs/design.md).
  bool folds_norm;
  bool implemented;          // the CUDA backend's packing and kernels take it (the loader and the
                             // reference backend take every format)
};

inline constexpr WeightFormatInfo kWeightFormats[kWeightFormatCount] = {
    {WeightFormat::bf16, "bf16", 2, ScaleGranularity::none, 0, true, true},
    {WeightFormat::fp8_e4m3, "fp8_e4m3", 1, ScaleGranularity::channel, 0, false, true},
    {WeightFormat::fp8_e4m3_block128, "fp8_e4m3_block128", 1, ScaleGranularity::block, 128, false, true},
};

constexpr const WeightFormatInfo& format_info(WeightFormat format) { return kWeightFormats[static_cast<int>(format)]; }
const char* weight_format_name(WeightFormat format);
WeightFormat parse_weight_format(const std::string& name);  // throws deepfuse::Error naming the known ones

constexpr bool weight_formats_are_consistent() {
  for (int i = 0; i < kWeightFormatCount; ++i) {
    const WeightFormatInfo& info = kWeightFormats[i];
    if (static_cast<int>(info.format) != i) return false;
    if ((info.scales == ScaleGranularity::block) != (info.scale_block > 0)) return false;
  }
  return true;
}
static_assert(weight_formats_are_consistent(),
              "kWeightFormats lists the formats in WeightFormat's order; only block scales have a block side");

// [rows, columns] of the fp32 scales of a [rows, columns] weight in `format` ({0, 0}: none; a
// block format's side must divide both, which the loader checks first).
struct ScaleShape {
  size_t rows = 0, columns = 0;
};
ScaleShape scale_shape(WeightFormat format, size_t rows, size_t columns);

// Bytes of a [rows, columns] linear weight in `format`: its elements plus its fp32 scales.
size_t linear_weight_bytes(WeightFormat format, size_t rows, size_t columns);

// Throws deepfuse::Error "<who>: weights in format <name> are not implemented yet" unless
// `format` is implemented.
void require_implemented(WeightFormat format, const std::string& who);

// A set of formats (a model tensor's allowed formats).
class WeightFormats {
 public:
  constexpr WeightFormats() = default;
  constexpr WeightFormats(std::initializer_list<WeightFormat> formats) {
    for (WeightFormat f : formats) bits_ |= bit(f);
  }
  constexpr bool has(WeightFormat format) const { return (bits_ & bit(format)) != 0; }

 private:
  static constexpr uint32_t bit(WeightFormat f) { return 1u << static_cast<int>(f); }
  uint32_t bits_ = 0;
};

// The formats linear weights are made in at load beyond what the checkpoint stores (--quantize):
// fp8_e4m3 rounds every 16-bit linear weight through FP8 with one absmax scale per output channel,
// lm_head too only with quantize_lm_head; bf16 keeps them as stored. Both backends load so, and
// the CUDA engine's random weights are drawn in bf16 and then made so (src/runtime).
struct WeightLoadOptions {
  WeightFormat quantize = WeightFormat::bf16;
  bool quantize_lm_head = false;

  bool operator==(const WeightLoadOptions&) const = default;
};

// How a linear weight's elements are ordered on the device.
enum class WeightLayout : uint8_t {
  row_major,        // [out, in] as Hugging Face stores it (cuBLASLt's operand)
  fragments,        // 16x16 tiles in mma fragment order (the cluster GEMV stream: o_proj, QKV)
  mlp_fragments,    // the fused MLP's gate/up and down tile orders (include/deepfuse/mlp.hpp)
};

// One projection's weight on the device: y[t, o] = sum_i x[t, i] * w[o, i].
struct LinearWeight {
  WeightFormat format = WeightFormat::bf16;
  WeightLayout layout = WeightLayout::row_major;
  const void* data = nullptr;           // rows x columns elements of `format`, in `layout`
  const float* scales = nullptr;        // scale_shape(format, rows, columns), row-major
  const float* tensor_scale = nullptr;  // optional single scale (fp8), nullptr: 1
  int rows = 0;                         // output channels
  int columns = 0;                      // input features

  bool empty() const { return data == nullptr; }
  size_t bytes() const { return linear_weight_bytes(format, static_cast<size_t>(rows), static_cast<size_t>(columns)); }

  // The dispatch's view for a kernel that reads bf16: the row-major elements (cuBLASLt), or the
  // packed 16-byte tiles (the fused kernels). Throws deepfuse::Error naming `who` (the kernel or
  // packing step) when the weight is in another format or layout, or absent, so a path no kernel
  // serves yet refuses in one line instead of misreading the bytes.
  const __nv_bfloat16* bf16(const char* who) const;
  const uint4* bf16_tiles(const char* who) const;
  // The packed tiles in any format, for a kernel that takes the format (and scales) alongside.
  const uint4* tiles(const char* who) const;
  // The row-major e4m3 bytes of an FP8 format (what the FP8 packing reads).
  const uint8_t* e4m3(const char* who) const;

 private:
  const void* checked(bool packed, const char* who, bool any_format = false) const;
};

}  // namespace deepfuse
