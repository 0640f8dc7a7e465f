#include "bench/all_reduce_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>

#include "bench/timing.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/fill.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"
#include "dist/nccl_group.hpp"
#include "dist/peer_exchange.hpp"

namespace deepfuse::bench {
namespace {

// Runs fn(rank) on one thread per rank with that rank's GPU current, as the engine drives them;
// rethrows the first failure after all joined.
void on_every_rank(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        DF_CHECK_CUDA(cudaSetDevice(r));
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// One rank's stream and buffers (NCCL's send and receive, the one-shot kernel's output).
struct RankBuffers {
  cudaStream_t stream = nullptr;
  __nv_bfloat16 *send = nullptr, *recv = nullptr, *out = nullptr;
  void release() {  // on the rank's thread
    if (stream) cudaStreamDestroy(stream);
    cudaFree(send), cudaFree(recv), cudaFree(out);
    *this = RankBuffers{};
  }
};

struct Row {
  int hidden, tokens;
  double nccl_us, flag_us, lines_us;  // the slowest rank's median; the one-shot protocols flag_after_data, flags_in_data
};

// Median µs per call of `call` in graphs of `calls` calls, every rank capturing and replaying at
// once; the slowest rank's value (a collective finishes when its last rank does).
double time_on_ranks(int ranks, const std::function<void(int rank, int call)>& call, const AllReduceBenchOptions& o,
                     const std::vector<RankBuffers>& buffers) {
  std::vector<double> us(ranks);
  on_every_rank(ranks, [&](int r) {
    call(r, 0);  // eager first: lazy setup (NCCL's connections) stays out of the capture
    DF_CHECK_CUDA(cudaStreamSynchronize(buffers[r].stream));
    us[r] = median_graph_call_us([&](int c) { call(r, c); }, o.calls_per_graph, o.replays, buffers[r].stream);
  });
  return *std::max_element(us.begin(), us.end());
}

}  // namespace

std::vector<int> default_all_reduce_bench_hiddens() { return {4096, 8192}; }
std::vector<int> default_all_reduce_bench_tokens() { return {1, 2, 4, 8, 16, 32, 64}; }

int run_all_reduce_bench(const AllReduceBenchOptions& options) {
  AllReduceBenchOptions o = options;
  if (o.hiddens.empty()) o.hiddens = default_all_reduce_bench_hiddens();
  if (o.tokens.empty()) o.tokens = default_all_reduce_bench_tokens();
  DF_CHECK(o.tp >= 2 && o.tp <= kernels::kMaxTensorParallelRanks,
           "bench allreduce: --tp " + std::to_string(o.tp) + " outside [2, 8]");
  for (int v : o.hiddens) DF_CHECK(v >= 1 && v <= (1 << 20), "bench allreduce: hidden " + std::to_string(v) + " outside [1, 2^20]");
  for (int v : o.tokens) DF_CHECK(v >= 1 && v <= 4096, "bench allreduce: tokens " + std::to_string(v) + " outside [1, 4096]");
  DF_CHECK(o.calls_per_graph >= 2 && o.calls_per_graph % 2 == 0,
           "bench allreduce: calls per graph must be even (the one-shot kernel alternates two input buffers)");
  DF_CHECK(cuda_device_available(), "bench allreduce: no CUDA device on this machine (it needs --tp GPUs)");
  int count = 0;
  DF_CHECK_CUDA(cudaGetDeviceCount(&count));
  DF_CHECK(count >= o.tp, "bench allreduce: --tp " + std::to_string(o.tp) + " needs that many GPUs, this host has " +
                              std::to_string(count));

  size_t max_elements = 0;
  for (int h : o.hiddens)
    for (int t : o.tokens) max_elements = std::max(max_elements, static_cast<size_t>(h) * t);
  std::vector<int> devices;
  for (int r = 0; r < o.tp; ++r) devices.push_back(r);
  const DeviceInfo device = query_device(0);
  dist::NcclGroup nccl(devices);  // NVLink multicast off: see NcclGroup
  dist::OneShotBuffers one_shot(devices, max_elements, max_elements);
  std::printf("%d x %s, NCCL %s; %d calls per graph, median of %d replays, slowest rank\n", o.tp, device.name.c_str(),
              dist::nccl_version().c_str(), o.calls_per_graph, o.replays);

  std::vector<RankBuffers> buffers(o.tp);
  on_every_rank(o.tp, [&](int r) {
    RankBuffers& b = buffers[r];
    DF_CHECK_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
    const size_t bytes = max_elements * sizeof(__nv_bfloat16);
    DF_CHECK_CUDA(cudaMalloc(&b.send, bytes));
    DF_CHECK_CUDA(cudaMalloc(&b.recv, bytes));
    DF_CHECK_CUDA(cudaMalloc(&b.out, bytes));
    // Finite values everywhere, so no NaN path is timed.
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(b.send, max_elements, 1 + r, 1.0f, b.stream));
    for (int slot = 0; slot < one_shot.slots(); ++slot)
      DF_CHECK_CUDA(kernels::fill_uniform_bf16(one_shot.input(r, slot), max_elements, 100 + r, 1.0f, b.stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(b.stream));
    warm_up_clocks();
  });

  std::vector<Row> rows;
  for (int hidden : o.hiddens) {
    for (int tokens : o.tokens) {
      const size_t elements = static_cast<size_t>(hidden) * tokens;
      Row row{hidden, tokens, 0, 0, 0};
      row.nccl_us = time_on_ranks(
          o.tp,
          [&](int r, int) { dist::all_reduce_sum(nccl.comm(r), buffers[r].send, buffers[r].recv, elements, buffers[r].stream); },
          o, buffers);
      // Slots alternate with the call index, as the kernel's contract asks (the graph's call count is even).
      auto one_shot_us = [&](kernels::OneShotProtocol protocol) {
        return time_on_ranks(
            o.tp,
            [&](int r, int c) {
              kernels::OneShotAllReduceParams p = one_shot.params(r, c % 2, elements, buffers[r].out);
              p.protocol = protocol;
              DF_CHECK_CUDA(kernels::launch_one_shot_all_reduce(p, buffers[r].stream));
            },
            o, buffers);
      };
      row.flag_us = one_shot_us(kernels::OneShotProtocol::flag_after_data);
      row.lines_us = one_shot_us(kernels::OneShotProtocol::flags_in_data);
      rows.push_back(row);
    }
  }
  on_every_rank(o.tp, [&](int r) { buffers[r].release(); });

  Table table({"hidden", "tokens", "KiB", "nccl_us", "flag_after_data_us", "flags_in_data_us", "nccl/best"});
  nlohmann::json json = {{"gpu", device.name}, {"commit", build_commit()}, {"suite", "allreduce"}, {"tp", o.tp},
                         {"nccl", dist::nccl_version()}, {"calls_per_graph", o.calls_per_graph}, {"replays", o.replays}};
  json["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const size_t bytes = static_cast<size_t>(r.hidden) * r.tokens * sizeof(__nv_bfloat16);
    const size_t elements = bytes / 2;
    table.add({std::to_string(r.hidden), std::to_string(r.tokens), format_fixed(bytes / 1024.0, 0),
               format_fixed(r.nccl_us, 2), format_fixed(r.flag_us, 2), format_fixed(r.lines_us, 2),
               format_fixed(r.nccl_us / std::min(r.flag_us, r.lines_us), 2)});
    json["rows"].push_back(
        {{"hidden", r.hidden}, {"tokens", r.tokens}, {"bytes", bytes}, {"nccl_us", r.nccl_us},
         {"flag_after_data_us", r.flag_us}, {"flags_in_data_us", r.lines_us},
         {"flag_after_data_blocks", kernels::one_shot_blocks(elements, kernels::OneShotProtocol::flag_after_data)},
         {"flags_in_data_blocks", kernels::one_shot_blocks(elements, kernels::OneShotProtocol::flags_in_data)},
         {"automatic", kernels::one_shot_automatic_protocol(elements, o.tp) == kernels::OneShotProtocol::flags_in_data
                           ? "flags_in_data"
                           : "flag_after_data"}});
  }
  std::fputs(table.render().c_str(), stdout);
  if (!o.json_path.empty()) write_json(o.json_path, json);
  return 0;
}

}  // namespace deepfuse::bench
