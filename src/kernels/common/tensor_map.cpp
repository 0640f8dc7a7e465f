// TMA tensor maps: the parameters (host arithmetic, tested on the CPU) and the driver's encoder.
#include "deepfuse/kernels/tensor_map.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

namespace deepfuse::kernels {

static_assert(sizeof(TensorMapBytes) == sizeof(CUtensorMap) && alignof(TensorMapBytes) == alignof(CUtensorMap),
              "TensorMapBytes holds a CUtensorMap");

TileMap2d bf16_tile_map(uint64_t rows, uint64_t columns, uint32_t box_rows) {
  return {columns, rows, columns * 2, kTensorMapBoxColumns, box_rows};
}

std::string tile_map_unsupported(const void* base, const TileMap2d& map) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0)
    return "a TMA tensor map needs a 16-byte aligned global address";
  if (map.columns < 1 || map.rows < 1 || map.columns > (uint64_t{1} << 32) || map.rows > (uint64_t{1} << 32))
    return "a TMA tensor map's extents are 1 to 2^32 elements";
  if (map.row_stride_bytes % 16 != 0 || map.row_stride_bytes >= (uint64_t{1} << 40) ||
      map.row_stride_bytes < map.columns * 2)
    return "a TMA tensor map's row stride must be a multiple of 16 bytes, below 2^40, and hold a row";
  if (map.box_columns != kTensorMapBoxColumns || map.box_rows < 1 || map.box_rows > kTensorMapMaxBoxRows)
    return "a TMA box is 64 columns (the 128-byte swizzle's span) by 1 to 256 rows";
  return "";
}

namespace {

// The driver's encoder, looked up once per process (nullptr where the driver lacks it).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      function = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

}  // namespace

cudaError_t encode_tile_map(const void* base, const TileMap2d& map, TensorMapBytes& out) {
  if (!tile_map_unsupported(base, map).empty()) return cudaErrorInvalidValue;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t extents[2] = {map.columns, map.rows};
  const cuuint64_t strides[1] = {map.row_stride_bytes};  // the innermost stride is the element's
  const cuuint32_t box[2] = {map.box_columns, map.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(reinterpret_cast<CUtensorMap*>(out.bytes), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                 const_cast<void*>(base), extents, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace deepfuse::kernels
