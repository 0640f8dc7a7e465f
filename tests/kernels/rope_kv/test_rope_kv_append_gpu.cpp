// RoPE + paged KV append against reference::apply_rope (+ bias) on fresh random inputs: several
// sequences at different positions (position 0, page boundaries, a prefill run), a padded token,
// pages a random permutation, GQA, head_dim 64 / 72 / 128, default and llama3 rope frequencies.
// q_out is poisoned with NaN; the caches are filled with a sentinel, and every slot that should
// not be written must still hold it. Also with a folded input norm: every token's values scaled by
// 1/rms of its own residual row before the bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::kKvPageSize;

constexpr uint16_t kNanBits = 0x7fc0;
constexpr uint16_t kSentinelBits = 0x4b1d;  // 1.03e7: no rotated value comes near it
constexpr double kTolerance = 1e-2;

struct RopeCase {
  std::string name;
  int q_heads, kv_heads, head_dim;
  bool bias;
  RopeParams rope;
  int norm_hidden = 0;  // > 0: a folded input norm over residual rows this wide
};

// 1/sqrt(mean(row^2) + eps), the scale a folded norm applies.
double inverse_rms(const float* row, int hidden, double eps) {
  double sum = 0.0;
  for (int i = 0; i < hidden; ++i) sum += static_cast<double>(row[i]) * row[i];
  return 1.0 / std::sqrt(sum / hidden + eps);
}

struct Token {
  int sequence, position;
};

// Tokens of one step: decode tokens of several sequences, a prefill run crossing pages, a padded
// slot. No two real tokens share (sequence, position).
std::vector<Token> make_tokens(std::mt19937_64& rng, int sequences, int max_position) {
  std::vector<Token> tokens = {{0, 0}, {1, 15}, {2, 16}, {3, max_position - 1}, {4, 1}};
  const int run_start = 30;
  for (int p = run_start; p < run_start + 37; ++p) tokens.push_back({2, p});  // pages 1..4 of sequence 2
  tokens.push_back({1, -1});                                                    // padded slot
  std::uniform_int_distribution<int> position(100, max_position - 2);
  for (int s = 0; s < sequences; ++s) {
    const int p = position(rng);
    const bool taken = std::any_of(tokens.begin(), tokens.end(), [&](const Token& t) { return t.sequence == s && t.position == p; });
    if (!taken) tokens.push_back({s, p});
  }
  std::shuffle(tokens.begin(), tokens.end(), rng);
  return tokens;
}

void run_case(const RopeCase& c, uint64_t salt) {
  auto rng = testing::make_rng(salt);
  const int sequences = 5, max_pages = 12, max_position = max_pages * kKvPageSize;
  const int num_pages = sequences * max_pages;
  const int d = c.head_dim, heads = c.q_heads + 2 * c.kv_heads, width = heads * d;
  const std::vector<Token> tokens = make_tokens(rng, sequences, max_position);
  const int count = static_cast<int>(tokens.size());

  std::vector<float> qkv = testing::random_uniform(rng, static_cast<size_t>(count) * width, 2.0f);
  std::vector<float> bias = c.bias ? testing::random_uniform(rng, width, 0.5f) : std::vector<float>(width, 0.0f);
  for (float& v : qkv) v = round_to_bf16(v);
  for (float& v : bias) v = round_to_bf16(v);
  constexpr float kEps = 1e-5f;
  std::vector<float> residual = testing::random_uniform(rng, static_cast<size_t>(count) * c.norm_hidden, 3.0f);
  for (float& v : residual) v = round_to_bf16(v);
  std::vector<int32_t> block_table(num_pages);
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  std::vector<int32_t> positions, sequence_of;
  for (const Token& t : tokens) positions.push_back(t.position), sequence_of.push_back(t.sequence);
  const std::vector<double> inv_freq = rope_inverse_frequencies(c.rope);
  const std::vector<float> inv_freq_f(inv_freq.begin(), inv_freq.end());

  const size_t pool = static_cast<size_t>(num_pages) * c.kv_heads * kKvPageSize * d;
  DeviceBuffer qkv_dev = DeviceBuffer::from_host(to_bf16_bits(qkv));
  DeviceBuffer bias_dev = DeviceBuffer::from_host(to_bf16_bits(bias));
  DeviceBuffer inv_freq_dev = DeviceBuffer::from_host(inv_freq_f);
  DeviceBuffer positions_dev = DeviceBuffer::from_host(positions);
  DeviceBuffer sequences_dev = DeviceBuffer::from_host(sequence_of);
  DeviceBuffer table_dev = DeviceBuffer::from_host(block_table);
  DeviceBuffer q_out = DeviceBuffer::from_host(std::vector<uint16_t>(static_cast<size_t>(count) * c.q_heads * d, kNanBits));
  DeviceBuffer k_pages = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  DeviceBuffer v_pages = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  DeviceBuffer residual_dev;
  if (c.norm_hidden) residual_dev = DeviceBuffer::from_host(to_bf16_bits(residual));

  kernels::RopeKvAppendParams params;
  params.qkv = qkv_dev.as<__nv_bfloat16>();
  params.qkv_bias = c.bias ? bias_dev.as<__nv_bfloat16>() : nullptr;
  if (c.norm_hidden) params.input_norm = {residual_dev.as<__nv_bfloat16>(), c.norm_hidden, kEps};
  params.inv_freq = inv_freq_dev.as<float>();
  params.positions = positions_dev.as<int32_t>();
  params.sequences = sequences_dev.as<int32_t>();
  params.q_out = q_out.as<__nv_bfloat16>();
  params.kv.k_pages = k_pages.as<__nv_bfloat16>();
  params.kv.v_pages = v_pages.as<__nv_bfloat16>();
  params.kv.block_table = table_dev.as<int32_t>();
  params.kv.max_pages_per_seq = max_pages;
  params.kv.kv_heads = c.kv_heads;
  params.kv.head_dim = d;
  params.tokens = count;
  params.q_heads = c.q_heads;
  DF_CHECK_CUDA(kernels::launch_rope_kv_append(params, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> q_gpu = bf16_bits_to_floats(q_out.to_host<uint16_t>(static_cast<size_t>(count) * c.q_heads * d));
  const std::vector<uint16_t> k_bits = k_pages.to_host<uint16_t>(pool), v_bits = v_pages.to_host<uint16_t>(pool);

  // Reference: scaled by a folded norm's 1/rms, bias added in fp32 (as the kernel does), then
  // rotated; padded tokens: zero q.
  std::vector<double> q_ref(q_gpu.size(), 0.0), k_ref, v_ref;
  std::vector<float> k_gpu, v_gpu;
  std::vector<bool> written(pool, false);
  kernels::PagedKv layout = params.kv;
  layout.block_table = block_table.data();  // token_offset on the host copy
  for (int t = 0; t < count; ++t) {
    if (tokens[t].position < 0) continue;
    std::vector<float> row(qkv.begin() + static_cast<size_t>(t) * width, qkv.begin() + static_cast<size_t>(t + 1) * width);
    const float* residual_row = residual.data() + static_cast<size_t>(t) * c.norm_hidden;
    const double scale = c.norm_hidden ? inverse_rms(residual_row, c.norm_hidden, kEps) : 1.0;
    for (int i = 0; i < width; ++i) row[i] = static_cast<float>(row[i] * scale + bias[i]);
    reference::apply_rope(row.data(), c.q_heads, d, tokens[t].position, inv_freq);
    reference::apply_rope(row.data() + c.q_heads * d, c.kv_heads, d, tokens[t].position, inv_freq);
    for (int i = 0; i < c.q_heads * d; ++i) q_ref[static_cast<size_t>(t) * c.q_heads * d + i] = row[i];
    for (int h = 0; h < c.kv_heads; ++h) {
      const size_t offset = layout.token_offset(tokens[t].sequence, tokens[t].position, h);
      for (int i = 0; i < d; ++i) {
        written[offset + i] = true;
        k_ref.push_back(row[(c.q_heads + h) * d + i]);
        v_ref.push_back(row[(c.q_heads + c.kv_heads + h) * d + i]);
        k_gpu.push_back(bf16_bits_to_float(k_bits[offset + i]));
        v_gpu.push_back(bf16_bits_to_float(v_bits[offset + i]));
      }
    }
  }
  EXPECT_EQ(testing::count_nan(q_gpu), 0u) << c.name;
  EXPECT_LT(testing::relative_error(q_gpu, q_ref), kTolerance) << c.name << ": q";
  EXPECT_LT(testing::relative_error(k_gpu, k_ref), kTolerance) << c.name << ": k in the cache";
  EXPECT_LT(testing::relative_error(v_gpu, v_ref), kTolerance) << c.name << ": v in the cache";
  // v is only biased and rounded: one fp32 add and one rounding on both sides (without a norm).
  for (size_t i = 0; i < (c.norm_hidden ? 0 : v_ref.size()); ++i)
    ASSERT_EQ(v_gpu[i], round_to_bf16(static_cast<float>(v_ref[i]))) << c.name << ": v element " << i;
  for (int t = 0; t < count; ++t)
    if (tokens[t].position < 0)
      for (int i = 0; i < c.q_heads * d; ++i)
        ASSERT_EQ(q_gpu[static_cast<size_t>(t) * c.q_heads * d + i], 0.0f) << c.name << ": padded token " << t;
  for (size_t i = 0; i < pool; ++i) {
    if (written[i]) continue;
    ASSERT_EQ(k_bits[i], kSentinelBits) << c.name << ": k pool element " << i << " written";
    ASSERT_EQ(v_bits[i], kSentinelBits) << c.name << ": v pool element " << i << " written";
  }
}

RopeParams rope(int head_dim, double theta, bool llama3) {
  RopeParams p;
  p.head_dim = head_dim;
  p.theta = theta;
  p.llama3_scaling = llama3;
  return p;
}

TEST(RopeKvAppendGpu, MatchesReference) {
  DF_REQUIRE_GPU();
  const std::vector<RopeCase> cases = {
      {"llama3 d128 GQA 32/8", 32, 8, 128, false, rope(128, 500000.0, true)},
      {"qwen2 d128 bias GQA 28/4", 28, 4, 128, true, rope(128, 1000000.0, false)},
      {"d64 GQA 8/2 bias", 8, 2, 64, true, rope(64, 10000.0, false)},
      {"d64 MHA 4/4", 4, 4, 64, false, rope(64, 10000.0, true)},
      {"d72 (4-wide chunks) GQA 7/1 bias", 7, 1, 72, true, rope(72, 10000.0, false)},
      {"folded norm, llama3 d128 GQA 32/8", 32, 8, 128, false, rope(128, 500000.0, true), 4096},
      {"folded norm, qwen2 d128 bias GQA 28/4", 28, 4, 128, true, rope(128, 1000000.0, false), 3584},
      {"folded norm, d72 GQA 7/1 bias", 7, 1, 72, true, rope(72, 10000.0, false), 904},
      {"folded norm, 128/16 heads: two blocks per token", 128, 16, 128, false, rope(128, 10000.0, false), 1024},
  };
  uint64_t salt = 601;
  for (const RopeCase& c : cases) run_case(c, salt++);
}

// A long prefill of one sequence: every position 0..299, 19 pages.
TEST(RopeKvAppendGpu, PrefillChunk) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(610);
  const int q_heads = 12, kv_heads = 2, d = 128, tokens = 300, max_pages = 20;
  const int heads = q_heads + 2 * kv_heads, width = heads * d;
  std::vector<float> qkv = testing::random_uniform(rng, static_cast<size_t>(tokens) * width, 1.0f);
  for (float& v : qkv) v = round_to_bf16(v);
  std::vector<int32_t> positions(tokens), sequences(tokens, 0), block_table(max_pages);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  const auto inv_freq = rope_inverse_frequencies(rope(d, 500000.0, true));
  const std::vector<float> inv_freq_f(inv_freq.begin(), inv_freq.end());
  const size_t pool = static_cast<size_t>(max_pages) * kv_heads * kKvPageSize * d;

  DeviceBuffer qkv_dev = DeviceBuffer::from_host(to_bf16_bits(qkv)), inv_dev = DeviceBuffer::from_host(inv_freq_f);
  DeviceBuffer pos_dev = DeviceBuffer::from_host(positions), seq_dev = DeviceBuffer::from_host(sequences);
  DeviceBuffer table_dev = DeviceBuffer::from_host(block_table);
  DeviceBuffer q_out = DeviceBuffer::from_host(std::vector<uint16_t>(static_cast<size_t>(tokens) * q_heads * d, kNanBits));
  DeviceBuffer k_pages = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  DeviceBuffer v_pages = DeviceBuffer::from_host(std::vector<uint16_t>(pool, kSentinelBits));
  kernels::RopeKvAppendParams params;
  params.qkv = qkv_dev.as<__nv_bfloat16>();
  params.inv_freq = inv_dev.as<float>();
  params.positions = pos_dev.as<int32_t>();
  params.sequences = seq_dev.as<int32_t>();
  params.q_out = q_out.as<__nv_bfloat16>();
  params.kv = {k_pages.as<__nv_bfloat16>(), v_pages.as<__nv_bfloat16>(), table_dev.as<int32_t>(), max_pages, kv_heads, d};
  params.tokens = tokens;
  params.q_heads = q_heads;
  DF_CHECK_CUDA(kernels::launch_rope_kv_append(params, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  const auto q_gpu = bf16_bits_to_floats(q_out.to_host<uint16_t>(static_cast<size_t>(tokens) * q_heads * d));
  const auto k_gpu_all = bf16_bits_to_floats(k_pages.to_host<uint16_t>(pool));

  std::vector<double> q_ref, k_ref;
  std::vector<float> k_gpu;
  kernels::PagedKv layout = params.kv;
  layout.block_table = block_table.data();
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> row(qkv.begin() + static_cast<size_t>(t) * width, qkv.begin() + static_cast<size_t>(t + 1) * width);
    reference::apply_rope(row.data(), q_heads + kv_heads, d, t, inv_freq);  // q and k heads are adjacent
    q_ref.insert(q_ref.end(), row.begin(), row.begin() + q_heads * d);
    for (int h = 0; h < kv_heads; ++h) {
      const size_t offset = layout.token_offset(0, t, h);
      for (int i = 0; i < d; ++i) k_ref.push_back(row[(q_heads + h) * d + i]), k_gpu.push_back(k_gpu_all[offset + i]);
    }
  }
  EXPECT_EQ(testing::count_nan(q_gpu), 0u);
  EXPECT_LT(testing::relative_error(q_gpu, q_ref), kTolerance);
  EXPECT_LT(testing::relative_error(k_gpu, k_ref), kTolerance);
}

}  // namespace
}  // namespace deepfuse
