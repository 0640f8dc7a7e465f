#include "bench/qkv_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>

#include "bench/timing.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/fill.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"

namespace deepfuse::bench {

std::vector<QkvBenchShape> default_qkv_bench_shapes() {
  return {{"llama3-8b", 4096, 32, 8, 128, false, 14336},
          {"llama3.2-1b", 2048, 32, 8, 64, false, 8192},
          {"qwen2.5-7b", 3584, 28, 4, 128, true, 18944},
          {"llama3-70b/tp8", 8192, 8, 1, 128, false, 3584}};
}

namespace {

// One copy of a shape's weights in both layouts, plus what a step reads besides them; fp8: the
// same shape as FP8 weights (e4m3 with per-row scales) in the FP8 stream's layout.
struct QkvWeights {
  DeviceBuffer row_major, packed, bias, norm, fp8_packed, fp8_scales;
};

// The bf16 weights quantized per row (kernels::quantize_rows_fp8) and packed for the FP8 stream:
// FP8 of the same random weights the bf16 rows read.
void make_fp8_weights(const DeviceBuffer& bf16, int rows, int inner, DeviceBuffer& packed, DeviceBuffer& scales,
                      cudaStream_t stream) {
  const DeviceBuffer row_major(static_cast<size_t>(rows) * inner);
  scales = DeviceBuffer(static_cast<size_t>(rows) * sizeof(float));
  DF_CHECK_CUDA(kernels::quantize_rows_fp8(bf16.as<__nv_bfloat16>(), row_major.as<uint8_t>(), scales.as<float>(), rows,
                                           inner, stream));
  packed = DeviceBuffer(row_major.bytes());
  DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(row_major.as<uint8_t>(), packed.as<uint4>(), rows, inner, stream));
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));  // row_major is freed on return
}

// The rows as they accumulate: the table, the JSON, how many ran power-capped.
struct Results {
  Table table{{"shape", "M", "variant", "us", "TB/s", "%copy", "launches", "fused/unfused", "power-capped"}};
  nlohmann::json rows = nlohmann::json::array();
  int capped_rows = 0;
  ImpossibleRows impossible{"qkv"};

  // One row of the pair timed together (unfused or cuBLASLt, then fused) in one power-cap window.
  void add(const std::string& shape, int tokens, const std::string& variant, double us, double bytes,
           const GpuBench& gpu, int launches, double unfused_us, const std::optional<double>& power_capped,
           nlohmann::json json) {
    const double tbps = bytes / (us * 1e-6) / 1e12, pct = 100.0 * tbps * 1e12 / gpu.copy_bw;
    const bool possible =
        impossible.check(gpu.possible(bytes, us), shape + " M = " + std::to_string(tokens) + " " + variant);
    const bool fused = variant.rfind("fused", 0) == 0;
    if (power_capped_noteworthy(power_capped)) ++capped_rows;
    table.add({shape, std::to_string(tokens), variant, format_fixed(us, 1), format_fixed(tbps, 2), format_fixed(pct, 1),
               std::to_string(launches), fused ? format_fixed(unfused_us / us, 2) + "x" : "",
               power_capped_cell(power_capped)});
    json.update({{"shape", shape}, {"m", tokens}, {"variant", variant}, {"us", us}, {"tbps", tbps}, {"pct_copy", pct},
                 {"launches", launches}, {"speedup_vs_unfused", unfused_us / us},
                 {"power_capped_fraction", power_capped_json(power_capped)}, {"physically_possible", possible}});
    rows.push_back(json);
  }
};

int run_shape(const QkvBenchShape& s, const QkvBenchOptions& options, const GpuBench& gpu, Results& out) {
  const DeviceInfo& device = gpu.device;
  cudaStream_t stream = gpu.stream;
  const int rows = (s.q_heads + 2 * s.kv_heads) * s.head_dim;
  const size_t elements = static_cast<size_t>(rows) * s.hidden;
  const int copies = std::max(2, static_cast<int>(std::ceil(options.l2_multiple * device.l2_bytes / s.weight_bytes())));
  std::vector<QkvWeights> weights(copies);
  for (int c = 0; c < copies; ++c) {
    QkvWeights& w = weights[c];
    w.row_major = DeviceBuffer(elements * 2);
    w.packed = DeviceBuffer(elements * 2);
    w.norm = DeviceBuffer(static_cast<size_t>(s.hidden) * 2);
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(w.row_major.as<__nv_bfloat16>(), elements, 10 + c,
                                             1.0f / std::sqrt(float(s.hidden)), stream));
    DF_CHECK_CUDA(kernels::pack_qkv_weights(w.row_major.as<__nv_bfloat16>(), w.packed.as<uint4>(), rows, s.hidden, stream));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(w.norm.as<__nv_bfloat16>(), s.hidden, 50 + c, 1.0f, stream));
    make_fp8_weights(w.row_major, rows, s.hidden, w.fp8_packed, w.fp8_scales, stream);
    if (s.bias) {
      w.bias = DeviceBuffer(static_cast<size_t>(rows) * 2);
      DF_CHECK_CUDA(kernels::fill_uniform_bf16(w.bias.as<__nv_bfloat16>(), rows, 70 + c, 0.1f, stream));
    }
  }
  const int max_tokens = *std::max_element(options.token_counts.begin(), options.token_counts.end());
  // Activations, positions (each token its own sequence at position 1000 + t), the cache.
  DeviceBuffer x(static_cast<size_t>(max_tokens) * s.hidden * 2), normed(x.bytes()),
      qkv(static_cast<size_t>(max_tokens) * rows * 2), q_out(static_cast<size_t>(max_tokens) * s.q_heads * s.head_dim * 2);
  DF_CHECK_CUDA(kernels::fill_uniform_bf16(x.as<__nv_bfloat16>(), x.bytes() / 2, 99, 1.0f, stream));
  std::vector<int32_t> positions(max_tokens), sequences(max_tokens);
  const int pages_per_sequence = 1100 / kernels::kKvPageSize;
  std::vector<int32_t> table_host(static_cast<size_t>(max_tokens) * pages_per_sequence);
  std::iota(table_host.begin(), table_host.end(), 0);
  for (int t = 0; t < max_tokens; ++t) positions[t] = 1000 + t, sequences[t] = t;
  const DeviceBuffer positions_dev = DeviceBuffer::from_host(positions), sequences_dev = DeviceBuffer::from_host(sequences);
  const DeviceBuffer table_dev = DeviceBuffer::from_host(table_host);
  const size_t pool = table_host.size() * s.kv_heads * kernels::kKvPageSize * s.head_dim * 2;
  DeviceBuffer k_pool(pool), v_pool(pool);
  RopeParams rope;
  rope.head_dim = s.head_dim;
  const std::vector<double> inv_freq = rope_inverse_frequencies(rope);
  const DeviceBuffer inv_freq_dev = DeviceBuffer::from_host(std::vector<float>(inv_freq.begin(), inv_freq.end()));
  const kernels::PagedKv kv{k_pool.as<__nv_bfloat16>(), v_pool.as<__nv_bfloat16>(), table_dev.as<int32_t>(),
                            pages_per_sequence, s.kv_heads, s.head_dim};
  kernels::CublasLtGemm gemm;

  for (int tokens : options.token_counts) {
    auto fused = [&](int rep, bool fp8) {
      const QkvWeights& w = weights[rep % copies];
      kernels::QkvRopeFusedParams p;
      if (fp8) p.format = WeightFormat::fp8_e4m3, p.scales = w.fp8_scales.as<float>();
      p.x = x.as<__nv_bfloat16>();
      p.norm_weight = w.norm.as<__nv_bfloat16>();
      p.weights = (fp8 ? w.fp8_packed : w.packed).as<uint4>();
      p.bias = s.bias ? w.bias.as<__nv_bfloat16>() : nullptr;
      p.inv_freq = inv_freq_dev.as<float>();
      p.positions = positions_dev.as<int32_t>();
      p.sequences = sequences_dev.as<int32_t>();
      p.q_out = q_out.as<__nv_bfloat16>();
      p.kv = kv;
      p.tokens = tokens;
      p.hidden = s.hidden;
      p.q_heads = s.q_heads;
      DF_CHECK_CUDA(kernels::launch_qkv_rope_fused(p, stream));
    };
    auto unfused = [&](int rep) {
      const QkvWeights& w = weights[rep % copies];
      kernels::RmsNormParams n;
      n.residual = x.as<__nv_bfloat16>();
      n.weight = w.norm.as<__nv_bfloat16>();
      n.out = normed.as<__nv_bfloat16>();
      n.rows = tokens;
      n.hidden = s.hidden;
      DF_CHECK_CUDA(kernels::launch_rms_norm(n, stream));
      gemm.run(normed.as<__nv_bfloat16>(), w.row_major.as<__nv_bfloat16>(), nullptr, qkv.as<__nv_bfloat16>(), tokens,
               rows, s.hidden, stream);
      kernels::RopeKvAppendParams r;
      r.qkv = qkv.as<__nv_bfloat16>();
      r.qkv_bias = s.bias ? w.bias.as<__nv_bfloat16>() : nullptr;
      r.inv_freq = inv_freq_dev.as<float>();
      r.positions = positions_dev.as<int32_t>();
      r.sequences = sequences_dev.as<int32_t>();
      r.q_out = q_out.as<__nv_bfloat16>();
      r.kv = kv;
      r.tokens = tokens;
      r.q_heads = s.q_heads;
      DF_CHECK_CUDA(kernels::launch_rope_kv_append(r, stream));
    };
    const PowerCapWindow capped(gpu.power_cap);
    const double unfused_us = median_call_us(unfused, options.warmup, options.repetitions, stream);
    const double fused_us = median_call_us([&](int rep) { fused(rep, false); }, options.warmup, options.repetitions, stream);
    const double fp8_us = median_call_us([&](int rep) { fused(rep, true); }, options.warmup, options.repetitions, stream);
    const std::optional<double> power_capped = capped.fraction();
    const nlohmann::json heads = {{"hidden", s.hidden}, {"q_heads", s.q_heads}, {"kv_heads", s.kv_heads},
                                  {"head_dim", s.head_dim}};
    const double fp8_bytes = s.weight_bytes() / 2.0 + rows * 4.0;
    for (const auto& [variant, us, launches, bytes] :
         {std::tuple{"unfused", unfused_us, 3, static_cast<double>(s.weight_bytes())},
          std::tuple{"fused", fused_us, 1, static_cast<double>(s.weight_bytes())},
          std::tuple{"fused fp8", fp8_us, 1, fp8_bytes}})
      out.add(s.name, tokens, variant, us, bytes, gpu, launches, unfused_us, power_capped, heads);
  }
  return copies;
}

// A projection with the residual: cuBLASLt (residual as the GEMM's addend) vs the cluster GEMV in
// bf16 and FP8: the output projection (rows = hidden, inner = q_heads * head_dim) and the FP8 MLP's
// two GEMVs (gate_up: rows = 2 x intermediate over hidden; down: hidden over intermediate).
void run_projection(const std::string& name, int rows, int inner, const QkvBenchOptions& options, const GpuBench& gpu,
                    Results& out) {
  const DeviceInfo& device = gpu.device;
  cudaStream_t stream = gpu.stream;
  const size_t bytes = static_cast<size_t>(rows) * inner * 2;
  const int copies = std::max(2, static_cast<int>(std::ceil(options.l2_multiple * device.l2_bytes / bytes)));
  std::vector<DeviceBuffer> row_major, packed, fp8_packed(copies), fp8_scales(copies);
  for (int c = 0; c < copies; ++c) {
    row_major.emplace_back(bytes);
    packed.emplace_back(bytes);
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(row_major.back().as<__nv_bfloat16>(), bytes / 2, 200 + c,
                                             1.0f / std::sqrt(float(inner)), stream));
    DF_CHECK_CUDA(kernels::pack_rows_fragments(row_major.back().as<__nv_bfloat16>(), packed.back().as<uint4>(), rows,
                                               inner, stream));
    make_fp8_weights(row_major.back(), rows, inner, fp8_packed[c], fp8_scales[c], stream);
  }
  const int max_tokens = *std::max_element(options.token_counts.begin(), options.token_counts.end());
  DeviceBuffer x(static_cast<size_t>(max_tokens) * inner * 2), residual(static_cast<size_t>(max_tokens) * rows * 2);
  DF_CHECK_CUDA(kernels::fill_uniform_bf16(x.as<__nv_bfloat16>(), x.bytes() / 2, 300, 1.0f, stream));
  DF_CHECK_CUDA(kernels::fill_uniform_bf16(residual.as<__nv_bfloat16>(), residual.bytes() / 2, 301, 1.0f, stream));
  kernels::CublasLtGemm gemm;
  for (int tokens : options.token_counts) {
    auto* y = residual.as<__nv_bfloat16>();
    auto unfused = [&](int rep) {
      gemm.run(x.as<__nv_bfloat16>(), row_major[rep % copies].as<__nv_bfloat16>(), y, y, tokens, rows, inner, stream);
    };
    auto fused = [&](int rep, bool fp8) {
      kernels::GemvResidualParams p;
      p.x = x.as<__nv_bfloat16>();
      p.weights = (fp8 ? fp8_packed : packed)[rep % copies].as<uint4>();
      if (fp8) p.format = WeightFormat::fp8_e4m3, p.scales = fp8_scales[rep % copies].as<float>();
      p.residual = y;
      p.y = y;
      p.tokens = tokens;
      p.rows = rows;
      p.inner = inner;
      DF_CHECK_CUDA(kernels::launch_gemv_residual(p, stream));
    };
    const PowerCapWindow capped(gpu.power_cap);
    const double unfused_us = median_call_us(unfused, options.warmup, options.repetitions, stream);
    const double fused_us = median_call_us([&](int rep) { fused(rep, false); }, options.warmup, options.repetitions, stream);
    const double fp8_us = median_call_us([&](int rep) { fused(rep, true); }, options.warmup, options.repetitions, stream);
    const std::optional<double> power_capped = capped.fraction();
    const double fp8_bytes = bytes / 2.0 + rows * 4.0;
    for (const auto& [variant, us, variant_bytes] :
         {std::tuple{"cublaslt", unfused_us, static_cast<double>(bytes)},
          std::tuple{"fused", fused_us, static_cast<double>(bytes)}, std::tuple{"fused fp8", fp8_us, fp8_bytes}})
      out.add(name, tokens, variant, us, variant_bytes, gpu, 1, unfused_us, power_capped, nlohmann::json::object());
  }
}

}  // namespace

int run_qkv_bench(const QkvBenchOptions& options) {
  DF_CHECK(cuda_device_available(), "bench qkv: no CUDA device on this machine");
  for (int m : options.token_counts)
    DF_CHECK(m >= 1 && m <= kernels::kQkvFusedMaxTokens,
             "bench qkv: token count " + std::to_string(m) + " outside 1.." + std::to_string(kernels::kQkvFusedMaxTokens));
  const GpuBench gpu;
  Results out;
  for (const QkvBenchShape& s : options.shapes) {
    const int copies = run_shape(s, options, gpu, out);
    run_projection(s.name + " o_proj", s.hidden, s.q_heads * s.head_dim, options, gpu, out);
    run_projection(s.name + " gate_up", 2 * s.intermediate, s.hidden, options, gpu, out);
    run_projection(s.name + " down", s.hidden, s.intermediate, options, gpu, out);
    std::fprintf(stderr, "  measured %s (%d weight copies)\n", s.name.c_str(), copies);
  }
  std::fputs(out.table.render().c_str(), stdout);
  print_power_capped_note(out.capped_rows);
  nlohmann::json json = run_header(gpu.device, gpu.copy_bw);
  json["suite"] = "qkv";
  json["power_cap_counter"] = gpu.power_cap.available();
  json["rows"] = out.rows;
  if (!options.json_path.empty()) write_json(options.json_path, json);
  return out.impossible.finish();
}

}  // namespace deepfuse::bench
