#include "bench/attention_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "bench/timing.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/fill.hpp"

namespace deepfuse::bench {

std::vector<AttentionBenchCase> default_attention_bench_cases() {
  return {{1, 8192}, {1, 32768}, {8, 32768}, {32, 8192}};
}

AttentionBenchCase parse_attention_bench_case(const std::string& text) {
  const std::string usage = "bad attention case '" + text + "' (expected BATCHxCONTEXT, e.g. 8x32768 or 8x32k)";
  const auto x = text.find('x');
  DF_CHECK(x != std::string::npos && x > 0 && x + 1 < text.size(), usage);
  std::string context = text.substr(x + 1);
  int multiplier = 1;
  if (context.back() == 'k' || context.back() == 'K') {
    multiplier = 1024;
    context.pop_back();
  }
  try {
    size_t batch_end = 0, context_end = 0;
    const int batch = std::stoi(text.substr(0, x), &batch_end);
    const long long keys = std::stoll(context, &context_end) * multiplier;
    DF_CHECK(batch_end == x && context_end == context.size(), usage);
    DF_CHECK(batch >= 1 && keys >= 1 && keys <= (1 << 24), usage + ": batch and context must be positive");
    return {batch, static_cast<int>(keys)};
  } catch (const std::logic_error&) {  // stoi / stoll: not a number, out of range
    throw Error(usage);
  }
}

namespace {

std::string case_name(const AttentionBenchCase& c) { return std::to_string(c.batch) + "x" + std::to_string(c.context); }

// Bytes one call must read: every key and value of every sequence, every kv head.
double kv_bytes(const AttentionBenchCase& c, const AttentionBenchOptions& o) {
  return 2.0 * c.batch * static_cast<double>(c.context) * o.kv_heads * o.head_dim * 2.0;
}

struct Row {
  AttentionBenchCase shape;
  kernels::DecodeAttentionPlan plan;
  int kv_copies;
  double graph_us;   // per call, back to back in a CUDA graph (as in the decode step)
  double stream_us;  // per call, launched one by one from the host with an event between
  std::optional<double> power_capped;  // share of both timings the power limit held the clocks down
};

kernels::SplitMerge split_merge(const std::string& name) {
  if (name == "workspace") return kernels::SplitMerge::workspace;
  if (name == "cluster") return kernels::SplitMerge::cluster;
  DF_CHECK(name == "auto", "bench attention: --merge " + name + " (auto, workspace or cluster)");
  return kernels::SplitMerge::automatic;
}

// Where the plan merges splits: "-" (one split), "L2" (workspace) or "cluster".
std::string merge_name(const kernels::DecodeAttentionPlan& plan) {
  if (plan.splits_per_sequence == 1) return "-";
  return plan.cluster_merge ? "cluster" : "L2";
}

int run_gpu(const AttentionBenchOptions& o) {
  const GpuBench gpu;
  const DeviceInfo& device = gpu.device;
  cudaStream_t stream = gpu.stream;
  const double copy_bw = gpu.copy_bw;
  if (!o.trace_path.empty()) start_trace_csv("attention", o.trace_path);
  std::printf("decode attention: %d query heads, %d kv heads, head_dim %d, bf16, pages of %d tokens\n", o.q_heads,
              o.kv_heads, o.head_dim, kernels::kKvPageSize);

  std::vector<Row> rows;
  for (const AttentionBenchCase& c : o.cases) {
    kernels::DecodeAttentionPlan plan =
        kernels::plan_decode_attention(c.batch, o.q_heads, o.kv_heads, o.head_dim, c.context, device.sm_count, o.splits,
                                      o.warps, split_merge(o.merge));
    if (o.merge == "auto" && o.splits == 0 && o.warps == 0) {  // as the engine runs short sequences
      const auto shorter = kernels::plan_short_context_decode_attention(
          plan, device.sm_count, kernels::decode_attention_resident_clusters(o.head_dim));
      if (shorter && shorter->max_context >= c.context) plan = *shorter;
    }
    // Enough separate pools of K/V pages (each with its own scattered block table) that the
    // pages a call reads were evicted from L2 since the last call that read them.
    const int pages_per_seq = (c.context + kernels::kKvPageSize - 1) / kernels::kKvPageSize;
    const size_t page_elements = static_cast<size_t>(o.kv_heads) * kernels::kKvPageSize * o.head_dim;
    const size_t pages_per_call = static_cast<size_t>(c.batch) * pages_per_seq;
    const double bytes_per_call = 2.0 * pages_per_call * page_elements * 2;
    const int copies = std::max(2, static_cast<int>(std::ceil(o.l2_multiple * device.l2_bytes / bytes_per_call)));
    const size_t total_pages = pages_per_call * copies;

    DeviceBuffer k_pool(total_pages * page_elements * 2), v_pool(total_pages * page_elements * 2);
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(k_pool.as<__nv_bfloat16>(), total_pages * page_elements, 1, 1.0f, stream));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(v_pool.as<__nv_bfloat16>(), total_pages * page_elements, 2, 1.0f, stream));
    // A shuffled permutation of the pool, read as [copy][sequence][page]: each call's pages are
    // scattered over the whole pool as a long-running server's would be.
    std::vector<int32_t> tables(total_pages);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937_64(7));
    const DeviceBuffer block_tables = DeviceBuffer::from_host(tables);
    const DeviceBuffer seq_lens = DeviceBuffer::from_host(std::vector<int32_t>(c.batch, c.context));
    const size_t out_elements = static_cast<size_t>(c.batch) * o.q_heads * o.head_dim;
    DeviceBuffer q(out_elements * 2), out(out_elements * 2), workspace(std::max<size_t>(plan.workspace_bytes, 16));
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(q.as<__nv_bfloat16>(), out_elements, 3, 1.0f, stream));
    workspace.zero(stream);

    kernels::DecodeAttentionParams params;
    params.q = q.as<const __nv_bfloat16>();
    params.out = out.as<__nv_bfloat16>();
    params.kv = {k_pool.as<__nv_bfloat16>(), v_pool.as<__nv_bfloat16>(), nullptr, pages_per_seq, o.kv_heads, o.head_dim};
    params.seq_lens = seq_lens.as<const int32_t>();
    params.workspace = workspace.data();
    params.scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
    auto call = [&](int rep) {
      params.kv.block_table = block_tables.as<const int32_t>() + (rep % copies) * pages_per_call;
      DF_CHECK_CUDA(kernels::launch_decode_attention(plan, params, stream));
    };
    const PowerCapWindow capped(gpu.power_cap);
    const double stream_us = median_call_us(call, o.warmup, o.repetitions, stream);
    const double graph_us =
        median_graph_call_us(call, graph_calls_for_copies(copies), std::max(5, o.repetitions / 10), stream);
    const std::optional<double> power_capped = capped.fraction();
    if (!o.trace_path.empty())
      trace_graph_calls(call, graph_calls_for_copies(copies, 8), "attention", "attention", c.batch, c.context,
                        o.trace_path, stream);
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    for (uint16_t bits : out.to_host<uint16_t>(out_elements))
      DF_CHECK((bits & 0x7f80u) != 0x7f80u, "decode attention produced a non-finite output at " + case_name(c));
    rows.push_back({c, plan, copies, graph_us, stream_us, power_capped});
    std::fprintf(stderr, "  measured %s (%d KV copies, %.0f MB each)\n", case_name(c).c_str(), copies, bytes_per_call / 1e6);
  }

  Table table({"batch x context", "q/kv heads", "d", "splits", "warps", "merge", "us graph", "TB/s", "%copy",
               "us stream", "%copy stream", "launches", "power-capped"});
  nlohmann::json json = run_header(device, copy_bw);
  json["suite"] = "attention";
  json["power_cap_counter"] = gpu.power_cap.available();
  json["rows"] = nlohmann::json::array();
  int capped_rows = 0;
  ImpossibleRows impossible("attention");
  for (const Row& r : rows) {
    if (power_capped_noteworthy(r.power_capped)) ++capped_rows;
    const double bytes = kv_bytes(r.shape, o);
    const bool possible = impossible.check(gpu.possible(bytes, r.graph_us) && gpu.possible(bytes, r.stream_us),
                                           case_name(r.shape));
    const double tbps = bytes / (r.graph_us * 1e-6) / 1e12;
    const double pct = 100.0 * tbps * 1e12 / copy_bw;
    const double pct_stream = 100.0 * bytes / (r.stream_us * 1e-6) / copy_bw;
    const int launches = kernels::decode_attention_launches(r.plan);
    table.add({case_name(r.shape), std::to_string(o.q_heads) + "/" + std::to_string(o.kv_heads),
               std::to_string(o.head_dim), std::to_string(r.plan.splits_per_sequence),
               std::to_string(r.plan.warps_per_block), merge_name(r.plan), format_fixed(r.graph_us, 1),
               format_fixed(tbps, 2), format_fixed(pct, 1), format_fixed(r.stream_us, 1), format_fixed(pct_stream, 1),
               std::to_string(launches), power_capped_cell(r.power_capped)});
    json["rows"].push_back({{"batch", r.shape.batch}, {"context", r.shape.context}, {"q_heads", o.q_heads},
                            {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                            {"splits", r.plan.splits_per_sequence}, {"warps_per_block", r.plan.warps_per_block},
                            {"merge", merge_name(r.plan)},
                            {"kv_copies", r.kv_copies}, {"us", r.graph_us}, {"tbps", tbps}, {"pct_copy", pct},
                            {"us_stream", r.stream_us}, {"pct_copy_stream", pct_stream}, {"launches", launches},
                            {"power_capped_fraction", power_capped_json(r.power_capped)},
                            {"physically_possible", possible}});
  }
  std::fputs(table.render().c_str(), stdout);
  print_power_capped_note(capped_rows);
  if (!o.json_path.empty()) write_json(o.json_path, json);
  return impossible.finish();
}

// No GPU: time the CPU reference (fp64 sums over fp32 K/V) so the command still shows what it
// computes. The sequences of a batch share one K/V cache here to keep host memory small.
int run_cpu(const AttentionBenchOptions& o) {
  std::printf("No CUDA device: timing the CPU reference on one thread (%u available)\n", std::thread::hardware_concurrency());
  Table table({"batch x context", "q/kv heads", "d", "variant", "us", "GB/s (fp32 K+V)"});
  nlohmann::json json = {{"gpu", "none (CPU reference)"}, {"commit", build_commit()}, {"suite", "attention"}};
  json["rows"] = nlohmann::json::array();
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = dist(rng);
    return v;
  };
  for (const AttentionBenchCase& c : o.cases) {
    const size_t cache = static_cast<size_t>(c.context) * o.kv_heads * o.head_dim;
    const auto k = random(cache), v = random(cache), q = random(static_cast<size_t>(c.batch) * o.q_heads * o.head_dim);
    std::vector<float> out(static_cast<size_t>(o.q_heads) * o.head_dim);
    const float scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
    const double us = median_host_call_us(
        [&] {
          for (int s = 0; s < c.batch; ++s)
            reference::attention_decode(q.data() + static_cast<size_t>(s) * o.q_heads * o.head_dim, k.data(), v.data(),
                                        c.context, o.q_heads, o.kv_heads, o.head_dim, scale, 0, out.data());
        },
        1);
    const double gbps = 2.0 * c.batch * cache * sizeof(float) / (us * 1e-6) / 1e9;
    table.add({case_name(c), std::to_string(o.q_heads) + "/" + std::to_string(o.kv_heads), std::to_string(o.head_dim),
               "reference", format_fixed(us, 0), format_fixed(gbps, 2)});
    json["rows"].push_back({{"batch", c.batch}, {"context", c.context}, {"q_heads", o.q_heads}, {"kv_heads", o.kv_heads},
                            {"head_dim", o.head_dim}, {"variant", "reference"}, {"us", us}});
  }
  std::fputs(table.render().c_str(), stdout);
  if (!o.json_path.empty()) write_json(o.json_path, json);
  return 0;
}

}  // namespace

int run_attention_bench(const AttentionBenchOptions& options) {
  DF_CHECK(!options.cases.empty(), "bench attention: no cases");
  DF_CHECK(options.kv_heads >= 1 && options.q_heads >= 1 && options.q_heads % options.kv_heads == 0,
           "bench attention: q_heads " + std::to_string(options.q_heads) + " is not a multiple of kv_heads " +
               std::to_string(options.kv_heads));
  DF_CHECK(options.head_dim == 64 || options.head_dim == 128,
           "bench attention: head_dim " + std::to_string(options.head_dim) + " (64 or 128 supported)");
  for (const auto& c : options.cases)
    DF_CHECK(c.batch >= 1 && c.context >= 1, "bench attention: batch and context must be positive");
  return cuda_device_available() ? run_gpu(options) : run_cpu(options);
}

}  // namespace deepfuse::bench
