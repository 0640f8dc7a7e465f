#include <gtest/gtest.h>

#include <cmath>

#include "deepfuse/bf16.hpp"
#include "deepfuse/reference.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

TEST(ReferenceMlp, SiluMatchesDefinition) {
  EXPECT_DOUBLE_EQ(reference::silu(0.0), 0.0);
  EXPECT_NEAR(reference::silu(1.0), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(reference::silu(-3.0), -3.0 / (1.0 + std::exp(3.0)), 1e-15);
}

// A hand-computable case: H = 2, I = 1, two tokens, with and without the residual.
TEST(ReferenceMlp, HandComputedTinyCase) {
  const float x[] = {1.0f, 2.0f, -1.0f, 0.5f};  // [2 tokens, H=2]
  const float gate[] = {0.5f, -0.25f};           // [I=1, H=2]
  const float up[] = {2.0f, 1.0f};
  const float down[] = {3.0f, -1.0f};  // [H=2, I=1]
  const float residual[] = {10.0f, 20.0f, 30.0f, 40.0f};
  double y[4];
  reference::swiglu_mlp(x, gate, up, down, residual, y, 2, 2, 1);
  for (int t = 0; t < 2; ++t) {
    const double g = gate[0] * x[2 * t] + gate[1] * x[2 * t + 1];
    const double u = up[0] * x[2 * t] + up[1] * x[2 * t + 1];
    const double a = g / (1 + std::exp(-g)) * u;
    EXPECT_NEAR(y[2 * t], residual[2 * t] + down[0] * a, 1e-6);
    EXPECT_NEAR(y[2 * t + 1], residual[2 * t + 1] + down[1] * a, 1e-6);
  }
}

// Each token is independent: a batch equals the tokens run one at a time.
TEST(ReferenceMlp, BatchEqualsTokenByToken) {
  auto rng = testing::make_rng(7);
  const int H = 64, I = 128, T = 3;
  const auto x = testing::random_uniform(rng, T * H, 1.0f);
  const auto gate = testing::random_uniform(rng, I * H, 0.1f);
  const auto up = testing::random_uniform(rng, I * H, 0.1f);
  const auto down = testing::random_uniform(rng, H * I, 0.1f);
  std::vector<double> batch(T * H), single(H);
  reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), nullptr, batch.data(), T, H, I);
  for (int t = 0; t < T; ++t) {
    reference::swiglu_mlp(x.data() + t * H, gate.data(), up.data(), down.data(), nullptr, single.data(), 1, H, I);
    for (int h = 0; h < H; ++h) EXPECT_DOUBLE_EQ(batch[t * H + h], single[h]);
  }
}

TEST(ReferenceMlp, ActivationRoundingIsSmallButVisible) {
  auto rng = testing::make_rng(8);
  const int H = 64, I = 256;
  const auto x = testing::random_uniform(rng, H, 1.0f);
  const auto gate = testing::random_uniform(rng, I * H, 0.2f);
  const auto up = testing::random_uniform(rng, I * H, 0.2f);
  const auto down = testing::random_uniform(rng, H * I, 0.2f);
  std::vector<double> exact(H), rounded(H);
  reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), nullptr, exact.data(), 1, H, I, false);
  reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), nullptr, rounded.data(), 1, H, I, true);
  std::vector<float> rounded_f(rounded.begin(), rounded.end());
  const double err = testing::relative_error(rounded_f, exact);
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 1e-2);
}

}  // namespace
}  // namespace deepfuse
