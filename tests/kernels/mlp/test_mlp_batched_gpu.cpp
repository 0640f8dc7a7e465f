// The batched MLPs for 1-256 tokens (MlpVariant::fused_batched, kernels/swiglu_batched.hpp, and
// the Hopper pair MlpVariant::fused_wgmma, kernels/swiglu_wgmma.hpp, on sm_90 only) against the
// fp64 CPU reference on fresh random inputs, outputs poisoned with NaN before each launch, every
// row checked on its own. Every token count 1..256 on the serving shapes (the MLP is
// row-independent, so one reference of 256 rows serves every M); DEEPFUSE_TEST_QUICK=1 keeps the
// small shapes and a few token counts for the compute-sanitizer runs. One variant alone:
// --gtest_filter='*fused_wgmma*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;
constexpr int kMaxTokens = kernels::kSwigluBatchedMaxTokens;
static_assert(kernels::kSwigluWgmmaMaxTokens == kMaxTokens, "both batched variants take 1..256 tokens");

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

// Both variants' instances of a shape share its inputs and references (the fp64 reference of the
// large shapes takes the CPU a while).
struct Case {
  Inputs inputs;
  std::vector<double> plain, normalized;
};
constexpr float kEps = 1e-5f;
const Case& case_of(const MlpShape& shape) {
  static std::map<std::pair<int, int>, std::unique_ptr<Case>> cases;
  std::unique_ptr<Case>& c = cases[{shape.hidden, shape.intermediate}];
  if (!c) {
    c = std::make_unique<Case>(Case{Inputs(shape, shape.hidden * 977 + shape.intermediate), {}, {}});
    c->plain = c->inputs.reference(false, kEps);
    c->normalized = c->inputs.reference(true, kEps);
  }
  return *c;
}

// Why this GPU or shape cannot run `variant` (empty: it runs it): its kernel's own limits.
std::string unsupported(MlpVariant variant, const MlpShape& shape) {
  int device = 0, major = 0, sms = 0, shared = 0;
  DF_CHECK_CUDA(cudaGetDevice(&device));
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  if (variant == MlpVariant::fused_wgmma)
    return kernels::swiglu_wgmma_unsupported(shape.hidden, shape.intermediate, 1, {major, sms});
  return kernels::swiglu_batched_unsupported(shape.hidden, shape.intermediate, 16, {sms, major >= 9, shared});
}

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

#define REQUIRE_VARIANT(variant, shape)                                                   \
  do {                                                                                    \
    DF_REQUIRE_GPU();                                                                     \
    if (const std::string why = unsupported(variant, shape); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

class BatchedMlpVsReference : public ::testing::TestWithParam<std::tuple<MlpVariant, MlpShape>> {};

TEST_P(BatchedMlpVsReference, EveryTokenCountPlainAndNormalizedInPlace) {
  const auto [variant, shape] = GetParam();
  REQUIRE_VARIANT(variant, shape);
  if (testing::quick_mode() && large(shape)) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: large shape skipped";
  const Case& c = case_of(shape);
  const Inputs& in = c.inputs;
  const std::vector<double>& ref = c.plain;
  const std::vector<double>& ref_normalized = c.normalized;
  MlpLayer plain(variant, shape, kMaxTokens);
  plain.load_weights(in.weights(), nullptr);
  MlpLayer normalized(variant, shape, kMaxTokens);
  normalized.load_weights(in.weights(), nullptr, MlpNorm{in.norm_dev.as<__nv_bfloat16>(), kEps});
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
// count that does not split evenly; for the Hopper pair also one row tile of H and one of I
// (128x64), H / 64 and I / 64 odd (192x320: phase 2's splits of 5 stages), and 512x1024. A shape
// a variant refuses is skipped for it.
INSTANTIATE_TEST_SUITE_P(
    Shapes, BatchedMlpVsReference,
    ::testing::Combine(::testing::Values(MlpVariant::fused_batched, MlpVariant::fused_wgmma),
                       ::testing::Values(MlpShape{128, 64}, MlpShape{192, 320}, MlpShape{256, 192},
                                         MlpShape{512, 1024}, MlpShape{896, 4864}, MlpShape{1152, 3136},
                                         MlpShape{4096, 14336}, MlpShape{3584, 18944}, MlpShape{5120, 13824})),
    [](const auto& info) {
      return std::string(mlp_variant_name(std::get<0>(info.param))) + "_" + name_of(std::get<1>(info.param));
    });

class BatchedMlpCalls : public ::testing::TestWithParam<MlpVariant> {};

// The kernels leave their accumulator, counters and grid barrier as they found them: back-to-back
// calls of different token counts (one pass, two passes, one again; every token tile) must each be
// right.
TEST_P(BatchedMlpCalls, BackToBackCallsStayCorrect) {
  const MlpVariant variant = GetParam();
  const MlpShape shape{1024, 2048};
  REQUIRE_VARIANT(variant, shape);
  const Inputs in(shape, 31);
  const std::vector<double> ref = in.reference(false, 1e-5f);
  MlpLayer layer(variant, shape, kMaxTokens);
  layer.load_weights(in.weights(), nullptr);
  for (int tokens : {5, 256, 1, 129, 64, 33, 5, 17, 200})
    EXPECT_EQ(check_rows(run_poisoned(layer, in, tokens), ref, tokens, shape.hidden), "") << "M=" << tokens;
}

// Captured once into a CUDA graph and replayed with new inputs: the decode step's usage.
TEST_P(BatchedMlpCalls, GraphReplayWithNewInputs) {
  const MlpVariant variant = GetParam();
  const MlpShape shape{768, 2048};
  REQUIRE_VARIANT(variant, shape);
  const int tokens = 48;
  const Inputs first(shape, 41), second(shape, 42);
  MlpLayer layer(variant, shape, tokens);
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

// The residual comes from its own buffer (not y's), and y starts poisoned: y = residual + mlp(x).
TEST_P(BatchedMlpCalls, SeparateResidual) {
  const MlpVariant variant = GetParam();
  const MlpShape shape{512, 1024};
  REQUIRE_VARIANT(variant, shape);
  const Inputs in(shape, 51), other(shape, 52);
  MlpLayer layer(variant, shape, kMaxTokens);
  layer.load_weights(in.weights(), nullptr);
  for (int tokens : {3, 40, 255}) {
    const size_t count = static_cast<size_t>(tokens) * shape.hidden;
    DeviceBuffer y = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
    layer.run(in.x_dev.as<__nv_bfloat16>(), other.x_dev.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), tokens, nullptr);
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<double> ref(count);
    reference::swiglu_mlp(in.x.data(), in.gate.data(), in.up.data(), in.down.data(), other.x.data(), ref.data(), tokens,
                          shape.hidden, shape.intermediate);
    EXPECT_EQ(check_rows(bf16_bits_to_floats(y.to_host<uint16_t>(count)), ref, tokens, shape.hidden), "")
        << "M=" << tokens;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, BatchedMlpCalls,
                         ::testing::Values(MlpVariant::fused_batched, MlpVariant::fused_wgmma),
                         [](const auto& info) { return std::string(mlp_variant_name(info.param)); });

}  // namespace
}  // namespace deepfuse
