// The batched fused MLP (MlpVariant::fused_batched, kernels/swiglu_batched.hpp) against the fp64
// CPU reference on fresh random inputs, outputs poisoned with NaN before each launch, every row
// checked on its own. Every token count 1..256 on the serving shapes (the MLP is row-independent,
// so one reference of 256 rows serves every M); DEEPFUSE_TEST_QUICK=1 keeps the small shapes and
// a few token counts for the compute-sanitizer runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;
constexpr int kMaxTokens = kernels::kSwigluBatchedMaxTokens;

struct Inputs {
  MlpShape shape;
  std::vector<float> x, gate, up, down, norm_weight;
  DeviceBuffer x_dev, gate_dev, up_dev, down_dev, norm_dev;

  Inputs(MlpShape s, uint64_t salt) : shape(s) {
    auto rng = testing::make_rng(salt);
    const size_t hi = static_cast<size_t>(s.hidden) * s.intermediate;
    auto bf16_values = [&](size_t n, float scale, float offset, DeviceBuffer& device) {
      std::vector<float> v = testing::random_uniform(rng, n, scale);
      for (auto& e : v) e = round_to_bf16(e + offset);
      device = DeviceBuffer::from_host(to_bf16_bits(v));
      return v;
    };
    x = bf16_values(static_cast<size_t>(kMaxTokens) * s.hidden, 1.0f, 0.0f, x_dev);
    gate = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.hidden)), 0.0f, gate_dev);
    up = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.hidden)), 0.0f, up_dev);
    down = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.intermediate)), 0.0f, down_dev);
    norm_weight = bf16_values(s.hidden, 0.5f, 1.0f, norm_dev);
  }
  MlpHfWeights weights() const { return MlpHfWeights::bf16(gate_dev.data(), up_dev.data(), down_dev.data(), shape); }

  // All kMaxTokens rows of mlp(x), or of x + mlp(rms_norm(x) * norm_weight).
  std::vector<double> reference(bool normalized_in_place, float eps) const {
    std::vector<double> y(x.size());
    if (!normalized_in_place) {
      reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), nullptr, y.data(), kMaxTokens, shape.hidden,
                            shape.intermediate);
      return y;
    }
    std::vector<float> normed(x.size());
    reference::rms_norm(x.data(), norm_weight.data(), kMaxTokens, shape.hidden, eps, normed.data());
    reference::swiglu_mlp(normed.data(), gate.data(), up.data(), down.data(), x.data(), y.data(), kMaxTokens,
                          shape.hidden, shape.intermediate);
    return y;
  }
};

std::string name_of(const MlpShape& s) { return std::to_string(s.hidden) + "x" + std::to_string(s.intermediate); }

// The first `tokens` rows of y against the reference's, row by row; returns a failure message or "".
std::string check_rows(const std::vector<float>& y, const std::vector<double>& ref, int tokens, int hidden) {
  if (const size_t nan = testing::count_nan(y); nan > 0) return std::to_string(nan) + " NaN outputs";
  for (int t = 0; t < tokens; ++t) {
    const auto begin = static_cast<size_t>(t) * hidden;
    const std::vector<float> row(y.begin() + begin, y.begin() + begin + hidden);
    const std::vector<double> want(ref.begin() + begin, ref.begin() + begin + hidden);
    if (const double err = testing::relative_error(row, want); !(err < kTolerance))
      return "row " + std::to_string(t) + " relative error " + std::to_string(err);
  }
  return "";
}

std::vector<float> run_poisoned(MlpLayer& layer, const Inputs& in, int tokens) {
  const size_t count = static_cast<size_t>(tokens) * in.shape.hidden;
  DeviceBuffer y = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
  layer.run(in.x_dev.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), tokens, nullptr);
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return bf16_bits_to_floats(y.to_host<uint16_t>(count));
}

// stream = stream + mlp(rms_norm(stream) * w) in place, as a decode step runs it.
std::vector<float> run_in_place(MlpLayer& layer, const Inputs& in, int tokens) {
  const size_t count = static_cast<size_t>(tokens) * in.shape.hidden;
  DeviceBuffer stream = DeviceBuffer::from_host(to_bf16_bits(std::vector<float>(in.x.begin(), in.x.begin() + count)));
  auto* s = stream.as<__nv_bfloat16>();
  layer.run(s, s, s, tokens, nullptr);
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return bf16_bits_to_floats(stream.to_host<uint16_t>(count));
}

bool large(const MlpShape& s) { return static_cast<size_t>(s.hidden) * s.intermediate > size_t{2048} * 2048; }

// Every token count the variant takes (quick mode: pass boundaries and odd counts around them).
std::vector<int> token_counts() {
  if (testing::quick_mode()) return {1, 2, 15, 16, 17, 33, 64, 65, 127, 128, 129, 200, 256};
  std::vector<int> all(kMaxTokens);
  for (int m = 1; m <= kMaxTokens; ++m) all[m - 1] = m;
  return all;
}

class BatchedMlpVsReference : public ::testing::TestWithParam<MlpShape> {};

TEST_P(BatchedMlpVsReference, EveryTokenCountPlainAndNormalizedInPlace) {
  DF_REQUIRE_GPU();
  const MlpShape shape = GetParam();
  if (testing::quick_mode() && large(shape)) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: large shape skipped";
  const Inputs in(shape, shape.hidden * 977 + shape.intermediate);
  const float eps = 1e-5f;
  MlpLayer plain(MlpVariant::fused_batched, shape, kMaxTokens);
  plain.load_weights(in.weights(), nullptr);
  MlpLayer normalized(MlpVariant::fused_batched, shape, kMaxTokens);
  normalized.load_weights(in.weights(), nullptr, MlpNorm{in.norm_dev.as<__nv_bfloat16>(), eps});
  const std::vector<double> ref = in.reference(false, eps);
  const std::vector<double> ref_normalized = in.reference(true, eps);
  for (int tokens : token_counts()) {
    const std::string plain_failure = check_rows(run_poisoned(plain, in, tokens), ref, tokens, shape.hidden);
    EXPECT_EQ(plain_failure, "") << name_of(shape) << " M=" << tokens;
    // The residual add and the folded norm on every token count in quick mode, on a spread of
    // them (every pass size, odd counts) otherwise.
    if (!testing::quick_mode() && tokens % 7 != 1 && tokens % 16 != 0) continue;
    const std::string normalized_failure =
        check_rows(run_in_place(normalized, in, tokens), ref_normalized, tokens, shape.hidden);
    EXPECT_EQ(normalized_failure, "") << name_of(shape) << " normalized in place, M=" << tokens;
  }
}

// The three serving shapes of the issue, and small ones where blocks own few tiles or a grid of
// fewer blocks than SMs (I / 16 < SMs), a hidden size that is one phase-2 row group, and an I tile
// count that does not split evenly.
INSTANTIATE_TEST_SUITE_P(Shapes, BatchedMlpVsReference,
                         ::testing::Values(MlpShape{128, 64}, MlpShape{256, 192}, MlpShape{896, 4864},
                                           MlpShape{1152, 3136}, MlpShape{4096, 14336}, MlpShape{3584, 18944},
                                           MlpShape{5120, 13824}),
                         [](const auto& info) { return name_of(info.param); });

// The kernel leaves its accumulator and grid barrier as it found them: back-to-back calls of
// different token counts (one pass, two passes, one again) must each be right.
TEST(BatchedMlp, BackToBackCallsStayCorrect) {
  DF_REQUIRE_GPU();
  const MlpShape shape{1024, 2048};
  const Inputs in(shape, 31);
  const std::vector<double> ref = in.reference(false, 1e-5f);
  MlpLayer layer(MlpVariant::fused_batched, shape, kMaxTokens);
  layer.load_weights(in.weights(), nullptr);
  for (int tokens : {5, 256, 1, 129, 64, 33, 5})
    EXPECT_EQ(check_rows(run_poisoned(layer, in, tokens), ref, tokens, shape.hidden), "") << "M=" << tokens;
}

// Captured once into a CUDA graph and replayed with new inputs: the decode step's usage.
TEST(BatchedMlp, GraphReplayWithNewInputs) {
  DF_REQUIRE_GPU();
  const MlpShape shape{768, 2048};
  const int tokens = 48;
  const Inputs first(shape, 41), second(shape, 42);
  MlpLayer layer(MlpVariant::fused_batched, shape, tokens);
  layer.load_weights(first.weights(), nullptr);
  const size_t count = static_cast<size_t>(tokens) * shape.hidden;
  DeviceBuffer x(count * 2), y(count * 2);
  cudaStream_t stream;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer.run(x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), tokens, stream);
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (const Inputs* input : {&first, &second, &first}) {
    DF_CHECK_CUDA(cudaMemcpyAsync(x.data(), input->x_dev.data(), x.bytes(), cudaMemcpyDeviceToDevice, stream));
    DF_CHECK_CUDA(cudaMemsetAsync(y.data(), 0xff, y.bytes(), stream));  // NaN pattern
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<double> ref(count);
    reference::swiglu_mlp(input->x.data(), first.gate.data(), first.up.data(), first.down.data(), nullptr, ref.data(),
                          tokens, shape.hidden, shape.intermediate);
    EXPECT_EQ(check_rows(bf16_bits_to_floats(y.to_host<uint16_t>(count)), ref, tokens, shape.hidden), "");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace deepfuse
