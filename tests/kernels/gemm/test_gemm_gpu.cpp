// cuBLASLt GEMM modes the engine relies on, against an fp64 CPU reference on fresh random inputs:
// bf16 output with an in-place residual addend and a bias in the epilogue (o_proj with Llama's
// attention_bias), and fp32 output (lm_head logits), with cuBLASLt's first choice and after tune()
// timed its candidates. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;

struct GemmShape {
  int n, k;
};
const std::vector<GemmShape> kShapes = {{200, 72}, {1000, 136}, {1024, 512}};
const std::vector<int> kRowCounts = {1, 3, 8, 17, 100};

// bf16-representable random values, on the host (floats) and the device (bf16 bits).
std::vector<float> random_bf16(std::mt19937_64& rng, size_t count, float scale, DeviceBuffer& device) {
  std::vector<float> values = testing::random_uniform(rng, count, scale);
  for (float& v : values) v = round_to_bf16(v);
  device = DeviceBuffer::from_host(to_bf16_bits(values));
  return values;
}

// y[t, o] = x[t, :]·w[o, :] (+ bias[o]) (+ addend[t, o]) in fp64.
std::vector<double> reference_gemm(const std::vector<float>& x, const std::vector<float>& w,
                                   const std::vector<float>* bias, const std::vector<float>* addend, int m, int n,
                                   int k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int t = 0; t < m; ++t)
    for (int o = 0; o < n; ++o) {
      double sum = 0;
      for (int i = 0; i < k; ++i) sum += static_cast<double>(x[static_cast<size_t>(t) * k + i]) * w[static_cast<size_t>(o) * k + i];
      if (bias) sum += (*bias)[o];
      if (addend) sum += (*addend)[static_cast<size_t>(t) * n + o];
      y[static_cast<size_t>(t) * n + o] = sum;
    }
  return y;
}

TEST(CublasLtGemm, BiasAndInPlaceAddendInTheEpilogue) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(41);
  kernels::CublasLtGemm gemm;
  for (const GemmShape& shape : kShapes) {
    const int n = shape.n, k = shape.k, max_m = kRowCounts.back();
    DeviceBuffer x_dev, w_dev, bias_dev, addend_dev;
    const auto x = random_bf16(rng, static_cast<size_t>(max_m) * k, 1.0f, x_dev);
    const auto w = random_bf16(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)), w_dev);
    const auto bias = random_bf16(rng, n, 0.5f, bias_dev);
    const auto addend = random_bf16(rng, static_cast<size_t>(max_m) * n, 1.0f, addend_dev);
    for (int m : kRowCounts) {
      for (bool with_bias : {false, true}) {
        for (bool with_addend : {false, true}) {
          // In place, as o_proj adds into the residual stream: y starts as the addend (or NaN).
          const size_t count = static_cast<size_t>(m) * n;
          std::vector<uint16_t> initial(count, kNanBits);
          if (with_addend) initial = to_bf16_bits(std::vector<float>(addend.begin(), addend.begin() + count));
          DeviceBuffer y = DeviceBuffer::from_host(initial);
          auto* y_ptr = y.as<__nv_bfloat16>();
          gemm.run_with_bias(x_dev.as<__nv_bfloat16>(), w_dev.as<__nv_bfloat16>(),
                             with_bias ? bias_dev.as<__nv_bfloat16>() : nullptr, with_addend ? y_ptr : nullptr, y_ptr,
                             m, n, k, nullptr);
          DF_CHECK_CUDA(cudaDeviceSynchronize());
          const auto out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
          const auto ref = reference_gemm(x, w, with_bias ? &bias : nullptr, with_addend ? &addend : nullptr, m, n, k);
          EXPECT_EQ(testing::count_nan(out), 0u) << "M=" << m << " N=" << n << " K=" << k;
          EXPECT_LT(testing::relative_error(out, ref), kTolerance)
              << "M=" << m << " N=" << n << " K=" << k << " bias=" << with_bias << " addend=" << with_addend;
        }
      }
    }
  }
}

TEST(CublasLtGemm, Fp32Output) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(42);
  kernels::CublasLtGemm gemm;
  for (const GemmShape& shape : kShapes) {
    const int n = shape.n, k = shape.k, max_m = kRowCounts.back();
    DeviceBuffer x_dev, w_dev;
    const auto x = random_bf16(rng, static_cast<size_t>(max_m) * k, 1.0f, x_dev);
    const auto w = random_bf16(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)), w_dev);
    for (int m : kRowCounts) {
      const size_t count = static_cast<size_t>(m) * n;
      DeviceBuffer y = DeviceBuffer::from_host(std::vector<float>(count, std::nanf("")));
      gemm.run_fp32_out(x_dev.as<__nv_bfloat16>(), w_dev.as<__nv_bfloat16>(), y.as<float>(), m, n, k, nullptr);
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      const auto out = y.to_host<float>(count);
      const auto ref = reference_gemm(x, w, nullptr, nullptr, m, n, k);
      EXPECT_EQ(testing::count_nan(out), 0u) << "M=" << m << " N=" << n << " K=" << k;
      // fp32 output of bf16 inputs with fp32 accumulation: far tighter than a bf16 result.
      EXPECT_LT(testing::relative_error(out, ref), 1e-4) << "M=" << m << " N=" << n << " K=" << k;
    }
  }
}

// tune() times the candidates on scratch operands rotating over several weight matrices; the
// algorithm it keeps must then compute every epilogue mode correctly on fresh operands.
TEST(CublasLtGemm, TunedAlgorithmsStayCorrect) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(43);
  cudaStream_t stream = nullptr;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int kWeightCopies = 3;
  for (const GemmShape& shape : {GemmShape{1024, 512}, GemmShape{3072, 1024}}) {
    const int n = shape.n, k = shape.k;
    for (int m : {1, 8, 32}) {
      for (int mode = 0; mode < 3; ++mode) {  // bias + in-place addend, plain, fp32 output
        const bool with_bias = mode == 0, with_addend = mode == 0, fp32_out = mode == 2;
        kernels::CublasLtGemm gemm;
        std::vector<DeviceBuffer> w_dev(kWeightCopies);
        std::vector<std::vector<float>> w;
        std::vector<const __nv_bfloat16*> weights;
        for (DeviceBuffer& buffer : w_dev) {
          w.push_back(random_bf16(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)), buffer));
          weights.push_back(buffer.as<__nv_bfloat16>());
        }
        DeviceBuffer x_dev, bias_dev, addend_dev;
        const auto x = random_bf16(rng, static_cast<size_t>(m) * k, 1.0f, x_dev);
        const auto bias = random_bf16(rng, n, 0.5f, bias_dev);
        const auto addend = random_bf16(rng, static_cast<size_t>(m) * n, 1.0f, addend_dev);
        const size_t count = static_cast<size_t>(m) * n;
        DeviceBuffer scratch_x(static_cast<size_t>(m) * k * 2), scratch_y(count * 4);
        kernels::CublasLtGemm::Operands scratch{m, n, k, scratch_x.as<__nv_bfloat16>(),
                                                with_bias ? bias_dev.as<__nv_bfloat16>() : nullptr,
                                                with_addend ? scratch_y.data() : nullptr, scratch_y.data(), fp32_out};
        const GemmTuning report = gemm.tune("test", scratch, weights, stream);
        const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                 " mode " + std::to_string(mode);
        EXPECT_GE(report.candidates, 1) << what;
        EXPECT_GE(report.chosen, 0) << what;
        EXPECT_LT(report.chosen, report.candidates) << what;
        // Each call reads its weights (n x k bf16): not faster than 20 TB/s, above any GPU's HBM or L2.
        const double floor_us = 2.0 * n * k / 20e6;
        EXPECT_GE(report.heuristic_us, floor_us) << what;
        EXPECT_GE(report.chosen_us, floor_us) << what;
        EXPECT_LE(report.chosen_us, report.heuristic_us) << what;

        for (int copy = 0; copy < kWeightCopies; ++copy) {
          if (fp32_out) {
            DeviceBuffer y = DeviceBuffer::from_host(std::vector<float>(count, std::nanf("")));
            gemm.run_fp32_out(x_dev.as<__nv_bfloat16>(), weights[copy], y.as<float>(), m, n, k, stream);
            DF_CHECK_CUDA(cudaStreamSynchronize(stream));
            const auto out = y.to_host<float>(count);
            EXPECT_EQ(testing::count_nan(out), 0u) << what;
            EXPECT_LT(testing::relative_error(out, reference_gemm(x, w[copy], nullptr, nullptr, m, n, k)), 1e-4)
                << what;
            continue;
          }
          DeviceBuffer y = DeviceBuffer::from_host(
              with_addend ? to_bf16_bits(addend) : std::vector<uint16_t>(count, kNanBits));
          auto* y_ptr = y.as<__nv_bfloat16>();
          gemm.run_with_bias(x_dev.as<__nv_bfloat16>(), weights[copy],
                             with_bias ? bias_dev.as<__nv_bfloat16>() : nullptr, with_addend ? y_ptr : nullptr, y_ptr,
                             m, n, k, stream);
          DF_CHECK_CUDA(cudaStreamSynchronize(stream));
          const auto out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
          const auto ref =
              reference_gemm(x, w[copy], with_bias ? &bias : nullptr, with_addend ? &addend : nullptr, m, n, k);
          EXPECT_EQ(testing::count_nan(out), 0u) << what;
          EXPECT_LT(testing::relative_error(out, ref), kTolerance) << what;
        }
      }
    }
  }
  // Bad operands are reported, not timed.
  kernels::CublasLtGemm gemm;
  DeviceBuffer buffer(1 << 16);
  auto* p = buffer.as<__nv_bfloat16>();
  const kernels::CublasLtGemm::Operands ok{1, 64, 64, p, nullptr, nullptr, p + 4096};
  EXPECT_THROW(gemm.tune("test", ok, {}, stream), Error);
  const __nv_bfloat16* null_weight = nullptr;
  EXPECT_THROW(gemm.tune("test", ok, std::span(&null_weight, 1), stream), Error);
  const __nv_bfloat16* weight = p;
  // The legacy default stream cannot be captured.
  EXPECT_THROW(gemm.tune("test", ok, std::span(&weight, 1), nullptr), Error);
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

// Every algorithm tune() may keep, cuBLASLt's suggestions and the split-K ones unsplit, computes
// each epilogue mode correctly: skinny shapes like the decode step's, which cuBLASLt splits.
TEST(CublasLtGemm, EveryTuningCandidateIsCorrect) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(47);
  for (const GemmShape& shape : {GemmShape{512, 2048}, GemmShape{256, 4096}}) {
    const int n = shape.n, k = shape.k;
    DeviceBuffer w_dev, bias_dev;
    const auto w = random_bf16(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)), w_dev);
    const auto bias = random_bf16(rng, n, 0.5f, bias_dev);
    for (int m : {1, 16, 32}) {
      DeviceBuffer x_dev, addend_dev;
      const auto x = random_bf16(rng, static_cast<size_t>(m) * k, 1.0f, x_dev);
      const auto addend = random_bf16(rng, static_cast<size_t>(m) * n, 1.0f, addend_dev);
      const size_t count = static_cast<size_t>(m) * n;
      const auto ref_full = reference_gemm(x, w, &bias, &addend, m, n, k);
      const auto ref_plain = reference_gemm(x, w, nullptr, nullptr, m, n, k);
      for (int mode = 0; mode < 2; ++mode) {  // bias + in-place addend, fp32 output
        const bool fp32_out = mode == 1;
        kernels::CublasLtGemm gemm;
        DeviceBuffer y(count * 4);
        const kernels::CublasLtGemm::Operands operands{m, n, k, x_dev.as<__nv_bfloat16>(),
                                                       fp32_out ? nullptr : bias_dev.as<__nv_bfloat16>(),
                                                       fp32_out ? nullptr : y.data(), y.data(), fp32_out};
        const int candidates = gemm.candidate_count(operands);
        EXPECT_GE(candidates, 1);
        for (int i = 0; i < candidates; ++i) {
          const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                   (fp32_out ? " fp32 out" : " bias + addend") + ", candidate " + std::to_string(i) +
                                   " of " + std::to_string(candidates);
          gemm.use_candidate(operands, i);
          if (fp32_out) {
            DF_CHECK_CUDA(cudaMemset(y.data(), 0xff, count * 4));  // NaN
            gemm.run_fp32_out(x_dev.as<__nv_bfloat16>(), w_dev.as<__nv_bfloat16>(), y.as<float>(), m, n, k, nullptr);
            DF_CHECK_CUDA(cudaDeviceSynchronize());
            const auto out = y.to_host<float>(count);
            EXPECT_EQ(testing::count_nan(out), 0u) << what;
            EXPECT_LT(testing::relative_error(out, ref_plain), 1e-4) << what;
          } else {
            DF_CHECK_CUDA(cudaMemcpy(y.data(), addend_dev.data(), count * 2, cudaMemcpyDeviceToDevice));
            auto* y_ptr = y.as<__nv_bfloat16>();
            gemm.run_with_bias(x_dev.as<__nv_bfloat16>(), w_dev.as<__nv_bfloat16>(), bias_dev.as<__nv_bfloat16>(),
                               y_ptr, y_ptr, m, n, k, nullptr);
            DF_CHECK_CUDA(cudaDeviceSynchronize());
            const auto out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
            EXPECT_EQ(testing::count_nan(out), 0u) << what;
            EXPECT_LT(testing::relative_error(out, ref_full), kTolerance) << what;
          }
        }
      }
    }
  }
}

TEST(CublasLtGemm, RejectsBadArguments) {
  DF_REQUIRE_GPU();
  kernels::CublasLtGemm gemm;
  DeviceBuffer buffer(1024);
  auto* p = buffer.as<__nv_bfloat16>();
  EXPECT_THROW(gemm.run(p, p, nullptr, p, 0, 8, 8, nullptr), Error);
  EXPECT_THROW(gemm.run(nullptr, p, nullptr, p + 64, 1, 8, 8, nullptr), Error);
  EXPECT_THROW(gemm.run_fp32_out(p, p, nullptr, 1, 8, 8, nullptr), Error);
}

}  // namespace
}  // namespace deepfuse
