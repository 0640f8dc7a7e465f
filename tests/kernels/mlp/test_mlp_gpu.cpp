// Every GPU MLP variant against the fp64 CPU reference on fresh random inputs, outputs poisoned
// with NaN before each launch. DEEPFUSE_TEST_QUICK=1 keeps only the small shapes (for the
// compute-sanitizer runs, which slow kernels down a hundredfold).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "kernels/fp8_test_weights.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;
const std::vector<int> kTokenCounts = {1, 2, 3, 8, 12, 16, 17, 64, 100, 256};

// Random bf16 data for one shape, kept both as bf16 bits (for the GPU) and floats (reference).
struct MlpCase {
  MlpShape shape;
  int max_tokens;
  std::vector<float> x, gate, up, down, residual;
  DeviceBuffer x_dev, gate_dev, up_dev, down_dev, residual_dev;

  MlpCase(MlpShape s, int tokens, uint64_t salt) : shape(s), max_tokens(tokens) {
    auto rng = testing::make_rng(salt);
    const size_t hi = static_cast<size_t>(s.hidden) * s.intermediate;
    auto bf16_values = [&](size_t n, float scale, DeviceBuffer& device) {
      std::vector<float> v = testing::random_uniform(rng, n, scale);
      for (auto& e : v) e = round_to_bf16(e);
      device = DeviceBuffer::from_host(to_bf16_bits(v));
      return v;
    };
    x = bf16_values(static_cast<size_t>(tokens) * s.hidden, 1.0f, x_dev);
    gate = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.hidden)), gate_dev);
    up = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.hidden)), up_dev);
    down = bf16_values(hi, 1.7f / std::sqrt(static_cast<float>(s.intermediate)), down_dev);
    residual = bf16_values(static_cast<size_t>(tokens) * s.hidden, 1.0f, residual_dev);
  }

  MlpHfWeights weights() const {
    return MlpHfWeights::bf16(gate_dev.data(), up_dev.data(), down_dev.data(), shape);
  }

  std::vector<double> reference(int tokens, bool with_residual) const {
    std::vector<double> y(static_cast<size_t>(tokens) * shape.hidden);
    reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), with_residual ? residual.data() : nullptr,
                          y.data(), tokens, shape.hidden, shape.intermediate);
    return y;
  }
};

// Runs `layer` on the first `tokens` rows with a NaN-poisoned output; returns y as floats.
std::vector<float> run_poisoned(MlpLayer& layer, const MlpCase& c, int tokens, bool with_residual) {
  const size_t count = static_cast<size_t>(tokens) * c.shape.hidden;
  DeviceBuffer y = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
  layer.run(c.x_dev.as<__nv_bfloat16>(), with_residual ? c.residual_dev.as<__nv_bfloat16>() : nullptr,
            y.as<__nv_bfloat16>(), tokens, nullptr);
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return bf16_bits_to_floats(y.to_host<uint16_t>(count));
}

class MlpVariantsVsReference : public ::testing::TestWithParam<MlpShape> {};

TEST_P(MlpVariantsVsReference, EveryTokenCountWithAndWithoutResidual) {
  DF_REQUIRE_GPU();
  const MlpShape shape = GetParam();
  const bool small = static_cast<size_t>(shape.hidden) * shape.intermediate <= size_t{2048} * 2048;
  if (testing::quick_mode() && !small) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: large shape skipped";
  const MlpCase c(shape, 256, shape.hidden * 131 + shape.intermediate);
  std::vector<MlpLayer> layers;
  for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused}) {
    layers.emplace_back(v, shape, c.max_tokens);
    layers.back().load_weights(c.weights(), nullptr);
  }
  for (int tokens : kTokenCounts) {
    for (bool with_residual : {false, true}) {
      const std::vector<double> ref = c.reference(tokens, with_residual);
      for (MlpLayer& layer : layers) {
        const std::vector<float> y = run_poisoned(layer, c, tokens, with_residual);
        const double err = testing::relative_error(y, ref);
        EXPECT_EQ(testing::count_nan(y), 0u) << mlp_variant_name(layer.variant()) << " M=" << tokens;
        EXPECT_LT(err, kTolerance) << mlp_variant_name(layer.variant()) << " " << shape.hidden << "x"
                                   << shape.intermediate << " M=" << tokens << " residual=" << with_residual;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlpVariantsVsReference,
                         ::testing::Values(MlpShape{64, 64}, MlpShape{64, 192}, MlpShape{960, 2496},
                                           MlpShape{896, 4864}, MlpShape{2048, 8192}, MlpShape{4096, 14336},
                                           MlpShape{3584, 18944}, MlpShape{8192, 1024}),  // H >= 8192: clusters of 8
                         [](const auto& info) {
                           return std::to_string(info.param.hidden) + "x" + std::to_string(info.param.intermediate);
                         });

// The fused kernel leaves its accumulator and counters zeroed: back-to-back calls with
// different token counts and inputs must each be right (a leftover partial sum would show).
TEST(FusedMlp, BackToBackCallsStayCorrect) {
  DF_REQUIRE_GPU();
  const MlpShape shape{1024, 2048};
  const MlpCase c(shape, 64, 11);
  MlpLayer layer(MlpVariant::fused, shape, c.max_tokens);
  layer.load_weights(c.weights(), nullptr);
  for (int tokens : {5, 64, 1, 33, 5}) {
    const std::vector<float> y = run_poisoned(layer, c, tokens, true);
    EXPECT_LT(testing::relative_error(y, c.reference(tokens, true)), kTolerance) << "M=" << tokens;
  }
}

// Every launch configuration of the fused kernel is a different work split: cluster sizes 1, 4
// and 8, one or two blocks per SM, token counts needing several passes, I too small for a cluster.
TEST(FusedMlp, EveryClusterSizeAndOccupancy) {
  DF_REQUIRE_GPU();
  for (MlpShape shape : {MlpShape{64, 64}, MlpShape{64, 192}, MlpShape{960, 2496}, MlpShape{896, 4864}}) {
    // Under compute-sanitizer (quick mode) the small shapes reach every instantiation.
    if (testing::quick_mode() && shape.hidden > 64) continue;
    const MlpCase c(shape, 100, shape.hidden + 7 * shape.intermediate);
    for (int cluster : {1, 2, 4, 8}) {
      for (int blocks_per_sm : {1, 2}) {
        MlpLayer layer(MlpVariant::fused, shape, c.max_tokens);
        layer.load_weights(c.weights(), nullptr);
        // Programmatic launches (consecutive calls overlap) where allowed, half of the cases.
        layer.set_fused_tuning(
            {.blocks_per_sm = blocks_per_sm, .cluster_size = cluster, .programmatic_launch = blocks_per_sm == 2});
        for (int tokens : {1, 3, 12, 17, 40, 100}) {
          const std::vector<float> y = run_poisoned(layer, c, tokens, true);
          EXPECT_EQ(testing::count_nan(y), 0u);
          EXPECT_LT(testing::relative_error(y, c.reference(tokens, true)), kTolerance)
              << shape.hidden << "x" << shape.intermediate << " cluster=" << cluster << " blocks/SM=" << blocks_per_sm
              << " M=" << tokens;
        }
      }
    }
  }
}

// The decode step's deferred sum: mlp(x) left in the layer's fp32 buffer, nothing else written;
// once the caller has cleared it, the next ordinary call is correct again (the counters are
// untouched). Several passes of tokens too.
TEST(FusedMlp, DeferredSumStaysInTheAccumulator) {
  DF_REQUIRE_GPU();
  for (MlpShape shape : {MlpShape{896, 4864}, MlpShape{2048, 8192}}) {
    const MlpCase c(shape, 40, 5 * shape.hidden + shape.intermediate);
    MlpLayer layer(MlpVariant::fused, shape, c.max_tokens);
    layer.load_weights(c.weights(), nullptr);
    for (int tokens : {1, 8, 16, 40}) {
      const size_t count = static_cast<size_t>(tokens) * shape.hidden;
      float* sum = layer.run_deferred(c.x_dev.as<__nv_bfloat16>(), tokens, nullptr);
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      std::vector<float> got(count);
      DF_CHECK_CUDA(cudaMemcpy(got.data(), sum, count * sizeof(float), cudaMemcpyDeviceToHost));
      EXPECT_EQ(testing::count_nan(got), 0u);
      EXPECT_LT(testing::relative_error(got, c.reference(tokens, false)), kTolerance)
          << shape.hidden << "x" << shape.intermediate << " M=" << tokens;
      DF_CHECK_CUDA(cudaMemset(sum, 0, count * sizeof(float)));  // what the decode step's o_proj does
      const std::vector<float> y = run_poisoned(layer, c, tokens, true);
      EXPECT_LT(testing::relative_error(y, c.reference(tokens, true)), kTolerance) << "the call after, M=" << tokens;
    }
  }
  MlpLayer naive(MlpVariant::naive, MlpShape{64, 64}, 4);
  DeviceBuffer x(4 * 64 * 2);
  EXPECT_THROW(naive.run_deferred(x.as<__nv_bfloat16>(), 1, nullptr), Error);
}

// y may alias the residual: the in-place residual add of a decode step.
TEST(FusedMlp, InPlaceResidual) {
  DF_REQUIRE_GPU();
  const MlpShape shape{512, 1536};
  const MlpCase c(shape, 9, 12);
  for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused}) {
    MlpLayer layer(v, shape, c.max_tokens);
    layer.load_weights(c.weights(), nullptr);
    DeviceBuffer inout = DeviceBuffer::from_host(to_bf16_bits(c.residual));
    layer.run(c.x_dev.as<__nv_bfloat16>(), inout.as<__nv_bfloat16>(), inout.as<__nv_bfloat16>(), 9, nullptr);
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    const auto y = bf16_bits_to_floats(inout.to_host<uint16_t>(c.residual.size()));
    EXPECT_LT(testing::relative_error(y, c.reference(9, true)), kTolerance) << mlp_variant_name(v);
  }
}

// The post-attention RMSNorm folded in, run in place on the residual stream as a decode step
// does: stream = stream + mlp(rms_norm(stream) * weight), for every variant (unfused also with
// the norm folded into its weights, 1/rms applied by silu_and_mul), across cluster sizes
// and token counts that need several passes (the per-pass sums of squares are reset between).
TEST(MlpLayer, FoldedRmsNormInPlaceOnTheResidualStream) {
  DF_REQUIRE_GPU();
  for (MlpShape shape : {MlpShape{896, 4864}, MlpShape{960, 2496}, MlpShape{2048, 8192}}) {
    if (testing::quick_mode() && shape.hidden * shape.intermediate > 2048 * 2048) continue;  // sanitizer runs
    const MlpCase c(shape, 100, shape.hidden * 3 + shape.intermediate);
    auto rng = testing::make_rng(shape.hidden + 5);
    std::vector<float> norm_weight = testing::random_uniform(rng, shape.hidden, 0.5f);
    for (auto& w : norm_weight) w = round_to_bf16(1.0f + w);
    const DeviceBuffer norm_dev = DeviceBuffer::from_host(to_bf16_bits(norm_weight));
    const float eps = 1e-5f;
    for (int tokens : {1, 7, 16, 33, 100}) {
      std::vector<float> normed(static_cast<size_t>(tokens) * shape.hidden);
      reference::rms_norm(c.x.data(), norm_weight.data(), tokens, shape.hidden, eps, normed.data());
      std::vector<double> ref(normed.size());
      reference::swiglu_mlp(normed.data(), c.gate.data(), c.up.data(), c.down.data(), c.x.data(), ref.data(), tokens,
                            shape.hidden, shape.intermediate);
      for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused}) {
        // unfused runs twice: with its own norm launch (cluster 0) and with the norm folded (-1)
        const std::vector<int> settings = v == MlpVariant::fused     ? std::vector<int>{1, 4, 8}
                                          : v == MlpVariant::unfused ? std::vector<int>{0, -1}
                                                                     : std::vector<int>{0};
        for (int cluster : settings) {
          MlpLayer layer(v, shape, c.max_tokens);
          layer.load_weights(c.weights(), nullptr, MlpNorm{norm_dev.as<__nv_bfloat16>(), eps, cluster < 0});
          if (cluster > 0) layer.set_fused_tuning({.cluster_size = cluster});
          std::vector<float> stream_values(c.x.begin(), c.x.begin() + normed.size());
          DeviceBuffer stream = DeviceBuffer::from_host(to_bf16_bits(stream_values));
          auto* s = stream.as<__nv_bfloat16>();
          layer.run(s, s, s, tokens, nullptr);
          DF_CHECK_CUDA(cudaDeviceSynchronize());
          const auto y = bf16_bits_to_floats(stream.to_host<uint16_t>(normed.size()));
          EXPECT_EQ(testing::count_nan(y), 0u);
          EXPECT_LT(testing::relative_error(y, ref), kTolerance)
              << mlp_variant_name(v) << " " << shape.hidden << "x" << shape.intermediate << " cluster=" << cluster
              << " M=" << tokens;
        }
      }
    }
  }
}

// FP8 weights (per-row and 128x128-block scales) in the unfused MLP, the norm applied to x as
// staged, in place on the residual stream: the GEMVs up to 32 tokens, the widened GEMMs beyond;
// and per-row scales in the fused kernel up to 16 tokens; against the reference on the
// dequantized weights. Block scales in the fused kernel are refused in one line.
TEST(MlpLayer, Fp8WeightsMatchTheirDequantizedReference) {
  DF_REQUIRE_GPU();
  for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128})
    for (MlpShape shape : {MlpShape{896, 4864}, MlpShape{2048, 8192}, MlpShape{4096, 14336}}) {
      if (testing::quick_mode() && shape.hidden * shape.intermediate > 2048 * 2048) continue;  // sanitizer runs
      if (format_info(format).scale_block && shape.hidden % format_info(format).scale_block) continue;
      SCOPED_TRACE(std::string(weight_format_name(format)) + " " + std::to_string(shape.hidden) + "x" +
                   std::to_string(shape.intermediate));
      const MlpCase c(shape, 64, shape.hidden * 7 + shape.intermediate);
      const int H = shape.hidden, I = shape.intermediate;
      const auto gate = testing::quantize_fp8_for_test(c.gate, I, H, format);
      const auto up = testing::quantize_fp8_for_test(c.up, I, H, format);
      const auto down = testing::quantize_fp8_for_test(c.down, H, I, format);
      std::vector<DeviceBuffer> device;
      auto linear = [&](const testing::Fp8TestWeights& q, int rows, int columns) {
        device.push_back(DeviceBuffer::from_host(q.bytes));
        device.push_back(DeviceBuffer::from_host(q.scales));
        return LinearWeight{format, WeightLayout::row_major, device[device.size() - 2].data(),
                            device.back().as<float>(), nullptr, rows, columns};
      };
      const MlpHfWeights weights{linear(gate, I, H), linear(up, I, H), linear(down, H, I)};
      auto rng = testing::make_rng(shape.hidden + 9);
      std::vector<float> norm_weight = testing::random_uniform(rng, H, 0.5f);
      for (auto& w : norm_weight) w = round_to_bf16(1.0f + w);
      const DeviceBuffer norm_dev = DeviceBuffer::from_host(to_bf16_bits(norm_weight));
      const float eps = 1e-5f;
      // unfused at every token count; fused (per-row scales only) up to its 16 tokens, at each
      // cluster size (0: the launcher's choice).
      struct Run {
        MlpVariant variant;
        int cluster;
      };
      std::vector<Run> runs = {{MlpVariant::unfused, 0}};
      if (format == WeightFormat::fp8_e4m3)
        for (int cluster : {0, 1, 2, 4, 8}) runs.push_back({MlpVariant::fused, cluster});
      for (const Run& run : runs) {
      SCOPED_TRACE(std::string(mlp_variant_name(run.variant)) + " cluster=" + std::to_string(run.cluster));
      MlpLayer layer(run.variant, shape, c.max_tokens);
      layer.load_weights(weights, nullptr, MlpNorm{norm_dev.as<__nv_bfloat16>(), eps, run.variant == MlpVariant::unfused});
      if (run.cluster > 0) layer.set_fused_tuning({.cluster_size = run.cluster});
      for (int tokens : {1, 5, 8, 9, 16, 32, 33, 64}) {
        if (run.variant == MlpVariant::fused && tokens > kernels::kSwigluFusedFp8MaxTokens) continue;
        std::vector<float> normed(static_cast<size_t>(tokens) * H);
        reference::rms_norm(c.x.data(), norm_weight.data(), tokens, H, eps, normed.data());
        std::vector<double> ref(normed.size());
        reference::swiglu_mlp(normed.data(), gate.dequantized.data(), up.dequantized.data(), down.dequantized.data(),
                              c.x.data(), ref.data(), tokens, H, I);
        std::vector<float> stream_values(c.x.begin(), c.x.begin() + normed.size());
        DeviceBuffer stream = DeviceBuffer::from_host(to_bf16_bits(stream_values));
        auto* s = stream.as<__nv_bfloat16>();
        layer.run(s, s, s, tokens, nullptr);
        DF_CHECK_CUDA(cudaDeviceSynchronize());
        const auto y = bf16_bits_to_floats(stream.to_host<uint16_t>(normed.size()));
        EXPECT_EQ(testing::count_nan(y), 0u) << "M=" << tokens;
        EXPECT_LT(testing::relative_error(y, ref), kTolerance) << "M=" << tokens;
      }
      }
      if (format == WeightFormat::fp8_e4m3) {  // fused without a norm: x itself is the f16 operand
        MlpLayer plain(MlpVariant::fused, shape, c.max_tokens);
        plain.load_weights(weights, nullptr);
        for (int tokens : {1, 8, 13}) {
          std::vector<double> ref(static_cast<size_t>(tokens) * H);
          reference::swiglu_mlp(c.x.data(), gate.dequantized.data(), up.dequantized.data(), down.dequantized.data(),
                                c.residual.data(), ref.data(), tokens, H, I);
          const std::vector<float> out = run_poisoned(plain, c, tokens, true);
          EXPECT_EQ(testing::count_nan(out), 0u) << "no norm, M=" << tokens;
          EXPECT_LT(testing::relative_error(out, ref), kTolerance) << "no norm, M=" << tokens;
        }
      }
      if (format != WeightFormat::fp8_e4m3) {  // block scales: the fused kernel refuses them
        MlpLayer fused(MlpVariant::fused, shape, 8);
        EXPECT_THROW(fused.load_weights(weights, nullptr), Error);
      }
    }
}

// Captured once into a CUDA graph, replayed with new inputs: the decode step's usage.
TEST(FusedMlp, GraphReplayWithNewInputs) {
  DF_REQUIRE_GPU();
  const MlpShape shape{768, 2048};
  MlpCase first(shape, 4, 13), second(shape, 4, 14);
  MlpLayer layer(MlpVariant::fused, shape, 4);
  layer.load_weights(first.weights(), nullptr);
  DeviceBuffer x(first.x.size() * 2), y(first.x.size() * 2);
  cudaStream_t stream;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  layer.run(x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), 4, stream);
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (const MlpCase* input : {&first, &second}) {
    // same weights, new activations each replay
    // Stream-ordered: `stream` does not synchronise with the legacy default stream.
    DF_CHECK_CUDA(cudaMemcpyAsync(x.data(), input->x_dev.data(), x.bytes(), cudaMemcpyDeviceToDevice, stream));
    DF_CHECK_CUDA(cudaMemsetAsync(y.data(), 0xff, y.bytes(), stream));  // NaN pattern
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    // reference with the first case's weights and this case's x
    std::vector<double> ref(4 * shape.hidden);
    reference::swiglu_mlp(input->x.data(), first.gate.data(), first.up.data(), first.down.data(), nullptr,
                          ref.data(), 4, shape.hidden, shape.intermediate);
    const auto out = bf16_bits_to_floats(y.to_host<uint16_t>(4 * shape.hidden));
    EXPECT_EQ(testing::count_nan(out), 0u);
    EXPECT_LT(testing::relative_error(out, ref), kTolerance);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Two layers of different weights sharing one scratch, called alternately (a model's layers on
// one stream): each must be right; a scratch made for another variant, shape or fewer tokens is
// refused.
TEST(MlpLayer, LayersShareOneScratch) {
  DF_REQUIRE_GPU();
  const MlpShape shape{256, 768};
  const MlpCase first(shape, 24, 21), second(shape, 24, 22);
  for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused}) {
    const std::shared_ptr<MlpScratch> scratch = make_mlp_scratch(v, shape, 24);
    MlpLayer a(v, shape, 24, scratch), b(v, shape, 17, scratch);
    a.load_weights(first.weights(), nullptr);
    b.load_weights(second.weights(), nullptr);
    for (int round = 0; round < 2; ++round) {
      const auto ya = run_poisoned(a, first, 24, true);
      const auto yb = run_poisoned(b, second, 17, round == 1);
      EXPECT_EQ(testing::count_nan(ya) + testing::count_nan(yb), 0u) << mlp_variant_name(v);
      EXPECT_LT(testing::relative_error(ya, first.reference(24, true)), kTolerance) << mlp_variant_name(v);
      EXPECT_LT(testing::relative_error(yb, second.reference(17, round == 1)), kTolerance) << mlp_variant_name(v);
    }
    EXPECT_THROW(MlpLayer(v, shape, 25, scratch), Error) << "more tokens than the scratch holds";
    EXPECT_THROW(MlpLayer(v, {256, 512}, 8, scratch), Error) << "another shape";
  }
  EXPECT_THROW(MlpLayer(MlpVariant::naive, shape, 8, make_mlp_scratch(MlpVariant::unfused, shape, 8)), Error);
  EXPECT_THROW(make_mlp_scratch(MlpVariant::fused, shape, 8), Error);
}

TEST(MlpLayer, RejectsBadCalls) {
  DF_REQUIRE_GPU();
  for (MlpVariant v : {MlpVariant::fused, MlpVariant::fused_batched, MlpVariant::fused_wgmma}) {
    MlpLayer layer(v, {128, 256}, 8);
    DeviceBuffer x(8 * 128 * 2), y(8 * 128 * 2);
    EXPECT_THROW(layer.run(x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), 9, nullptr), Error);
    EXPECT_THROW(layer.run(x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), 0, nullptr), Error);
    EXPECT_THROW(layer.run(x.as<__nv_bfloat16>(), nullptr, x.as<__nv_bfloat16>(), 1, nullptr), Error);
  }
  EXPECT_THROW(MlpLayer(MlpVariant::fused, {100, 256}, 8), Error);
  // The batched kernel: a hidden size that is a multiple of 128, at most 256 tokens a call whatever
  // the layer's max_tokens, no deferred sum.
  EXPECT_THROW(MlpLayer(MlpVariant::fused_batched, {192, 256}, 8), Error);
  MlpLayer batched(MlpVariant::fused_batched, {128, 256}, 300);
  DeviceBuffer rows(300 * 128 * 2), out(300 * 128 * 2);
  EXPECT_THROW(batched.run(rows.as<__nv_bfloat16>(), nullptr, out.as<__nv_bfloat16>(), 257, nullptr), Error);
  EXPECT_THROW(batched.run_deferred(rows.as<__nv_bfloat16>(), 4, nullptr), Error);
  // The Hopper pair: at most 256 tokens a call whatever the layer's max_tokens, no deferred sum,
  // refused before its weights are loaded.
  MlpLayer pair(MlpVariant::fused_wgmma, {128, 256}, 300);
  EXPECT_THROW(pair.run(rows.as<__nv_bfloat16>(), nullptr, out.as<__nv_bfloat16>(), 4, nullptr), Error);
  EXPECT_THROW(pair.run(rows.as<__nv_bfloat16>(), nullptr, out.as<__nv_bfloat16>(), 257, nullptr), Error);
  EXPECT_THROW(pair.run_deferred(rows.as<__nv_bfloat16>(), 4, nullptr), Error);
}

}  // namespace
}  // namespace deepfuse
