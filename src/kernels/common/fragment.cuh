// Tensor-core building blocks shared by the MLP kernels: the mma.m16n8k16 bf16 instruction and
// the "fragment-packed" weight layout that lets one 16-byte load per lane fetch a whole A tile.
//
// mma.m16n8k16 (row.col, bf16 in, fp32 accumulate), lane = 4*g + t (g = lane/4, t = lane%4):
//   A (16x16): {A[g][2t..2t+1], A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9]}
//   B (16x8):  b0 = {B[2t][g], B[2t+1][g]},  b1 = {B[2t+8][g], B[2t+9][g]}
//   C (16x8):  {C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]}
// Packing a 16x16 tile means writing, for each lane, those 8 A values as one uint4.
//
// FP8 (e4m3) weights use the same order at one byte per value: a lane's 8 A values of one k-step
// are 8 bytes, and one 16-byte load carries two consecutive k-steps (32 columns). They widen to
// f16 exactly (every e4m3 value is an f16 value), so the FP8 streams run mma with f16 operands:
// the activations are staged as f16 (fp8_activations below).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace deepfuse::kernels {

__device__ __forceinline__ void mma_bf16_m16n8k16(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16_m16n8k16(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

// Two e4m3 bytes (the low byte first) as an f16x2 word, exactly (one cvt on sm_89 and later).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Four e4m3 bytes as two f16x2 words (the low half first), exactly. On sm_89 and later one cvt
// each, reading the word's halves in place: written with `>> 16`, the upper half costs a shift
// first, one more instruction per two weights in every FP8 k-step.
__device__ __forceinline__ uint2 e4m3x4_to_f16x2x2(uint32_t four_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint2 words;
  asm("{\n\t.reg .b16 low, high;\n\tmov.b32 {low, high}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, low;\n\tcvt.rn.f16x2.e4m3x2 %1, high;\n\t}"
      : "=r"(words.x), "=r"(words.y)
      : "r"(four_bytes));
  return words;
#else
  return make_uint2(e4m3x2_to_f16x2(four_bytes & 0xffffu), e4m3x2_to_f16x2(four_bytes >> 16));
#endif
}

// One k-step's A fragment from its 8 packed e4m3 bytes (low word first), as f16.
__device__ __forceinline__ uint4 e4m3_fragment_to_f16(uint32_t low, uint32_t high) {
  const uint2 first = e4m3x4_to_f16x2x2(low), second = e4m3x4_to_f16x2x2(high);
  return make_uint4(first.x, first.y, second.x, second.y);
}

// Two floats as the f16x2 word an FP8 stream's B operand wants, clamped to f16's finite range
// (an activation beyond +-65504 saturates instead of turning the sums into inf).
// One cvt.rn.satfinite (PTX 8.1, sm_80): the upper half from the first source operand.
__device__ __forceinline__ uint32_t f16x2_saturated(float low, float high) {
  uint32_t word;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(high), "f"(low));
  return word;
}

// The uint4 that lane `lane` holds for the 16x16 tile of row-major `matrix` (leading dimension
// `ld`) whose top-left corner is (row0, col0).
__device__ __forceinline__ uint4 gather_a_fragment(const __nv_bfloat16* matrix, size_t ld, int row0,
                                                   int col0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const __nv_bfloat16* top = matrix + static_cast<size_t>(row0 + g) * ld + col0 + 2 * t;
  const __nv_bfloat16* bottom = top + 8 * ld;
  uint4 v;
  v.x = *reinterpret_cast<const uint32_t*>(top);
  v.y = *reinterpret_cast<const uint32_t*>(bottom);
  v.z = *reinterpret_cast<const uint32_t*>(top + 8);
  v.w = *reinterpret_cast<const uint32_t*>(bottom + 8);
  return v;
}

// Lane `lane`'s 8 bytes of the k-step at (row0, col0) of a row-major e4m3 matrix: the A fragment
// order above, one byte per value, the low word first.
__device__ __forceinline__ uint2 gather_e4m3_fragment(const uint8_t* matrix, size_t ld, int row0, int col0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const uint8_t* top = matrix + static_cast<size_t>(row0 + g) * ld + col0 + 2 * t;
  const uint8_t* bottom = top + 8 * ld;
  auto pair = [](const uint8_t* p) { return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8); };
  return make_uint2(pair(top) | (pair(bottom) << 16), pair(top + 8) | (pair(bottom + 8) << 16));
}

}  // namespace deepfuse::kernels
