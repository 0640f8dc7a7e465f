// The Hopper MLP pair's launcher contract (kernels/swiglu_wgmma.hpp), below MlpLayer: the act
// scratch and y poisoned with NaN before every call, act's rows of the call checked against
// bf16(silu(g)·u) and y against the fp64 reference, and the accumulator and row-tile counters
// left zero after every call (the contract that lets calls and graph replays skip a memset). Also
// the launcher's refusal of misaligned rows. sm_90 only (skipped elsewhere). MlpLayer's cases are in
// test_mlp_batched_gpu (--gtest_filter='*fused_wgmma*').
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;  // the MLP tests' bound
constexpr int kMaxTokens = kernels::kSwigluWgmmaMaxTokens;

void require_sm90() {
  int device = 0, major = 0;
  DF_CHECK_CUDA(cudaGetDevice(&device));
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) GTEST_SKIP() << "the Hopper MLP pair runs on sm_90 only";
}

std::vector<float> bf16_random(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> v = testing::random_uniform(rng, count, scale);
  for (auto& e : v) e = round_to_bf16(e);
  return v;
}

// One shape's weights (row-major gate_up [2I, H]: gate rows then up rows; down [H, I]), their
// tensor maps, x for kMaxTokens rows, and the launcher's scratch.
struct Pair {
  int hidden, intermediate;
  std::vector<float> x, gate, up, down;
  DeviceBuffer x_dev, gate_up_dev, down_dev, activations, accumulator, counters, y;
  kernels::SwigluWgmmaWeights maps;

  Pair(int h, int i, uint64_t salt) : hidden(h), intermediate(i) {
    auto rng = testing::make_rng(salt);
    const size_t hi = static_cast<size_t>(h) * i;
    x = bf16_random(rng, static_cast<size_t>(kMaxTokens) * h, 1.0f);
    gate = bf16_random(rng, hi, 1.7f / std::sqrt(static_cast<float>(h)));
    up = bf16_random(rng, hi, 1.7f / std::sqrt(static_cast<float>(h)));
    down = bf16_random(rng, hi, 1.7f / std::sqrt(static_cast<float>(i)));
    std::vector<float> gate_up(gate);
    gate_up.insert(gate_up.end(), up.begin(), up.end());
    x_dev = DeviceBuffer::from_host(to_bf16_bits(x));
    gate_up_dev = DeviceBuffer::from_host(to_bf16_bits(gate_up));
    down_dev = DeviceBuffer::from_host(to_bf16_bits(down));
    activations = DeviceBuffer(kernels::swiglu_wgmma_activation_elements(i, kMaxTokens) * 2);
    accumulator = DeviceBuffer(kernels::swiglu_wgmma_accumulator_floats(h, kMaxTokens) * sizeof(float));
    counters = DeviceBuffer(kernels::swiglu_wgmma_counter_words(h) * sizeof(unsigned));
    y = DeviceBuffer(static_cast<size_t>(kMaxTokens) * h * 2);
    accumulator.zero();
    counters.zero();
    DF_CHECK_CUDA(kernels::make_swiglu_wgmma_weights(gate_up_dev.as<__nv_bfloat16>(), down_dev.as<__nv_bfloat16>(), h,
                                                     i, maps));
  }

  kernels::SwigluWgmmaParams params(int tokens) {
    return {.x = x_dev.as<__nv_bfloat16>(), .weights = &maps, .y = y.as<__nv_bfloat16>(),
            .activations = activations.as<__nv_bfloat16>(), .accumulator = accumulator.as<float>(),
            .tile_counters = counters.as<unsigned>(), .tokens = tokens, .hidden = hidden, .intermediate = intermediate};
  }

  // silu(g)·u of row t, in double.
  std::vector<double> activation_row(int t) const {
    std::vector<double> row(intermediate);
    for (int r = 0; r < intermediate; ++r) {
      double g = 0, u = 0;
      for (int c = 0; c < hidden; ++c) {
        const double v = x[static_cast<size_t>(t) * hidden + c];
        g += v * gate[static_cast<size_t>(r) * hidden + c];
        u += v * up[static_cast<size_t>(r) * hidden + c];
      }
      row[r] = reference::silu(g) * u;
    }
    return row;
  }
};

// Every row of `got` ([rows, width]) against `want`; a failure message or "".
std::string check_rows(const std::vector<float>& got, const std::vector<double>& want, int rows, int width,
                       const char* what) {
  if (const size_t nan = testing::count_nan(got); nan > 0) return std::to_string(nan) + " NaN values in " + what;
  for (int t = 0; t < rows; ++t) {
    const auto begin = static_cast<size_t>(t) * width;
    const std::vector<float> row(got.begin() + begin, got.begin() + begin + width);
    const std::vector<double> ref(want.begin() + begin, want.begin() + begin + width);
    if (const double err = testing::relative_error(row, ref); !(err < kTolerance))
      return std::string(what) + " row " + std::to_string(t) + " relative error " + std::to_string(err);
  }
  return "";
}

class WgmmaPairContract : public ::testing::TestWithParam<std::pair<int, int>> {};

// 512x1024: phase 2 in 4 splits; 192x320: odd tile counts, one split; 896x4864: 17 or 9 uneven
// splits, two waves of phase-2 blocks at <= 64 tokens.
TEST_P(WgmmaPairContract, ActAndYRightScratchLeftZero) {
  DF_REQUIRE_GPU();
  require_sm90();
  const auto [hidden, intermediate] = GetParam();
  Pair pair(hidden, intermediate, static_cast<uint64_t>(hidden) * 31 + intermediate);
  std::vector<double> y_ref(static_cast<size_t>(kMaxTokens) * hidden);
  reference::swiglu_mlp(pair.x.data(), pair.gate.data(), pair.up.data(), pair.down.data(), nullptr, y_ref.data(),
                        kMaxTokens, hidden, intermediate);
  std::vector<double> act_ref;
  for (int t = 0; t < kMaxTokens; ++t) {
    const std::vector<double> row = pair.activation_row(t);
    act_ref.insert(act_ref.end(), row.begin(), row.end());
  }
  for (int tokens : {1, 7, 16, 17, 31, 64, 100, 128, 129, 255, 256, 3}) {
    DF_CHECK_CUDA(cudaMemset(pair.activations.data(), 0xff, pair.activations.bytes()));  // NaN bf16
    DF_CHECK_CUDA(cudaMemset(pair.y.data(), 0xff, pair.y.bytes()));
    ASSERT_EQ(kernels::launch_swiglu_wgmma(pair.params(tokens), nullptr), cudaSuccess) << "M=" << tokens;
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    const size_t acts = static_cast<size_t>(tokens) * intermediate, ys = static_cast<size_t>(tokens) * hidden;
    EXPECT_EQ(check_rows(bf16_bits_to_floats(pair.activations.to_host<uint16_t>(acts)), act_ref, tokens, intermediate,
                         "act"),
              "")
        << "M=" << tokens;
    EXPECT_EQ(check_rows(bf16_bits_to_floats(pair.y.to_host<uint16_t>(ys)), y_ref, tokens, hidden, "y"), "")
        << "M=" << tokens;
    // The tokens past M: act and y untouched (still the poison).
    const std::vector<uint16_t> y_all = pair.y.to_host<uint16_t>(static_cast<size_t>(kMaxTokens) * hidden);
    for (size_t k = ys; k < y_all.size(); ++k)
      ASSERT_EQ(y_all[k], 0xffff) << "M=" << tokens << " wrote y row " << k / hidden;
    for (float v : pair.accumulator.to_host<float>(static_cast<size_t>(kMaxTokens) * hidden))
      ASSERT_EQ(v, 0.0f) << "M=" << tokens << ": the accumulator is not left zero";
    for (unsigned c : pair.counters.to_host<unsigned>(kernels::swiglu_wgmma_counter_words(hidden)))
      ASSERT_EQ(c, 0u) << "M=" << tokens << ": a row-tile counter is not left zero";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WgmmaPairContract,
                         ::testing::Values(std::pair{512, 1024}, std::pair{192, 320}, std::pair{896, 4864}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
                         });

// TMA reads rows at 16-byte aligned addresses: x one element off is refused, not misread.
TEST(WgmmaPair, RefusesMisalignedRows) {
  DF_REQUIRE_GPU();
  require_sm90();
  Pair pair(128, 64, 5);
  kernels::SwigluWgmmaParams p = pair.params(4);
  p.x = pair.x_dev.as<__nv_bfloat16>() + 1;
  EXPECT_EQ(kernels::launch_swiglu_wgmma(p, nullptr), cudaErrorInvalidValue);
  p = pair.params(4);
  p.activations = pair.activations.as<__nv_bfloat16>() + 4;
  EXPECT_EQ(kernels::launch_swiglu_wgmma(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepfuse
