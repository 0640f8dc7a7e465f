// TMA tensor maps (CUtensorMap) of 2-D row-major bf16 matrices, as the Hopper kernels load them:
// boxes of 64 columns (128 bytes, the 128-byte swizzle's span) by up to 256 rows, 128-byte
// swizzled in shared memory (a box reaching past the matrix's edge reads zeros there). Host
// code; no nvcc or <cuda.h> needed to include it (the map is 128 opaque bytes here). The driver's cuTensorMapEncodeTiled is
// reached through cudaGetDriverEntryPointByVersion, so nothing links libcuda.
//
// Cost: encoding is host-only work (no GPU call, no synchronisation; a few microseconds at most,
// not measured yet); a kernel receives the map by value as a __grid_constant__ parameter, so a
// captured CUDA graph holds it and replays cost nothing extra.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace deepfuse::kernels {

// A CUtensorMap's bytes (the driver's type: 128 bytes, 128-byte aligned).
struct alignas(128) TensorMapBytes {
  unsigned char bytes[128] = {};
};

// What cuTensorMapEncodeTiled is given for a [rows, columns] row-major bf16 matrix read in boxes of
// box_rows x kTensorMapBoxColumns: extents innermost first (columns, rows), the row stride in bytes.
struct TileMap2d {
  uint64_t columns = 0, rows = 0;
  uint64_t row_stride_bytes = 0;
  uint32_t box_columns = 0, box_rows = 0;
};

inline constexpr uint32_t kTensorMapBoxColumns = 64;  // 128 bytes of bf16: the 128-byte swizzle's span
inline constexpr uint32_t kTensorMapMaxBoxRows = 256;  // the TMA unit's box limit per dimension

// The map of a [rows, columns] row-major bf16 matrix (row stride = columns) read in boxes of
// box_rows rows.
TileMap2d bf16_tile_map(uint64_t rows, uint64_t columns, uint32_t box_rows);

// Why the TMA unit cannot read `map` at `base` (empty: it can): the global address 16-byte aligned,
// the row stride a multiple of 16 bytes below 2^40, extents in 1..2^32, the box 64 columns by 1..256
// rows.
std::string tile_map_unsupported(const void* base, const TileMap2d& map);

// Encodes `map` at `base` into `out` (128-byte swizzle, zero fill, 256-byte L2 promotion).
// cudaErrorInvalidValue for a map tile_map_unsupported refuses or the driver rejects,
// cudaErrorNotSupported where the driver has no cuTensorMapEncodeTiled.
cudaError_t encode_tile_map(const void* base, const TileMap2d& map, TensorMapBytes& out);

}  // namespace deepfuse::kernels
