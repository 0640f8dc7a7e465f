#include "bench/sampling_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "bench/timing.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/sampling.hpp"

namespace deepfuse::bench {
namespace {

struct Mode {
  const char* name;
  SamplingParams params;  // seed set per row
};

// Greedy, plain temperature, each filter alone, and the common top-k + top-p pairing.
constexpr Mode kModes[] = {
    {"greedy", {}},
    {"temperature", {.temperature = 0.8f}},
    {"top-k", {.temperature = 0.7f, .top_k = 50}},
    {"top-p", {.temperature = 0.7f, .top_p = 0.9f}},
    {"top-k+top-p", {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f}},
    {"min-p", {.temperature = 1.0f, .min_p = 0.05f}},
};

const Mode& find_mode(const std::string& name) {
  for (const Mode& m : kModes)
    if (name == m.name) return m;
  std::string known;
  for (const Mode& m : kModes) known += (known.empty() ? "" : ", ") + std::string(m.name);
  throw Error("bench sampling: unknown mode '" + name + "' (known: " + known + ")");
}

// Logits shaped like a language model's: a broad normal body (std 2.5) and a few dozen ids per
// row lifted 8-14 above it, so top-p and min-p keep a handful of tokens, as they usually do. Each
// row has its own generator, so a row is the same whatever other batch sizes the run measures.
std::vector<float> model_like_logits(int rows, int vocab, uint64_t seed) {
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  for (int r = 0; r < rows; ++r) {
    std::mt19937_64 rng(seed + r);
    std::normal_distribution<float> body(0.0f, 2.5f);  // per row too: it caches a second value
    std::uniform_int_distribution<int> id(0, vocab - 1);
    std::uniform_real_distribution<float> lift(8.0f, 14.0f);
    float* row = logits.data() + static_cast<size_t>(r) * vocab;
    for (int i = 0; i < vocab; ++i) row[i] = body(rng);
    for (int i = 0; i < 32; ++i) row[id(rng)] += lift(rng);
  }
  return logits;
}

int argmax_lowest_id(const float* row, int vocab) {
  return static_cast<int>(std::max_element(row, row + vocab) - row);  // the first of equal maxima
}

struct Row {
  int vocab, batch;
  const Mode* mode;
  double graph_us, stream_us, cold_us;
  std::optional<double> power_capped;  // share of the three timings the power limit held the clocks down
};

// The launcher's cluster size, or the one --cluster asks for.
void launch(const kernels::SamplingParams& params, const SamplingBenchOptions& o, cudaStream_t stream) {
  DF_CHECK_CUDA(o.cluster_size > 0 ? kernels::launch_sampling_with_cluster_size(params, o.cluster_size, stream)
                                   : kernels::launch_sampling(params, stream));
}

// Per-call time in a graph when each call reads its own copy of the logits, the copies together
// three times the L2: the logits come from HBM, as in the decode step after the lm_head.
double cold_graph_call_us(kernels::SamplingParams params, const DeviceBuffer& logits, const SamplingBenchOptions& o,
                          const GpuBench& gpu, cudaStream_t stream) {
  const size_t bytes = static_cast<size_t>(params.batch) * params.vocab * sizeof(float);
  const int copies = static_cast<int>(std::max<size_t>(2, (3 * gpu.device.l2_bytes + bytes - 1) / bytes));
  DeviceBuffer cold(bytes * copies);
  for (int c = 0; c < copies; ++c)
    DF_CHECK_CUDA(
        cudaMemcpyAsync(cold.as<unsigned char>() + bytes * c, logits.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  auto call = [&](int rep) {
    params.logits = reinterpret_cast<const float*>(cold.as<unsigned char>() + bytes * (rep % copies));
    launch(params, o, stream);
  };
  const double us = median_graph_call_us(call, graph_calls_for_copies(copies), std::max(3, o.repetitions / 50), stream);
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  return us;
}

int run_gpu(const SamplingBenchOptions& o) {
  const GpuBench gpu;
  cudaStream_t stream = gpu.stream;
  std::printf("sampling: fp32 logits, one id per sequence; 'graph' and 'stream' read the same logits from L2 each call,\n"
              "'cold' rotates copies over 3x the L2 in a graph, so each call reads from HBM (after the lm_head's weight\n"
              "stream most logits are no longer in L2)\n");
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  std::vector<Row> rows;
  for (int vocab : o.vocabs) {
    const std::vector<float> host_logits = model_like_logits(max_batch, vocab, 11);
    const DeviceBuffer logits = DeviceBuffer::from_host(host_logits);
    DeviceBuffer slots(max_batch * sizeof(kernels::SamplingSlot)), ids(max_batch * sizeof(int32_t));
    DeviceBuffer workspace(std::max<size_t>(kernels::sampling_workspace_bytes(max_batch, vocab), 16));
    for (int batch : o.batches) {
      for (const std::string& name : o.modes) {
        const Mode& mode = find_mode(name);
        std::vector<kernels::SamplingSlot> host_slots(batch);
        for (int s = 0; s < batch; ++s) {
          SamplingParams row_params = mode.params;
          row_params.seed = 1000 + s;
          host_slots[s] = kernels::sampling_slot(row_params);
        }
        slots.upload(host_slots.data(), batch * sizeof(kernels::SamplingSlot));
        kernels::SamplingParams params;
        params.logits = logits.as<float>();
        params.slots = slots.as<kernels::SamplingSlot>();
        params.ids = ids.as<int32_t>();
        params.workspace = workspace.data();
        params.batch = batch;
        params.vocab = vocab;
        auto call = [&](int) {
          launch(params, o, stream);
        };
        const PowerCapWindow capped(gpu.power_cap);
        const double stream_us = median_call_us(call, o.warmup, o.repetitions, stream);
        const double graph_us = median_graph_call_us(call, 20, std::max(5, o.repetitions / 10), stream);
        const double cold_us = cold_graph_call_us(params, logits, o, gpu, stream);
        const std::optional<double> power_capped = capped.fraction();
        DF_CHECK_CUDA(cudaStreamSynchronize(stream));
        // Self-check: every id inside the vocabulary, greedy ids equal to the host's argmax.
        const std::vector<int32_t> got = ids.to_host<int32_t>(batch);
        for (int s = 0; s < batch; ++s) {
          DF_CHECK(got[s] >= 0 && got[s] < vocab, "bench sampling: id " + std::to_string(got[s]) + " outside the vocabulary");
          if (mode.params.temperature <= 0.0f)
            DF_CHECK(got[s] == argmax_lowest_id(host_logits.data() + static_cast<size_t>(s) * vocab, vocab),
                     "bench sampling: greedy id differs from the argmax in row " + std::to_string(s));
        }
        rows.push_back({vocab, batch, &mode, graph_us, stream_us, cold_us, power_capped});
        std::fprintf(stderr, "  measured vocab %d batch %d %s\n", vocab, batch, mode.name);
      }
    }
  }

  Table table({"vocab", "batch", "mode", "us graph", "us stream", "us cold", "launches", "power-capped"});
  nlohmann::json json = run_header(gpu.device, gpu.copy_bw);
  json["suite"] = "sampling";
  json["power_cap_counter"] = gpu.power_cap.available();
  json["rows"] = nlohmann::json::array();
  int capped_rows = 0;
  ImpossibleRows impossible("sampling");
  for (const Row& r : rows) {
    if (power_capped_noteworthy(r.power_capped)) ++capped_rows;
    // Only 'cold' reads its logits from HBM; 'graph' and 'stream' read them from L2, which the
    // floor already counts as free.
    const double logit_bytes = static_cast<double>(r.batch) * r.vocab * sizeof(float);
    const bool possible = impossible.check(
        gpu.possible(logit_bytes, r.cold_us) && gpu.possible(logit_bytes, r.graph_us) &&
            gpu.possible(logit_bytes, r.stream_us),
        "vocab " + std::to_string(r.vocab) + " batch " + std::to_string(r.batch) + " " + r.mode->name);
    table.add({std::to_string(r.vocab), std::to_string(r.batch), r.mode->name, format_fixed(r.graph_us, 1),
               format_fixed(r.stream_us, 1), format_fixed(r.cold_us, 1), "1", power_capped_cell(r.power_capped)});
    json["rows"].push_back({{"vocab", r.vocab}, {"batch", r.batch}, {"mode", r.mode->name},
                            {"temperature", r.mode->params.temperature}, {"top_k", r.mode->params.top_k},
                            {"top_p", r.mode->params.top_p}, {"min_p", r.mode->params.min_p}, {"us", r.graph_us},
                            {"us_stream", r.stream_us}, {"us_cold", r.cold_us}, {"launches", 1},
                            {"power_capped_fraction", power_capped_json(r.power_capped)},
                            {"physically_possible", possible}});
  }
  std::fputs(table.render().c_str(), stdout);
  print_power_capped_note(capped_rows);
  if (!o.json_path.empty()) write_json(o.json_path, json);
  return impossible.finish();
}

// No GPU: the CPU reference on one thread, so the command still shows what it computes.
int run_cpu(const SamplingBenchOptions& o) {
  std::printf("No CUDA device: timing the CPU reference on one thread (%u available)\n", std::thread::hardware_concurrency());
  Table table({"vocab", "batch", "mode", "variant", "us"});
  nlohmann::json json = {{"gpu", "none (CPU reference)"}, {"commit", build_commit()}, {"suite", "sampling"}};
  json["rows"] = nlohmann::json::array();
  for (int vocab : o.vocabs) {
    for (int batch : o.batches) {
      const std::vector<float> logits = model_like_logits(batch, vocab, 11);
      for (const std::string& name : o.modes) {
        const Mode& mode = find_mode(name);
        const SamplingParams& params = mode.params;
        const double us = median_host_call_us(
            [&] {
              for (int s = 0; s < batch; ++s)
                reference::sample({logits.data() + static_cast<size_t>(s) * vocab, static_cast<size_t>(vocab)}, params,
                                  {}, 0);
            },
            3);
        table.add({std::to_string(vocab), std::to_string(batch), mode.name, "reference", format_fixed(us, 0)});
        json["rows"].push_back({{"vocab", vocab}, {"batch", batch}, {"mode", mode.name}, {"variant", "reference"}, {"us", us}});
      }
    }
  }
  std::fputs(table.render().c_str(), stdout);
  if (!o.json_path.empty()) write_json(o.json_path, json);
  return 0;
}

}  // namespace

std::vector<std::string> sampling_bench_modes() {
  std::vector<std::string> names;
  for (const Mode& m : kModes) names.emplace_back(m.name);
  return names;
}

int run_sampling_bench(const SamplingBenchOptions& options) {
  SamplingBenchOptions o = options;
  if (o.vocabs.empty()) o.vocabs = {128256, 152064};
  if (o.batches.empty()) o.batches = {1, 8, 32};
  if (o.modes.empty()) o.modes = sampling_bench_modes();
  for (const std::string& name : o.modes) find_mode(name);  // unknown names fail before any work
  for (int v : o.vocabs) DF_CHECK(v >= 1 && v <= (1 << 30), "bench sampling: vocab " + std::to_string(v) + " outside [1, 2^30]");
  for (int b : o.batches) DF_CHECK(b >= 1 && b <= 4096, "bench sampling: batch " + std::to_string(b) + " outside [1, 4096]");
  return cuda_device_available() ? run_gpu(o) : run_cpu(o);
}

}  // namespace deepfuse::bench
