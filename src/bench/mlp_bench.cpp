#include "bench/mlp_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "bench/power_cap.hpp"
#include "bench/timing.hpp"
#include "deepfuse/bf16.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/fill.hpp"
#include "deepfuse/kernels/quantize_fp8.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"

namespace deepfuse::bench {

std::vector<MlpShape> default_mlp_bench_shapes() {
  return {{2048, 8192}, {3584, 18944}, {4096, 14336}, {5120, 13824}, {8192, 3584}, {8192, 7168}};
}

std::vector<int> default_mlp_bench_tokens() { return {1, 2, 4, 8, 16, 32, 64, 128, 256}; }

FusedMlpTuning parse_fused_tuning(const std::string& text) {
  FusedMlpTuning tuning;
  char rest = 0;
  const int fields = std::sscanf(text.c_str(), "b%dc%d%c", &tuning.blocks_per_sm, &tuning.cluster_size, &rest);
  DF_CHECK(fields == 2, "bad fused tuning '" + text + "' (expected bBcC, e.g. b2c8)");
  return tuning;
}

namespace {

std::string shape_name(const MlpShape& s) { return std::to_string(s.hidden) + "x" + std::to_string(s.intermediate); }

struct Row {
  MlpShape shape;
  int tokens;
  std::string variant;
  double us;        // per call, launched one by one from the host (launch gaps included)
  double graph_us;  // per call, back to back in a CUDA graph (as in the decode step)
  int launches;
  std::optional<double> power_capped;  // fraction of the row's timing the power limit held clocks down
};

// Weight copies that together cover `l2_multiple` L2 caches, so no call finds its weights cached.
int weight_copies(const MlpShape& shape, size_t l2_bytes, double l2_multiple) {
  const double needed = l2_multiple * static_cast<double>(l2_bytes) / static_cast<double>(shape.weight_bytes());
  return std::max(2, static_cast<int>(std::ceil(needed)));
}

// A [rows, columns] bf16 weight quantized per row (kernels::quantize_rows_fp8): FP8 of the same
// random weights the bf16 rows read.
struct Fp8Weight {
  DeviceBuffer bytes, scales;
  LinearWeight view(int rows, int columns) const {
    return {WeightFormat::fp8_e4m3, WeightLayout::row_major, bytes.data(), scales.as<float>(), nullptr, rows, columns};
  }
};
Fp8Weight quantized_fp8(const DeviceBuffer& bf16, int rows, int columns, cudaStream_t stream) {
  Fp8Weight w{DeviceBuffer(static_cast<size_t>(rows) * columns), DeviceBuffer(static_cast<size_t>(rows) * sizeof(float))};
  DF_CHECK_CUDA(kernels::quantize_rows_fp8(bf16.as<__nv_bfloat16>(), w.bytes.as<uint8_t>(), w.scales.as<float>(), rows,
                                           columns, stream));
  return w;
}

int run_gpu(const MlpBenchOptions& options) {
  const GpuBench gpu;
  const DeviceInfo& device = gpu.device;
  cudaStream_t stream = gpu.stream;
  const double copy_bw = gpu.copy_bw;

  if (!options.trace_path.empty()) start_trace_csv("mlp", options.trace_path);
  const int max_tokens = *std::max_element(options.token_counts.begin(), options.token_counts.end());
  std::vector<Row> rows;
  for (const MlpShape& shape : options.shapes) {
    validate_mlp_shape(shape);
    const size_t hi = static_cast<size_t>(shape.hidden) * shape.intermediate;
    // Hugging Face layout source weights, x and residual: random, made on the device.
    DeviceBuffer gate(hi * 2), up(hi * 2), down(hi * 2);
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(shape.hidden));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(gate.as<__nv_bfloat16>(), hi, 1, w_scale, stream));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(up.as<__nv_bfloat16>(), hi, 2, w_scale, stream));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(down.as<__nv_bfloat16>(), hi, 3, w_scale, stream));
    const size_t th = static_cast<size_t>(max_tokens) * shape.hidden;
    DeviceBuffer x(th * 2), residual(th * 2), y(th * 2), norm_weight(static_cast<size_t>(shape.hidden) * 2);
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(norm_weight.as<__nv_bfloat16>(), shape.hidden, 6, 1.0f, stream));
    const MlpNorm norm{options.norm ? norm_weight.as<__nv_bfloat16>() : nullptr, 1e-5f};
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(x.as<__nv_bfloat16>(), th, 4, 1.0f, stream));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(residual.as<__nv_bfloat16>(), th, 5, 1.0f, stream));
    MlpHfWeights hf = MlpHfWeights::bf16(gate.data(), up.data(), down.data(), shape);
    std::vector<Fp8Weight> fp8;  // gate, up, down
    if (options.weights != WeightFormat::bf16) {
      DF_CHECK(options.weights == WeightFormat::fp8_e4m3, "bench mlp: --weights takes bf16 or fp8_e4m3");
      const int H = shape.hidden, I = shape.intermediate;
      fp8.push_back(quantized_fp8(gate, I, H, stream));
      fp8.push_back(quantized_fp8(up, I, H, stream));
      fp8.push_back(quantized_fp8(down, H, I, stream));
      hf = {fp8[0].view(I, H), fp8[1].view(I, H), fp8[2].view(H, I)};
    }
    const int copies = weight_copies(shape, device.l2_bytes, options.l2_multiple);

    // Each measured configuration: a variant, plus fused with explicit tunings.
    std::vector<std::pair<std::string, MlpVariant>> configurations;
    for (MlpVariant variant : options.variants) configurations.emplace_back(mlp_variant_name(variant), variant);
    for (const auto& tuning : options.fused_tunings) configurations.emplace_back("fused[" + tuning + "]", MlpVariant::fused);
    // The batched kernels' limits on this GPU (tokens, shape, format, shared memory per SM, sm_90).
    auto batched_unsupported = [&](MlpVariant variant, const MlpShape& s, int tokens) -> std::string {
      if (variant == MlpVariant::fused_batched)
        return kernels::swiglu_batched_unsupported(
            s.hidden, s.intermediate, tokens,
            {device.sm_count, device.compute_major >= 9, static_cast<int>(device.shared_memory_per_block_optin)},
            options.weights);
      if (variant == MlpVariant::fused_wgmma)
        return kernels::swiglu_wgmma_unsupported(s.hidden, s.intermediate, tokens,
                                                 {device.compute_major, device.sm_count}, options.weights);
      return "";
    };
    for (const auto& [name, variant] : configurations) {
      if (const std::string why = batched_unsupported(variant, shape, 16); !why.empty()) {
        std::fprintf(stderr, "  skipping %s at %s: %s\n", name.c_str(), shape_name(shape).c_str(), why.c_str());
        continue;
      }
      std::vector<MlpLayer> layers;
      for (int c = 0; c < copies; ++c) {
        layers.emplace_back(variant, shape, max_tokens);
        layers.back().load_weights(hf, stream, norm);
        if (name != mlp_variant_name(variant)) layers.back().set_fused_tuning(parse_fused_tuning(name.substr(6, name.size() - 7)));
      }
      DF_CHECK_CUDA(cudaStreamSynchronize(stream));
      for (int tokens : options.token_counts) {
        if (variant == MlpVariant::fused && options.weights != WeightFormat::bf16 &&
            tokens > kernels::kSwigluFusedFp8MaxTokens)
          continue;  // beyond the FP8 fused kernel's passes (swiglu_fused.hpp)
        if (!batched_unsupported(variant, shape, tokens).empty())
          continue;  // beyond the batched kernels' limits (swiglu_batched.hpp, swiglu_wgmma.hpp)
        const __nv_bfloat16* res = options.residual ? residual.as<__nv_bfloat16>() : nullptr;
        auto call = [&](int rep) {
          layers[rep % copies].run(x.as<__nv_bfloat16>(), res, y.as<__nv_bfloat16>(), tokens, stream);
        };
        const PowerCapWindow capped(gpu.power_cap);
        const double us = median_call_us(call, options.warmup, options.repetitions, stream);
        const double graph_us =
            median_graph_call_us(call, graph_calls_for_copies(copies), std::max(5, options.repetitions / 5), stream);
        const std::optional<double> power_capped = capped.fraction();
        if (!options.trace_path.empty())
          trace_graph_calls(call, graph_calls_for_copies(copies, 8), "mlp", name + "-" + shape_name(shape), tokens, 0,
                            options.trace_path, stream);
        rows.push_back({shape, tokens, name, us, graph_us, layers[0].launches_per_call(options.residual), power_capped});
      }
    }
    std::fprintf(stderr, "  measured %s (%d weight copies)\n", shape_name(shape).c_str(), copies);
  }

  // Speedup of fused over unfused needs both rows of a (shape, tokens) pair.
  std::map<std::pair<std::string, int>, const Row*> unfused;
  for (const Row& r : rows)
    if (r.variant == "unfused") unfused[{shape_name(r.shape), r.tokens}] = &r;

  Table table({"shape", "M", "variant", "us", "TB/s", "%copy", "us graph", "%copy graph", "launches",
               "fused/unfused", "graph", "power-capped"});
  int capped_rows = 0;
  nlohmann::json json = run_header(device, copy_bw);
  json["suite"] = "mlp";
  json["residual"] = options.residual;
  json["norm"] = options.norm;
  json["weights"] = weight_format_name(options.weights);
  json["power_cap_counter"] = gpu.power_cap.available();
  json["rows"] = nlohmann::json::array();
  ImpossibleRows impossible("mlp");
  for (const Row& r : rows) {
    const double bytes = static_cast<double>(r.shape.weight_bytes(options.weights));
    const bool possible =
        impossible.check(gpu.possible(bytes, r.us) && gpu.possible(bytes, r.graph_us),
                         shape_name(r.shape) + " M = " + std::to_string(r.tokens) + " " + r.variant);
    const double tbps = bytes / (r.us * 1e-6) / 1e12, graph_tbps = bytes / (r.graph_us * 1e-6) / 1e12;
    const double pct = 100.0 * tbps * 1e12 / copy_bw, graph_pct = 100.0 * graph_tbps * 1e12 / copy_bw;
    std::string speedup, graph_speedup;
    nlohmann::json row = {{"shape", shape_name(r.shape)}, {"hidden", r.shape.hidden},
                          {"intermediate", r.shape.intermediate}, {"m", r.tokens}, {"variant", r.variant},
                          {"us", r.us}, {"tbps", tbps}, {"pct_copy", pct}, {"graph_us", r.graph_us},
                          {"graph_tbps", graph_tbps}, {"graph_pct_copy", graph_pct}, {"launches", r.launches}};
    if (auto it = unfused.find({shape_name(r.shape), r.tokens}); r.variant.rfind("fused", 0) == 0 && it != unfused.end()) {
      speedup = format_fixed(it->second->us / r.us, 2) + "x";
      graph_speedup = format_fixed(it->second->graph_us / r.graph_us, 2) + "x";
      row["speedup_vs_unfused"] = it->second->us / r.us;
      row["graph_speedup_vs_unfused"] = it->second->graph_us / r.graph_us;
    }
    row["power_capped_fraction"] = power_capped_json(r.power_capped);
    row["physically_possible"] = possible;
    if (power_capped_noteworthy(r.power_capped)) ++capped_rows;
    table.add({shape_name(r.shape), std::to_string(r.tokens), r.variant, format_fixed(r.us, 1), format_fixed(tbps, 2),
               format_fixed(pct, 1), format_fixed(r.graph_us, 1), format_fixed(graph_pct, 1),
               std::to_string(r.launches), speedup, graph_speedup, power_capped_cell(r.power_capped)});
    json["rows"].push_back(row);
  }
  std::fputs(table.render().c_str(), stdout);
  print_power_capped_note(capped_rows);
  if (!options.json_path.empty()) write_json(options.json_path, json);
  return impossible.finish();
}

// No GPU: time the fp32 CPU reference so the command still shows what it computes.
int run_cpu(const MlpBenchOptions& options) {
  std::printf("No CUDA device: timing the CPU reference backend (fp32, %u threads)\n",
              std::thread::hardware_concurrency());
  Table table({"shape", "M", "variant", "us", "GB/s (fp32 weights)"});
  nlohmann::json json = {{"gpu", "none (CPU reference)"}, {"commit", build_commit()}, {"suite", "mlp"}};
  json["rows"] = nlohmann::json::array();
  std::mt19937_64 rng(1);
  for (const MlpShape& shape : options.shapes) {
    validate_mlp_shape(shape);
    const size_t hi = static_cast<size_t>(shape.hidden) * shape.intermediate;
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto random = [&](size_t n, float scale) {
      std::vector<float> v(n);
      for (auto& e : v) e = dist(rng) * scale;
      return v;
    };
    const float w_scale = 1.0f / std::sqrt(static_cast<float>(shape.hidden));
    const auto gate = random(hi, w_scale), up = random(hi, w_scale), down = random(hi, w_scale);
    for (int tokens : options.token_counts) {
      const auto x = random(static_cast<size_t>(tokens) * shape.hidden, 1.0f);
      std::vector<double> y(static_cast<size_t>(tokens) * shape.hidden);
      const double us = median_host_call_us(
          [&] {
            reference::swiglu_mlp(x.data(), gate.data(), up.data(), down.data(), nullptr, y.data(), tokens,
                                  shape.hidden, shape.intermediate);
          },
          std::max(1, std::min(options.repetitions, 3)));
      const double gbps = 3.0 * hi * sizeof(float) / (us * 1e-6) / 1e9;
      table.add({shape_name(shape), std::to_string(tokens), "reference", format_fixed(us, 0), format_fixed(gbps, 2)});
      json["rows"].push_back({{"shape", shape_name(shape)}, {"m", tokens}, {"variant", "reference"}, {"us", us}});
    }
  }
  std::fputs(table.render().c_str(), stdout);
  if (!options.json_path.empty()) write_json(options.json_path, json);
  return 0;
}

}  // namespace

int run_mlp_bench(const MlpBenchOptions& options) {
  DF_CHECK(!options.shapes.empty() && !options.token_counts.empty(), "bench mlp: no shapes or token counts");
  for (int m : options.token_counts) DF_CHECK(m >= 1, "bench mlp: token counts must be at least 1");
  return cuda_device_available() ? run_gpu(options) : run_cpu(options);
}

}  // namespace deepfuse::bench
