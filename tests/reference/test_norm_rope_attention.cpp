// The per-op references the GPU kernels are tested against: embedding, RMSNorm, RoPE, attention.
// Small hand-computed cases plus properties that must hold for any input.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(ReferenceEmbedding, CopiesRowsAndRejectsOutOfRangeIds) {
  const float table[] = {0, 1, 10, 11, 20, 21};  // vocab 3, hidden 2
  const int32_t ids[] = {2, 0, 2};
  float out[6];
  reference::embedding(table, 3, 2, ids, 3, out);
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{20, 21, 0, 1, 20, 21}));
  const int32_t bad[] = {3};
  EXPECT_THROW(reference::embedding(table, 3, 2, bad, 1, out), Error);
  const int32_t negative[] = {-1};
  EXPECT_THROW(reference::embedding(table, 3, 2, negative, 1, out), Error);
}

TEST(ReferenceRmsNorm, HandComputed) {
  // Row [3, 4]: mean of squares 12.5; with eps 0.5 the divisor is sqrt(13).
  const float x[] = {3, 4, -1, 1};
  const float weight[] = {1, 2};
  float out[4];
  reference::rms_norm(x, weight, 2, 2, 0.5f, out);
  EXPECT_NEAR(out[0], 3 / std::sqrt(13.0), 1e-6);
  EXPECT_NEAR(out[1], 2 * 4 / std::sqrt(13.0), 1e-6);
  EXPECT_NEAR(out[2], -1 / std::sqrt(1.5), 1e-6);
  EXPECT_NEAR(out[3], 2 / std::sqrt(1.5), 1e-6);
}

TEST(ReferenceRmsNorm, UnitWeightGivesUnitRms) {
  auto rng = testing::make_rng(21);
  const int rows = 3, hidden = 37;
  const auto x = testing::random_uniform(rng, rows * hidden, 5.0f);
  const std::vector<float> weight(hidden, 1.0f);
  std::vector<float> out(rows * hidden);
  reference::rms_norm(x.data(), weight.data(), rows, hidden, 0.0f, out.data());
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    for (int h = 0; h < hidden; ++h) sum += out[r * hidden + h] * out[r * hidden + h];
    EXPECT_NEAR(sum / hidden, 1.0, 1e-5);
  }
}

TEST(ReferenceRmsNorm, AddRmsNormUpdatesResidualThenNormalises) {
  auto rng = testing::make_rng(22);
  const int rows = 2, hidden = 19;
  auto residual = testing::random_uniform(rng, rows * hidden, 1.0f);
  const auto x = testing::random_uniform(rng, rows * hidden, 1.0f);
  const auto weight = testing::random_uniform(rng, hidden, 2.0f);
  std::vector<float> sum(rows * hidden), expected(rows * hidden), out(rows * hidden);
  for (int i = 0; i < rows * hidden; ++i) sum[i] = residual[i] + x[i];
  reference::rms_norm(sum.data(), weight.data(), rows, hidden, 1e-5f, expected.data());
  reference::add_rms_norm(residual.data(), x.data(), weight.data(), rows, hidden, 1e-5f, out.data());
  EXPECT_EQ(residual, sum);
  EXPECT_EQ(out, expected);
}

TEST(ReferenceRope, DefaultInverseFrequencies) {
  RopeParams params;
  params.head_dim = 4;
  params.theta = 10000.0;
  const auto inv_freq = rope_inverse_frequencies(params);
  ASSERT_EQ(inv_freq.size(), 2u);
  EXPECT_DOUBLE_EQ(inv_freq[0], 1.0);
  EXPECT_NEAR(inv_freq[1], 0.01, 1e-15);
}

// transformers' _compute_llama3_parameters, transcribed in its torch.where form (masks computed on
// the unscaled wavelengths, the medium band being neither strictly high nor strictly low).
std::vector<double> hf_llama3_inv_freq(const RopeParams& p) {
  std::vector<double> result;
  for (int i = 0; i < p.head_dim; i += 2) {
    const double inv_freq = 1.0 / std::pow(p.theta, static_cast<double>(i) / p.head_dim);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    const double low_freq_wavelen = p.original_max_position / p.low_freq_factor;
    const double high_freq_wavelen = p.original_max_position / p.high_freq_factor;
    const double llama = wavelen > low_freq_wavelen ? inv_freq / p.factor : inv_freq;
    const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                          (p.high_freq_factor - p.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / p.factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    result.push_back(medium ? smoothed : llama);
  }
  return result;
}

TEST(ReferenceRope, Llama3ScalingMatchesTransformersFormula) {
  RopeParams params;  // Llama 3.1 / 3.2 values
  params.head_dim = 128;
  params.theta = 500000.0;
  params.llama3_scaling = true;
  params.factor = 32.0;
  params.low_freq_factor = 1.0;
  params.high_freq_factor = 4.0;
  params.original_max_position = 8192;
  const auto ours = rope_inverse_frequencies(params);
  const auto theirs = hf_llama3_inv_freq(params);
  ASSERT_EQ(ours.size(), theirs.size());
  int scaled = 0, kept = 0, smoothed = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NEAR(ours[i], theirs[i], 1e-12 * theirs[i]) << "i=" << i;
    const double plain = 1.0 / std::pow(params.theta, 2.0 * i / params.head_dim);
    if (ours[i] == plain) ++kept;
    else if (std::abs(ours[i] - plain / params.factor) < 1e-15 * plain) ++scaled;
    else ++smoothed;
  }
  // All three bands occur for these parameters, so each branch was exercised.
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(ReferenceRope, QuarterTurnRotatesPairs) {
  // head_dim 2: one pair (x0, x1); an angle of pi/2 maps it to (-x1, x0).
  float x[] = {3.0f, 5.0f, -1.0f, 2.0f};  // 2 heads
  const double inv_freq[] = {std::numbers::pi / 2};
  reference::apply_rope(x, 2, 2, 1, inv_freq);
  EXPECT_NEAR(x[0], -5.0f, 1e-6);
  EXPECT_NEAR(x[1], 3.0f, 1e-6);
  EXPECT_NEAR(x[2], -2.0f, 1e-6);
  EXPECT_NEAR(x[3], -1.0f, 1e-6);
}

TEST(ReferenceRope, PositionZeroIsIdentityAndNormsArePreserved) {
  auto rng = testing::make_rng(23);
  RopeParams params;
  params.head_dim = 16;
  const auto inv_freq = rope_inverse_frequencies(params);
  const int heads = 3;
  const auto x = testing::random_uniform(rng, heads * 16, 1.0f);
  auto at_zero = x;
  reference::apply_rope(at_zero.data(), heads, 16, 0, inv_freq);
  EXPECT_EQ(at_zero, x);
  auto rotated = x;
  reference::apply_rope(rotated.data(), heads, 16, 1234, inv_freq);
  EXPECT_NE(rotated, x);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < 8; ++i) {  // each (i, i + 8) pair keeps its length
      const float* a = &x[h * 16];
      const float* b = &rotated[h * 16];
      EXPECT_NEAR(std::hypot(a[i], a[i + 8]), std::hypot(b[i], b[i + 8]), 1e-5);
    }
}

// The reason RoPE exists: q·k after rotation depends only on the distance between positions.
TEST(ReferenceRope, DotProductDependsOnlyOnRelativePosition) {
  auto rng = testing::make_rng(24);
  RopeParams params;
  params.head_dim = 32;
  const auto inv_freq = rope_inverse_frequencies(params);
  const auto q = testing::random_uniform(rng, 32, 1.0f);
  const auto k = testing::random_uniform(rng, 32, 1.0f);
  auto rotated_dot = [&](int q_position, int k_position) {
    auto qr = q, kr = k;
    reference::apply_rope(qr.data(), 1, 32, q_position, inv_freq);
    reference::apply_rope(kr.data(), 1, 32, k_position, inv_freq);
    double dot = 0;
    for (int d = 0; d < 32; ++d) dot += static_cast<double>(qr[d]) * kr[d];
    return dot;
  };
  EXPECT_NEAR(rotated_dot(7, 3), rotated_dot(104, 100), 1e-5);
  EXPECT_NEAR(rotated_dot(3, 7), rotated_dot(50, 54), 1e-5);
}

TEST(ReferenceAttention, OneKeyReturnsItsValue) {
  auto rng = testing::make_rng(25);
  const int q_heads = 4, kv_heads = 2, head_dim = 8;
  const auto q = testing::random_uniform(rng, q_heads * head_dim, 3.0f);
  const auto k = testing::random_uniform(rng, kv_heads * head_dim, 3.0f);
  const auto v = testing::random_uniform(rng, kv_heads * head_dim, 3.0f);
  std::vector<float> out(q_heads * head_dim);
  reference::attention_decode(q.data(), k.data(), v.data(), 1, q_heads, kv_heads, head_dim, 0.5f, 0, out.data());
  for (int h = 0; h < q_heads; ++h)  // q heads 0,1 use kv head 0; 2,3 use kv head 1
    for (int d = 0; d < head_dim; ++d) EXPECT_FLOAT_EQ(out[h * head_dim + d], v[(h / 2) * head_dim + d]);
}

TEST(ReferenceAttention, HandComputedSoftmaxOverTwoKeys) {
  // head_dim 1, scale 1: scores q*k = {0, ln 3}, weights {1/4, 3/4}.
  const float q[] = {1.0f};
  const float k[] = {0.0f, static_cast<float>(std::log(3.0))};
  const float v[] = {8.0f, 4.0f};
  float out[1];
  reference::attention_decode(q, k, v, 2, 1, 1, 1, 1.0f, 0, out);
  EXPECT_NEAR(out[0], 8.0 / 4 + 4.0 * 3 / 4, 1e-6);
}

TEST(ReferenceAttention, SlidingWindowEqualsAttentionOverTheLastKeys) {
  auto rng = testing::make_rng(26);
  const int q_heads = 6, kv_heads = 2, head_dim = 5, length = 9, window = 4;
  const auto q = testing::random_uniform(rng, q_heads * head_dim, 1.0f);
  const auto k = testing::random_uniform(rng, length * kv_heads * head_dim, 1.0f);
  const auto v = testing::random_uniform(rng, length * kv_heads * head_dim, 1.0f);
  const float scale = 1.0f / std::sqrt(5.0f);
  std::vector<float> windowed(q_heads * head_dim), suffix(q_heads * head_dim), full(q_heads * head_dim);
  reference::attention_decode(q.data(), k.data(), v.data(), length, q_heads, kv_heads, head_dim, scale, window,
                              windowed.data());
  const size_t skipped = static_cast<size_t>(length - window) * kv_heads * head_dim;
  reference::attention_decode(q.data(), k.data() + skipped, v.data() + skipped, window, q_heads, kv_heads, head_dim,
                              scale, 0, suffix.data());
  reference::attention_decode(q.data(), k.data(), v.data(), length, q_heads, kv_heads, head_dim, scale, 0,
                              full.data());
  EXPECT_EQ(windowed, suffix);
  EXPECT_NE(windowed, full);
  // A window at least as long as the cache changes nothing.
  std::vector<float> wide(q_heads * head_dim);
  reference::attention_decode(q.data(), k.data(), v.data(), length, q_heads, kv_heads, head_dim, scale, length,
                              wide.data());
  EXPECT_EQ(wide, full);
}

TEST(ReferenceAttention, RejectsHeadCountsThatDoNotGroup) {
  const float x[6] = {};
  float out[3];
  EXPECT_THROW(reference::attention_decode(x, x, x, 1, 3, 2, 1, 1.0f, 0, out), Error);
}

TEST(ReferenceAttentionPrefill, CausalRowsWindowOfOneAndChunking) {
  auto rng = testing::make_rng(27);
  const int q_heads = 4, kv_heads = 2, head_dim = 3, length = 7;
  const size_t row = static_cast<size_t>(q_heads) * head_dim, kv_row = static_cast<size_t>(kv_heads) * head_dim;
  const auto q = testing::random_uniform(rng, length * row, 2.0f);
  const auto k = testing::random_uniform(rng, length * kv_row, 1.0f);
  const auto v = testing::random_uniform(rng, length * kv_row, 1.0f);
  const float scale = 0.7f;
  std::vector<float> full(length * row);
  reference::attention_prefill(q.data(), k.data(), v.data(), 0, length, q_heads, kv_heads, head_dim, scale, 0,
                               full.data());
  // Position 0 sees only key 0: its output is v[0] of the head's kv head.
  for (int h = 0; h < q_heads; ++h)
    for (int d = 0; d < head_dim; ++d) EXPECT_FLOAT_EQ(full[h * head_dim + d], v[(h / 2) * head_dim + d]);
  // The last row sees everything: plain decode attention over the whole cache.
  std::vector<float> last(row);
  reference::attention_decode(q.data() + (length - 1) * row, k.data(), v.data(), length, q_heads, kv_heads, head_dim,
                              scale, 0, last.data());
  EXPECT_EQ(std::vector<float>(full.end() - row, full.end()), last);
  // A chunk starting at position 3 gives the same rows as the whole prompt did.
  std::vector<float> chunk((length - 3) * row);
  reference::attention_prefill(q.data() + 3 * row, k.data(), v.data(), 3, length - 3, q_heads, kv_heads, head_dim,
                               scale, 0, chunk.data());
  EXPECT_EQ(chunk, std::vector<float>(full.begin() + 3 * row, full.end()));
  // A window of one: every position sees only its own key.
  std::vector<float> own(length * row);
  reference::attention_prefill(q.data(), k.data(), v.data(), 0, length, q_heads, kv_heads, head_dim, scale, 1,
                               own.data());
  for (int p = 0; p < length; ++p)
    for (int h = 0; h < q_heads; ++h)
      for (int d = 0; d < head_dim; ++d)
        EXPECT_FLOAT_EQ(own[p * row + h * head_dim + d], v[p * kv_row + (h / 2) * head_dim + d]) << "position " << p;
}

TEST(ReferenceAttentionPrefill, RejectsEmptyChunksAndNegativeStarts) {
  const float x[6] = {};
  float out[6];
  EXPECT_THROW(reference::attention_prefill(x, x, x, 0, 0, 1, 1, 1, 1.0f, 0, out), Error);
  EXPECT_THROW(reference::attention_prefill(x, x, x, -1, 2, 1, 1, 1, 1.0f, 0, out), Error);
}

}  // namespace
}  // namespace deepfuse
