// The decode output projection (cluster GEMV + bias + residual) against an fp64 CPU reference on
// fresh random data, y poisoned with NaN first; the residual in place (y aliasing it) as the
// decode step uses it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/reference.hpp"
#include "kernels/fp8_test_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;

std::vector<float> bf16_random(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> v = testing::random_uniform(rng, count, scale);
  for (auto& e : v) e = round_to_bf16(e);
  return v;
}

// pending: an fp32 sum a kernel before left for the residual (the fused MLP's deferred sum): the
// residual used is bf16(residual + pending), and pending must be all zero afterwards.
// FP8 formats: the weights quantized (the reference multiplies by their dequantized values);
// norm: y = rms_norm(x) · W^T with a random norm weight (the FP8 MLP's gate_up).
struct Options {
  bool pending = false;
  WeightFormat format = WeightFormat::bf16;
  bool norm = false;
};

void check_case(int rows, int inner, int tokens, bool bias, bool residual, bool in_place, uint64_t salt,
                Options options = {}) {
  const bool pending = options.pending, fp8 = options.format != WeightFormat::bf16;
  SCOPED_TRACE("rows=" + std::to_string(rows) + " inner=" + std::to_string(inner) + " tokens=" +
               std::to_string(tokens) + " bias=" + std::to_string(bias) + " residual=" + std::to_string(residual) +
               " in_place=" + std::to_string(in_place) + " pending=" + std::to_string(pending) + " format=" +
               weight_format_name(options.format) + " norm=" + std::to_string(options.norm));
  auto rng = testing::make_rng(salt);
  const auto x = bf16_random(rng, static_cast<size_t>(tokens) * inner, 1.0f);
  const auto w_drawn = bf16_random(rng, static_cast<size_t>(rows) * inner, 1.7f / std::sqrt(static_cast<float>(inner)));
  const auto b = bf16_random(rng, rows, 0.5f);
  const auto r = bf16_random(rng, static_cast<size_t>(tokens) * rows, 1.0f);
  const auto sums = testing::random_uniform(rng, static_cast<size_t>(tokens) * rows, 1.0f);
  auto norm_weight = bf16_random(rng, inner, 0.5f);
  for (auto& v : norm_weight) v = round_to_bf16(1.0f + v);
  const testing::Fp8TestWeights q = fp8 ? testing::quantize_fp8_for_test(w_drawn, rows, inner, options.format)
                                        : testing::Fp8TestWeights{};
  const std::vector<float>& w = fp8 ? q.dequantized : w_drawn;
  std::vector<float> xn = x;  // the input the projection sees
  if (options.norm) reference::rms_norm(x.data(), norm_weight.data(), tokens, inner, 1e-5f, xn.data());
  std::vector<double> ref(static_cast<size_t>(tokens) * rows);
  for (int t = 0; t < tokens; ++t)
    for (int o = 0; o < rows; ++o) {
      const size_t i = static_cast<size_t>(t) * rows + o;
      const float residual_used = pending ? round_to_bf16(sums[i] + r[i]) : r[i];
      double sum = (bias ? b[o] : 0.0) + (residual ? residual_used : 0.0);
      for (int k = 0; k < inner; ++k)
        sum += static_cast<double>(w[static_cast<size_t>(o) * inner + k]) * xn[static_cast<size_t>(t) * inner + k];
      ref[static_cast<size_t>(t) * rows + o] = sum;
    }
  const DeviceBuffer x_dev = DeviceBuffer::from_host(to_bf16_bits(x));
  const DeviceBuffer w_dev = fp8 ? DeviceBuffer::from_host(q.bytes) : DeviceBuffer::from_host(to_bf16_bits(w));
  const DeviceBuffer scales_dev = fp8 ? DeviceBuffer::from_host(q.scales) : DeviceBuffer();
  const DeviceBuffer norm_dev = DeviceBuffer::from_host(to_bf16_bits(norm_weight));
  const DeviceBuffer b_dev = DeviceBuffer::from_host(to_bf16_bits(b));
  DeviceBuffer packed(w_dev.bytes());
  if (fp8)
    DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(w_dev.as<uint8_t>(), packed.as<uint4>(), rows, inner, nullptr));
  else
    DF_CHECK_CUDA(kernels::pack_rows_fragments(w_dev.as<__nv_bfloat16>(), packed.as<uint4>(), rows, inner, nullptr));
  DeviceBuffer r_dev = DeviceBuffer::from_host(to_bf16_bits(r));
  DeviceBuffer y_dev = DeviceBuffer::from_host(std::vector<uint16_t>(ref.size(), kNanBits));
  DeviceBuffer pending_dev = DeviceBuffer::from_host(sums);
  kernels::GemvResidualParams p;
  p.x = x_dev.as<__nv_bfloat16>();
  p.weights = packed.as<uint4>();
  p.bias = bias ? b_dev.as<__nv_bfloat16>() : nullptr;
  p.residual = residual ? r_dev.as<__nv_bfloat16>() : nullptr;
  p.y = in_place ? r_dev.as<__nv_bfloat16>() : y_dev.as<__nv_bfloat16>();
  p.tokens = tokens;
  p.rows = rows;
  p.inner = inner;
  p.pending = pending ? pending_dev.as<float>() : nullptr;
  p.format = options.format;
  p.scales = fp8 ? scales_dev.as<float>() : nullptr;
  p.norm_weight = options.norm ? norm_dev.as<__nv_bfloat16>() : nullptr;
  p.norm_eps = 1e-5f;
  DF_CHECK_CUDA(kernels::launch_gemv_residual(p, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  const auto y = bf16_bits_to_floats((in_place ? r_dev : y_dev).to_host<uint16_t>(ref.size()));
  EXPECT_EQ(testing::count_nan(y), 0u);
  EXPECT_LT(testing::relative_error(y, ref), 1e-2);
  if (pending) {
    const auto left = pending_dev.to_host<float>(sums.size());
    size_t nonzero = 0;
    for (float v : left) nonzero += v != 0.0f;
    EXPECT_EQ(nonzero, 0u) << "the pending sum must be cleared once added";
  }
}

TEST(GemvResidual, MatchesReference) {
  DF_REQUIRE_GPU();
  uint64_t salt = 300;
  // Llama-3-8B and 3.2-1B o_proj, Qwen2.5-7B (3584: 64-row units), a small odd one, one below a
  // cluster's worth of k-steps (inner 64: no cluster).
  for (auto [rows, inner] : {std::pair{4096, 4096}, {2048, 2048}, {3584, 3584}, {896, 896}, {192, 64}})
    for (int tokens : {1, 3, 8, 13, 16, 32}) check_case(rows, inner, tokens, tokens % 2 == 1, true, tokens != 8, ++salt);
  check_case(896, 896, 5, true, false, false, ++salt);  // no residual
}

// The decode step's deferred MLP sum: added to the residual (in place), then cleared.
TEST(GemvResidual, AddsAndClearsAPendingSum) {
  DF_REQUIRE_GPU();
  uint64_t salt = 400;
  for (auto [rows, inner] : {std::pair{4096, 4096}, {3584, 3584}, {896, 896}})
    for (int tokens : {1, 5, 16}) check_case(rows, inner, tokens, tokens == 5, true, true, ++salt, {.pending = true});
}

// FP8 weights (per-row and 128x128-block scales), with and without the norm, at every token
// count class; shapes of Llama-3-8B's o_proj and gate_up / down, Qwen2.5-7B, Llama-3.2-1B.
TEST(GemvResidual, Fp8WeightsMatchTheirDequantizedReference) {
  DF_REQUIRE_GPU();
  uint64_t salt = 500;
  for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128})
    for (auto [rows, inner] : {std::pair{4096, 4096}, {3584, 3584}, {2048, 2048}, {256, 128}})
      for (int tokens : {1, 4, 8, 13, 16, 32}) {
        check_case(rows, inner, tokens, tokens == 4, true, tokens != 8, ++salt, {.format = format});
        if (tokens % 4 == 1) check_case(rows, inner, tokens, false, false, false, ++salt, {.format = format, .norm = true});
      }
  // The MLP's projections of Llama-3-8B: gate_up (normed) and down (+ residual).
  for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128})
    {  // one token: the fp64 reference of these shapes takes seconds per token
      check_case(2 * 14336, 4096, 1, false, false, false, ++salt, {.format = format, .norm = true});
      check_case(4096, 14336, 1, false, true, true, ++salt, {.format = format});
    }
}

TEST(GemvResidual, RejectsBadParams) {
  DF_REQUIRE_GPU();
  kernels::GemvResidualParams p;
  EXPECT_EQ(kernels::launch_gemv_residual(p, nullptr), cudaErrorInvalidValue);
  // A pending sum needs a residual to add it to.
  DeviceBuffer x(4096 * 2), w(64 * 64 * 2), y(64 * 2), pending(64 * 4);
  p.x = x.as<__nv_bfloat16>();
  p.weights = w.as<uint4>();
  p.y = y.as<__nv_bfloat16>();
  p.tokens = 1;
  p.rows = 64;
  p.inner = 64;
  p.pending = pending.as<float>();
  EXPECT_EQ(kernels::launch_gemv_residual(p, nullptr), cudaErrorInvalidValue);
  // FP8 weights need their scales, and bf16 weights take none.
  p.pending = nullptr;
  p.format = WeightFormat::fp8_e4m3;
  EXPECT_EQ(kernels::launch_gemv_residual(p, nullptr), cudaErrorInvalidValue);
  p.format = WeightFormat::bf16;
  p.scales = pending.as<float>();
  EXPECT_EQ(kernels::launch_gemv_residual(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
