#include "deepfuse/weight_format.hpp"

#include "deepfuse/error.hpp"

namespace deepfuse {

namespace {

// Indexed by WeightLayout.
constexpr const char* kLayoutNames[] = {"row-major", "fragment-packed", "MLP fragment-packed"};

const char* layout_name(WeightLayout layout) { return kLayoutNames[static_cast<int>(layout)]; }

}  // namespace

const char* weight_format_name(WeightFormat format) { return format_info(format).name; }

WeightFormat parse_weight_format(const std::string& name) {
  std::string known;
  for (const WeightFormatInfo& info : kWeightFormats) {
    if (name == info.name) return info.format;
    known += (known.empty() ? "" : ", ") + std::string(info.name);
  }
  throw Error("unknown weight format '" + name + "' (known: " + known + ")");
}

ScaleShape scale_shape(WeightFormat format, size_t rows, size_t columns) {
  const WeightFormatInfo& info = format_info(format);
  switch (info.scales) {
    case ScaleGranularity::none: return {};
    case ScaleGranularity::channel: return {rows, 1};
    case ScaleGranularity::block: {
      const size_t side = static_cast<size_t>(info.scale_block);
      return {(rows + side - 1) / side, (columns + side - 1) / side};
    }
  }
  throw Error("internal: unknown scale granularity");
}

size_t linear_weight_bytes(WeightFormat format, size_t rows, size_t columns) {
  const ScaleShape scales = scale_shape(format, rows, columns);
  return rows * columns * format_info(format).element_bytes + scales.rows * scales.columns * sizeof(float);
}

void require_implemented(WeightFormat format, const std::string& who) {
  DF_CHECK(format_info(format).implemented,
           who + ": weights in format " + weight_format_name(format) + " are not implemented yet");
}

const void* LinearWeight::checked(bool packed, const char* who, bool any_format) const {
  DF_CHECK(any_format || format == WeightFormat::bf16, std::string(who) + " reads bf16 weights; these are " +
                                             weight_format_name(format) + " (no kernel for them yet)");
  DF_CHECK((layout != WeightLayout::row_major) == packed,
           std::string(who) + " reads " + (packed ? "packed" : "row-major") + " weights; these are " + layout_name(layout));
  DF_CHECK(data != nullptr, std::string(who) + ": the weights hold no " + layout_name(layout) + " copy");
  return data;
}

const __nv_bfloat16* LinearWeight::bf16(const char* who) const {
  return static_cast<const __nv_bfloat16*>(checked(false, who));
}

const uint4* LinearWeight::bf16_tiles(const char* who) const { return static_cast<const uint4*>(checked(true, who)); }

const uint4* LinearWeight::tiles(const char* who) const { return static_cast<const uint4*>(checked(true, who, true)); }

const uint8_t* LinearWeight::e4m3(const char* who) const {
  DF_CHECK(format != WeightFormat::bf16, std::string(who) + " reads FP8 weights; these are bf16");
  return static_cast<const uint8_t*>(checked(false, who, true));
}

}  // namespace deepfuse
