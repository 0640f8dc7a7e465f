// The FP8 tensor-core GEMM (kernels::CublasLtGemm::run_fp8) against an fp64 CPU reference on
// fresh random inputs, outputs poisoned with NaN first: e4m3 operands with one fp32 scale per row
// (per token for x, per output channel for w, applied by cuBLASLt's outer-vector scale modes),
// with and without a bias and an in-place residual addend, at the token counts the engine runs
// (1 to 4096) and projection shapes up to Llama-3-8B's down_proj (4096 x 14336), in both ways of
// applying the scales (cuBLASLt's outer-vector modes, and the fallback's unit-scale product plus
// launch_fp8_scale_epilogue, also tested alone). Then the engine's
// pipeline: bf16 activations quantized per token on the device (kernels::quantize_rows_fp8) and
// fed to the GEMM, against the host quantizer and the same reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/float8.hpp"
#include "deepfuse/bf16.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/tensor.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

// bf16 output of an fp32-accumulated product of exact e4m3 values: the output rounding dominates.
constexpr double kTolerance = 1e-2;
constexpr uint16_t kNanBits = 0x7fc0;

// N outputs over K inputs: a small odd one, o_proj-like, QKV-like (Llama-3-8B: 6144 x 4096),
// down_proj (4096 x 14336); M from one token to a prefill chunk.
struct Shape {
  int n, k;
};
const std::vector<Shape> kShapes = {{200, 64}, {1024, 4096}, {6144, 4096}, {4096, 14336}};
const std::vector<int> kTokens = {1, 17, 64, 200, 4096};

// Skips unless the GPU runs the FP8 GEMM (sm_90+).
#define REQUIRE_FP8_GEMM()                                                                               \
  do {                                                                                                   \
    DF_REQUIRE_GPU();                                                                                    \
    int major = 0, minor = 0;                                                                            \
    DF_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));                 \
    DF_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));                 \
    if (std::string why = kernels::fp8_gemm_unsupported(64, 64, major, minor); !why.empty())             \
      GTEST_SKIP() << why;                                                                               \
  } while (0)

// Random e4m3 rows (every finite code, signs both ways) and positive per-row scales.
struct Fp8Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  DeviceBuffer bytes_dev, scales_dev;
  kernels::Fp8Rows device() const { return {bytes_dev.as<uint8_t>(), scales_dev.as<float>()}; }
  // Row r as fp64 values: its e4m3 codes times its scale.
  std::vector<double> row(int r, int k) const {
    static const std::vector<double> decoded = [] {
      std::vector<double> table(256);
      for (int b = 0; b < 256; ++b) table[b] = float8_e4m3_to_float(static_cast<uint8_t>(b));
      return table;
    }();
    std::vector<double> out(k);
    for (int i = 0; i < k; ++i) out[i] = decoded[bytes[static_cast<size_t>(r) * k + i]] * scales[r];
    return out;
  }
};

Fp8Matrix random_fp8(std::mt19937_64& rng, int rows, int k, float scale_magnitude) {
  Fp8Matrix m;
  m.bytes.resize(static_cast<size_t>(rows) * k);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : m.bytes) {
    do b = static_cast<uint8_t>(byte(rng));
    while ((b & 0x7f) == 0x7f);  // e4m3 NaN
  }
  std::uniform_real_distribution<float> scale(0.25f * scale_magnitude, scale_magnitude);
  m.scales.resize(rows);
  for (float& s : m.scales) s = scale(rng);
  m.bytes_dev = DeviceBuffer::from_host(m.bytes);
  m.scales_dev = DeviceBuffer::from_host(m.scales);
  return m;
}

// The rows a check compares in full (every row is checked for NaN): all of them while the fp64
// reference stays within ~2^28 multiply-adds, else that many spread over the range, the first and
// last included.
std::vector<int> checked_rows(int m, int n, int k) {
  const int budget = std::max(2, static_cast<int>((int64_t{1} << 28) / (static_cast<int64_t>(n) * k)));
  std::vector<int> rows;
  if (m <= budget) {
    for (int t = 0; t < m; ++t) rows.push_back(t);
    return rows;
  }
  for (int i = 0; i < budget; ++i) rows.push_back(static_cast<int>(static_cast<int64_t>(i) * (m - 1) / (budget - 1)));
  return rows;
}

// Relative error over the checked rows of y against x·w^T (+ bias) (+ addend) in fp64; w_rows:
// w's rows decoded once per shape.
double error_of(const std::vector<float>& y, const Fp8Matrix& x, const std::vector<std::vector<double>>& w_rows,
                const std::vector<float>* bias, const std::vector<float>* addend, int m, int n, int k) {
  std::vector<float> out;
  std::vector<double> ref;
  for (int t : checked_rows(m, n, k)) {
    const std::vector<double> x_row = x.row(t, k);
    for (int o = 0; o < n; ++o) {
      double sum = 0;
      for (int i = 0; i < k; ++i) sum += x_row[i] * w_rows[o][i];
      if (bias) sum += (*bias)[o];
      if (addend) sum += (*addend)[static_cast<size_t>(t) * n + o];
      ref.push_back(sum);
      out.push_back(y[static_cast<size_t>(t) * n + o]);
    }
  }
  return testing::relative_error(out, ref);
}

std::vector<std::vector<double>> decoded_rows(const Fp8Matrix& w, int n, int k) {
  std::vector<std::vector<double>> rows(n);
  for (int o = 0; o < n; ++o) rows[o] = w.row(o, k);
  return rows;
}

std::vector<float> bf16_values(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> values = testing::random_uniform(rng, count, scale);
  for (float& v : values) v = round_to_bf16(v);
  return values;
}

class CublasLtGemmFp8Scaling : public ::testing::TestWithParam<kernels::Fp8Scaling> {};

TEST_P(CublasLtGemmFp8Scaling, PerRowScalesBiasAndInPlaceAddend) {
  REQUIRE_FP8_GEMM();
  auto rng = testing::make_rng(81);
  kernels::CublasLtGemm gemm(GetParam());
  for (const Shape& shape : kShapes) {
    const int n = shape.n, k = shape.k, max_m = kTokens.back();
    const Fp8Matrix x = random_fp8(rng, max_m, k, 1.0f / 448.0f);
    const Fp8Matrix w = random_fp8(rng, n, k, 1.0f / (448.0f * std::sqrt(static_cast<float>(k))));
    const auto w_rows = decoded_rows(w, n, k);
    const std::vector<float> bias = bf16_values(rng, n, 0.5f);
    const DeviceBuffer bias_dev = DeviceBuffer::from_host(to_bf16_bits(bias));
    for (int m : kTokens) {
      // Both epilogue modes at every M would make the reference slow on the large shapes: the
      // plain product at each M, bias + addend at two of them.
      for (bool epilogue : {false, true}) {
        if (epilogue && m != 17 && m != 200) continue;
        const size_t count = static_cast<size_t>(m) * n;
        const std::vector<float> addend = bf16_values(rng, count, 1.0f);
        DeviceBuffer y = DeviceBuffer::from_host(epilogue ? to_bf16_bits(addend) : std::vector<uint16_t>(count, kNanBits));
        auto* y_ptr = y.as<__nv_bfloat16>();
        gemm.run_fp8(x.device(), w.device(), epilogue ? bias_dev.as<__nv_bfloat16>() : nullptr,
                     epilogue ? y_ptr : nullptr, y_ptr, m, n, k, nullptr);
        DF_CHECK_CUDA(cudaDeviceSynchronize());
        const std::vector<float> out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
        const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                 (epilogue ? " with bias and addend" : "");
        EXPECT_EQ(testing::count_nan(out), 0u) << what;
        EXPECT_LT(error_of(out, x, w_rows, epilogue ? &bias : nullptr, epilogue ? &addend : nullptr, m, n, k), kTolerance)
            << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Scales, CublasLtGemmFp8Scaling,
                         ::testing::Values(kernels::Fp8Scaling::automatic, kernels::Fp8Scaling::epilogue_kernel),
                         [](const auto& info) {
                           return info.param == kernels::Fp8Scaling::automatic ? "automatic" : "epilogue_kernel";
                         });

// The fallback's epilogue alone: fp32 products times both scales, plus bias and an addend that is
// the output itself (in place) or apart, against the same arithmetic on the host.
TEST(Fp8ScaleEpilogue, ScalesBiasAndAddend) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(83);
  for (const auto [m, n] : {std::pair{1, 64}, std::pair{17, 1000}, std::pair{200, 4096}}) {
    const size_t count = static_cast<size_t>(m) * n;
    const std::vector<float> accumulator = testing::random_uniform(rng, count, 100.0f);
    const std::vector<float> x_scales = testing::random_uniform(rng, m, 0.01f), w_scales = testing::random_uniform(rng, n, 0.01f);
    const std::vector<float> bias = bf16_values(rng, n, 0.5f), addend = bf16_values(rng, count, 1.0f);
    const DeviceBuffer acc_dev = DeviceBuffer::from_host(accumulator), xs = DeviceBuffer::from_host(x_scales),
                       ws = DeviceBuffer::from_host(w_scales), bias_dev = DeviceBuffer::from_host(to_bf16_bits(bias)),
                       addend_dev = DeviceBuffer::from_host(to_bf16_bits(addend));
    for (int mode = 0; mode < 3; ++mode) {  // plain, bias + in-place addend, bias + separate addend
      DeviceBuffer y = DeviceBuffer::from_host(mode == 1 ? to_bf16_bits(addend) : std::vector<uint16_t>(count, kNanBits));
      kernels::Fp8ScaleEpilogueParams p;
      p.accumulator = acc_dev.as<float>();
      p.x_scales = xs.as<float>();
      p.w_scales = ws.as<float>();
      p.bias = mode > 0 ? bias_dev.as<__nv_bfloat16>() : nullptr;
      p.addend = mode == 1 ? y.as<__nv_bfloat16>() : mode == 2 ? addend_dev.as<__nv_bfloat16>() : nullptr;
      p.y = y.as<__nv_bfloat16>();
      p.m = m;
      p.n = n;
      ASSERT_EQ(kernels::launch_fp8_scale_epilogue(p, nullptr), cudaSuccess);
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<float> out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
      std::vector<double> ref(count);
      for (int t = 0; t < m; ++t)
        for (int o = 0; o < n; ++o) {
          const size_t i = static_cast<size_t>(t) * n + o;
          ref[i] = static_cast<double>(accumulator[i]) * x_scales[t] * w_scales[o] +
                   (mode > 0 ? bias[o] + static_cast<double>(addend[i]) : 0.0);
        }
      EXPECT_EQ(testing::count_nan(out), 0u) << m << "x" << n << " mode " << mode;
      EXPECT_LT(testing::relative_error(out, ref), 1e-2) << m << "x" << n << " mode " << mode;
    }
  }
  kernels::Fp8ScaleEpilogueParams bad;
  EXPECT_EQ(kernels::launch_fp8_scale_epilogue(bad, nullptr), cudaErrorInvalidValue);
}

// What the engine runs: bf16 activations, quantized per token on the device, into the GEMM. The
// device's e4m3 bytes and scales must be the host quantizer's (bit for bit), and the product the
// reference's on them.
TEST(CublasLtGemmFp8, QuantizedActivationsIntoTheGemm) {
  REQUIRE_FP8_GEMM();
  auto rng = testing::make_rng(82);
  kernels::CublasLtGemm gemm;
  for (const Shape& shape : {Shape{1024, 4096}, Shape{4096, 14336}}) {
    const int n = shape.n, k = shape.k;
    const Fp8Matrix w = random_fp8(rng, n, k, 1.0f / (448.0f * std::sqrt(static_cast<float>(k))));
    const auto w_rows = decoded_rows(w, n, k);
    for (int m : {1, 17, 64, 200}) {
      const std::vector<float> activations = bf16_values(rng, static_cast<size_t>(m) * k, 3.0f);
      const DeviceBuffer in = DeviceBuffer::from_host(to_bf16_bits(activations));
      Fp8Matrix x;
      x.bytes_dev = DeviceBuffer::from_host(std::vector<uint8_t>(static_cast<size_t>(m) * k, 0x7f));  // e4m3 NaN
      x.scales_dev = DeviceBuffer::from_host(std::vector<float>(m, std::nanf("")));
      const size_t count = static_cast<size_t>(m) * n;
      DeviceBuffer y = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
      DF_CHECK_CUDA(kernels::quantize_rows_fp8(in.as<__nv_bfloat16>(), x.bytes_dev.as<uint8_t>(),
                                               x.scales_dev.as<float>(), m, k, nullptr));
      gemm.run_fp8(x.device(), w.device(), nullptr, nullptr, y.as<__nv_bfloat16>(), m, n, k, nullptr);
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k);
      // The host's quantization of the same rows.
      x.bytes.resize(static_cast<size_t>(m) * k);
      x.scales.resize(m);
      for (int t = 0; t < m; ++t)
        x.scales[t] = quantize_row_fp8(std::span(activations).subspan(static_cast<size_t>(t) * k, k),
                                       std::span(x.bytes).subspan(static_cast<size_t>(t) * k, k));
      EXPECT_EQ(x.bytes_dev.to_host<uint8_t>(x.bytes.size()), x.bytes) << what;
      EXPECT_EQ(x.scales_dev.to_host<float>(m), x.scales) << what;
      const std::vector<float> out = bf16_bits_to_floats(y.to_host<uint16_t>(count));
      EXPECT_EQ(testing::count_nan(out), 0u) << what;
      EXPECT_LT(error_of(out, x, w_rows, nullptr, nullptr, m, n, k), kTolerance) << what;
    }
  }
}

TEST(CublasLtGemmFp8, RefusesWhatItCannotRun) {
  // Host-side rules: no GPU needed.
  EXPECT_NE(kernels::fp8_gemm_unsupported(4096, 4096, 8, 0), "");   // no FP8 tensor cores
  EXPECT_NE(kernels::fp8_gemm_unsupported(4096, 4100, 9, 0), "");   // K rows not 16-byte aligned
  EXPECT_NE(kernels::fp8_gemm_unsupported(4100 + 2, 4096, 9, 0), "");  // N bf16 rows not 16-byte aligned
  EXPECT_EQ(kernels::fp8_gemm_unsupported(4096, 14336, 9, 0), "");
  REQUIRE_FP8_GEMM();
  kernels::CublasLtGemm gemm;
  DeviceBuffer buffer(1 << 16);
  const kernels::Fp8Rows rows{buffer.as<uint8_t>(), buffer.as<float>()};
  auto* y = buffer.as<__nv_bfloat16>();
  EXPECT_THROW(gemm.run_fp8(rows, rows, nullptr, nullptr, y, 4, 64, 72, nullptr), Error);  // K % 16
  EXPECT_THROW(gemm.run_fp8(rows, {rows.data, nullptr}, nullptr, nullptr, y, 4, 64, 64, nullptr), Error);
}

}  // namespace
}  // namespace deepfuse
