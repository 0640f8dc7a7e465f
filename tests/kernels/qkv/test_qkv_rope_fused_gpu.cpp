// The fused input-norm + QKV + RoPE + KV-append kernel against the CPU reference ops
// (rms_norm, a fp64 projection, apply_rope) on fresh random data: q_out poisoned with NaN, cache
// pools filled with a sentinel so writes to the wrong slot and missing writes both show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "kernels/fp8_test_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr uint16_t kSentinelBits = 0x4321;  // a finite value no kernel output should equal exactly
constexpr double kTolerance = 1e-2;

struct QkvShape {
  int hidden, q_heads, kv_heads, head_dim;
  bool bias, llama3_rope;
};

std::vector<float> bf16_random(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> v = testing::random_uniform(rng, count, scale);
  for (auto& e : v) e = round_to_bf16(e);
  return v;
}

// pending: the residual stream holds x_stream and an fp32 sum the previous layer's MLP deferred
// (kernels::SwigluFusedParams::defer_sum); the kernel must work on x = bf16(x_stream + sum).
// FP8 formats: the weights quantized, the reference multiplying by their dequantized values.
void check_case(const QkvShape& s, int tokens, uint64_t salt, bool pending = false,
                WeightFormat format = WeightFormat::bf16) {
  SCOPED_TRACE("hidden=" + std::to_string(s.hidden) + " heads=" + std::to_string(s.q_heads) + "/" +
               std::to_string(s.kv_heads) + " head_dim=" + std::to_string(s.head_dim) +
               " tokens=" + std::to_string(tokens) + " pending=" + std::to_string(pending) + " format=" +
               weight_format_name(format));
  const bool fp8 = format != WeightFormat::bf16;
  auto rng = testing::make_rng(salt);
  const int rows = (s.q_heads + 2 * s.kv_heads) * s.head_dim;
  const std::vector<float> x_stream = bf16_random(rng, static_cast<size_t>(tokens) * s.hidden, 2.0f);
  const std::vector<float> sums = testing::random_uniform(rng, x_stream.size(), 1.0f);
  std::vector<float> x = x_stream;
  if (pending)
    for (size_t i = 0; i < x.size(); ++i) x[i] = round_to_bf16(sums[i] + x_stream[i]);
  std::vector<float> norm_weight = bf16_random(rng, s.hidden, 0.5f);
  for (auto& w : norm_weight) w = round_to_bf16(1.0f + w);
  const std::vector<float> drawn = bf16_random(rng, static_cast<size_t>(rows) * s.hidden, 1.7f / std::sqrt(float(s.hidden)));
  const testing::Fp8TestWeights quantized =
      fp8 ? testing::quantize_fp8_for_test(drawn, rows, s.hidden, format) : testing::Fp8TestWeights{};
  const std::vector<float>& weights = fp8 ? quantized.dequantized : drawn;
  const std::vector<float> bias = s.bias ? bf16_random(rng, rows, 0.5f) : std::vector<float>{};

  // Sequences: token t belongs to sequence t (decode), positions random (one at 0), one padded.
  const int max_pages = 64;
  const int num_pages = tokens * 4 + 3;
  std::vector<int32_t> positions(tokens), sequences(tokens);
  std::vector<int32_t> block_table(static_cast<size_t>(tokens) * max_pages, 0);
  std::vector<int32_t> page_ids(num_pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  for (int t = 0; t < tokens; ++t) {
    sequences[t] = tokens - 1 - t;  // block-table rows need not follow token order
    positions[t] = t == 0 ? 0 : static_cast<int>(rng() % (4 * kernels::kKvPageSize));
    for (int p = 0; p < 4; ++p) block_table[static_cast<size_t>(sequences[t]) * max_pages + p] = page_ids[t * 4 + p];
  }
  if (tokens > 2) positions[tokens / 2] = -1;  // a padded batch slot

  RopeParams rope;
  rope.head_dim = s.head_dim;
  rope.theta = s.llama3_rope ? 500000.0 : 10000.0;
  rope.llama3_scaling = s.llama3_rope;
  const std::vector<double> inv_freq = rope_inverse_frequencies(rope);
  const std::vector<float> inv_freq_f(inv_freq.begin(), inv_freq.end());

  // Device data.
  const DeviceBuffer x_dev = DeviceBuffer::from_host(to_bf16_bits(x_stream));
  const DeviceBuffer pending_dev = DeviceBuffer::from_host(sums);
  const DeviceBuffer norm_dev = DeviceBuffer::from_host(to_bf16_bits(norm_weight));
  const DeviceBuffer weights_dev =
      fp8 ? DeviceBuffer::from_host(quantized.bytes) : DeviceBuffer::from_host(to_bf16_bits(weights));
  const DeviceBuffer scales_dev = fp8 ? DeviceBuffer::from_host(quantized.scales) : DeviceBuffer();
  DeviceBuffer packed(weights_dev.bytes());
  if (fp8)
    DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(weights_dev.as<uint8_t>(), packed.as<uint4>(), rows, s.hidden, nullptr));
  else
    DF_CHECK_CUDA(kernels::pack_qkv_weights(weights_dev.as<__nv_bfloat16>(), packed.as<uint4>(), rows, s.hidden, nullptr));
  const DeviceBuffer bias_dev = s.bias ? DeviceBuffer::from_host(to_bf16_bits(bias)) : DeviceBuffer();
  const DeviceBuffer inv_freq_dev = DeviceBuffer::from_host(inv_freq_f);
  const DeviceBuffer positions_dev = DeviceBuffer::from_host(positions);
  const DeviceBuffer sequences_dev = DeviceBuffer::from_host(sequences);
  const DeviceBuffer table_dev = DeviceBuffer::from_host(block_table);
  const size_t pool = static_cast<size_t>(num_pages) * s.kv_heads * kernels::kKvPageSize * s.head_dim;
  DeviceBuffer k_pool = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  DeviceBuffer v_pool = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  const size_t q_count = static_cast<size_t>(tokens) * s.q_heads * s.head_dim;
  DeviceBuffer q_out = DeviceBuffer::from_host(std::vector<uint16_t>(q_count, kNanBits));

  kernels::QkvRopeFusedParams p;
  p.x = x_dev.as<__nv_bfloat16>();
  p.norm_weight = norm_dev.as<__nv_bfloat16>();
  p.norm_eps = 1e-5f;
  p.weights = packed.as<uint4>();
  p.bias = s.bias ? bias_dev.as<__nv_bfloat16>() : nullptr;
  p.inv_freq = inv_freq_dev.as<float>();
  p.positions = positions_dev.as<int32_t>();
  p.sequences = sequences_dev.as<int32_t>();
  p.q_out = q_out.as<__nv_bfloat16>();
  p.kv = {k_pool.as<__nv_bfloat16>(), v_pool.as<__nv_bfloat16>(), table_dev.as<int32_t>(), max_pages, s.kv_heads,
          s.head_dim};
  p.tokens = tokens;
  p.hidden = s.hidden;
  p.q_heads = s.q_heads;
  p.pending = pending ? pending_dev.as<float>() : nullptr;
  p.format = format;
  p.scales = fp8 ? scales_dev.as<float>() : nullptr;
  DF_CHECK_CUDA(kernels::launch_qkv_rope_fused(p, nullptr));
  DF_CHECK_CUDA(cudaGetLastError());
  DF_CHECK_CUDA(cudaDeviceSynchronize());

  // Reference: norm, projection (+bias) in fp64, rotation of q and k.
  std::vector<float> normed(x.size());
  reference::rms_norm(x.data(), norm_weight.data(), tokens, s.hidden, p.norm_eps, normed.data());
  const int q_size = s.q_heads * s.head_dim, kv_size = s.kv_heads * s.head_dim;
  std::vector<double> q_ref(q_count, 0.0), k_ref, v_ref;  // padded tokens: zero q rows
  std::vector<float> q_got, k_got, v_got;
  const auto q_host = bf16_bits_to_floats(q_out.to_host<uint16_t>(q_count));
  const auto k_host = k_pool.to_host<uint16_t>(pool), v_host = v_pool.to_host<uint16_t>(pool);
  std::vector<bool> written(pool, false);
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> projected(rows);
    for (int r = 0; r < rows; ++r) {
      double sum = s.bias ? bias[r] : 0.0;
      for (int h = 0; h < s.hidden; ++h)
        sum += static_cast<double>(weights[static_cast<size_t>(r) * s.hidden + h]) * normed[static_cast<size_t>(t) * s.hidden + h];
      projected[r] = static_cast<float>(sum);
    }
    if (positions[t] < 0) continue;
    reference::apply_rope(projected.data(), s.q_heads + s.kv_heads, s.head_dim, positions[t], inv_freq);
    for (int i = 0; i < q_size; ++i) q_ref[static_cast<size_t>(t) * q_size + i] = projected[i];
    for (int head = 0; head < s.kv_heads; ++head) {
      const int32_t page = block_table[static_cast<size_t>(sequences[t]) * max_pages + positions[t] / kernels::kKvPageSize];
      const size_t slot = ((static_cast<size_t>(page) * s.kv_heads + head) * kernels::kKvPageSize +
                           positions[t] % kernels::kKvPageSize) * s.head_dim;
      for (int d = 0; d < s.head_dim; ++d) {
        k_ref.push_back(projected[q_size + head * s.head_dim + d]);
        v_ref.push_back(projected[q_size + kv_size + head * s.head_dim + d]);
        k_got.push_back(bf16_bits_to_float(k_host[slot + d]));
        v_got.push_back(bf16_bits_to_float(v_host[slot + d]));
        written[slot + d] = true;
      }
    }
  }
  EXPECT_EQ(testing::count_nan(q_host), 0u);
  EXPECT_LT(testing::relative_error(q_host, q_ref), kTolerance) << "q";
  EXPECT_LT(testing::relative_error(k_got, k_ref), kTolerance) << "k";
  EXPECT_LT(testing::relative_error(v_got, v_ref), kTolerance) << "v";
  size_t stray = 0;
  for (size_t i = 0; i < pool; ++i)
    stray += !written[i] && (k_host[i] != kSentinelBits || v_host[i] != kSentinelBits);
  EXPECT_EQ(stray, 0u) << "cache slots written that belong to no token";
  if (pending) EXPECT_EQ(pending_dev.to_host<float>(sums.size()), sums) << "the pending sum is the o_proj's to clear";
}

TEST(QkvRopeFused, MatchesReferenceAcrossShapesAndTokenCounts) {
  DF_REQUIRE_GPU();
  const std::vector<QkvShape> shapes = {
      {256, 4, 2, 64, false, false},     // tiny: clusters of 4 (of 8 at 32 tokens), 4 (2) k-steps per block
      {896, 14, 2, 64, true, false},     // Qwen2.5-0.5B-like: bias, 7 q heads per kv head
      {2048, 32, 8, 64, false, true},    // Llama-3.2-1B (clusters of 4 up to 16 tokens)
      {3584, 28, 4, 128, true, false},   // Qwen2.5-7B
      {4096, 32, 8, 128, false, true},   // Llama-3-8B (packed at <= 8 tokens; at 9-16 a spread grid, clusters of 6 on an H200)
      {4096, 64, 8, 128, false, false},  // 80 head units: too many for a spread grid on an H200, the packed one
      {64, 2, 1, 128, false, false},     // hidden below a cluster's worth of k-steps: C = 1
  };
  uint64_t salt = 100;
  for (const QkvShape& s : shapes)
    for (int tokens : {1, 3, 8, 13, 32}) check_case(s, tokens, ++salt);
}

// The decode step's deferred MLP sum, added to x as the residual stream would hold it.
TEST(QkvRopeFused, AddsAPendingSumToX) {
  DF_REQUIRE_GPU();
  uint64_t salt = 200;
  for (const QkvShape& s : {QkvShape{2048, 32, 8, 64, false, true}, QkvShape{3584, 28, 4, 128, true, false},
                            QkvShape{4096, 32, 8, 128, false, true}})
    for (int tokens : {1, 8, 16}) check_case(s, tokens, ++salt, true);
}

// FP8 weights, per-row and 128x128-block scales, on the shapes whose q and kv sizes tile the blocks.
TEST(QkvRopeFused, Fp8WeightsMatchTheirDequantizedReference) {
  DF_REQUIRE_GPU();
  uint64_t salt = 300;
  for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128})
    for (const QkvShape& s : {QkvShape{2048, 32, 8, 64, false, true}, QkvShape{3584, 28, 4, 128, true, false},
                              QkvShape{4096, 32, 8, 128, false, true}, QkvShape{256, 4, 2, 64, false, false}})
      for (int tokens : {1, 3, 8, 13, 32}) check_case(s, tokens, ++salt, tokens == 3, format);
}

TEST(QkvRopeFused, RejectsBadParams) {
  DF_REQUIRE_GPU();
  kernels::QkvRopeFusedParams p;  // all null
  EXPECT_EQ(kernels::launch_qkv_rope_fused(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(kernels::pack_qkv_weights(nullptr, nullptr, 16, 16, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
