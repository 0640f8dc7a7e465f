// Where wgmma's fp32 accumulator elements sit (PTX ISA, "Register Fragments" of wgmma .m64nNk16):
// thread t of the warpgroup (warp w = t / 32, lane l) holds N / 2 floats of the 64 x N tile D;
// its element i is at row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2
// (mma.m16n8's C layout, one 16-row band per warp, repeated every 8 columns). Plain constexpr, so
// the CPU tests check that it covers the tile once.
#pragma once

namespace deepfuse::kernels::hopper {

constexpr int accumulator_row(int warp_in_group, int lane, int i) {
  return 16 * warp_in_group + lane / 4 + 8 * ((i / 2) % 2);
}
constexpr int accumulator_column(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

}  // namespace deepfuse::kernels::hopper
