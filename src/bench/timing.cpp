#include "bench/timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "core/cuda_event.hpp"
#include "core/graph_timing.hpp"
#include "core/roofline.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"

#include "deepfuse_commit.hpp"  // DEEPFUSE_GIT_COMMIT, stamped at build time (src/bench/sources.cmake)

namespace deepfuse::bench {

namespace {
double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}
}  // namespace

GpuBench::GpuBench() : device(query_device()) {
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  copy_bw = measure_copy_bandwidth(size_t{1} << 30, 20, stream);
  std::printf("GPU: %s, %d SMs, L2 %.0f MB; measured copy bandwidth %.3f TB/s (read+write), DRAM peak %.3f TB/s\n",
              device.name.c_str(), device.sm_count, device.l2_bytes / 1e6, copy_bw / 1e12,
              dram_peak_bandwidth(device) / 1e12);
}

bool GpuBench::possible(double bytes, double us) const {
  return physically_possible(bytes, us * 1e-6, read_ceiling(device, copy_bw), device.l2_bytes);
}

bool ImpossibleRows::check(bool possible, const std::string& label) {
  if (!possible) labels_.push_back(label);
  return possible;
}

int ImpossibleRows::finish() const {
  if (labels_.empty()) return 0;
  std::fprintf(stderr,
               "error: bench %s: %zu row(s) took less time than reading their bytes can at the DRAM's peak, with "
               "everything L2 holds free (a timing bug, not a result; JSON physically_possible false):\n",
               suite_.c_str(), labels_.size());
  for (const std::string& label : labels_) std::fprintf(stderr, "  %s\n", label.c_str());
  return 1;
}

GpuBench::~GpuBench() {
  if (stream) cudaStreamDestroy(stream);  // queued work still completes; nothing to report from here
}

void warm_up_clocks() {
  constexpr size_t kBytes = size_t{64} << 20;
  DeviceBuffer from(kBytes), to(kBytes);
  cudaStream_t stream = nullptr;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    auto copy = [&](int) {
      DF_CHECK_CUDA(cudaMemcpyAsync(to.data(), from.data(), kBytes, cudaMemcpyDeviceToDevice, stream));
    };
    warm_up(copy, 1, stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

void append_trace_csv(const std::string& path, const std::string& arch, int batch, int context, double case_ms,
                      const std::vector<kernels::trace::Event>& events) {
  namespace trace = kernels::trace;
  std::ofstream out(path, std::ios::app);
  DF_CHECK(out.good(), "--trace: cannot write " + path);
  if (out.tellp() == 0) out << "arch,batch,context,step_ms,grid,kernel,mark,block,sm,time_ns\n";
  for (const trace::Event& e : events)
    out << arch << ',' << batch << ',' << context << ',' << case_ms << ',' << e.grid << ','
        << trace::kernel_name(e.kernel) << ',' << trace::mark_name(e.mark) << ',' << e.block << ',' << e.sm << ','
        << e.time_ns << '\n';
  DF_CHECK(out.good(), "--trace: writing " + path + " failed");
}

void start_trace_csv(const std::string& suite, const std::string& path) {
  DF_CHECK(kernels::trace::compiled_in(), "bench " + suite + " --trace needs a -DDEEPFUSE_TRACE=ON build");
  std::ofstream truncate(path);
  DF_CHECK(truncate.good(), "bench " + suite + " --trace: cannot write " + path);
}

void trace_graph_calls(const std::function<void(int rep)>& call, int calls, const std::string& suite,
                       const std::string& label, int batch, int context, const std::string& path,
                       cudaStream_t stream) {
  namespace trace = kernels::trace;
  constexpr unsigned kCapacity = 1u << 20;  // events: a few marks per block of every call
  trace::begin(kCapacity);
  call(0);  // an eager launch hands the kernel the (new) trace buffer
  const double us = median_graph_call_us(call, calls, 1, stream);
  const std::vector<trace::Event> events = trace::collect();
  DF_CHECK(events.size() < kCapacity, "bench " + suite + " --trace: the calls overflowed the trace buffer");
  append_trace_csv(path, label, batch, context, us / 1e3, events);
}

double median_call_us(const std::function<void(int rep)>& call, int warmup, int repetitions, cudaStream_t stream) {
  warm_up(call, warmup, stream);
  std::vector<CudaEvent> events(repetitions + 1);
  for (int rep = 0; rep < repetitions; ++rep) {
    events[rep].record(stream);
    call(rep);
  }
  events[repetitions].record(stream);
  events[repetitions].synchronize();
  std::vector<double> us(repetitions);
  for (int rep = 0; rep < repetitions; ++rep) us[rep] = events[rep + 1].ms_since(events[rep]) * 1e3;
  return median(us);
}

double median_graph_call_us(const std::function<void(int rep)>& call, int calls_per_graph, int replays,
                            cudaStream_t stream) {
  const GraphExec graph = capture_graph(stream, [&] {
    for (int i = 0; i < calls_per_graph; ++i) call(i);
    return true;
  });
  return median_replay_us_per_call(graph, calls_per_graph, replays, stream);
}

int graph_calls_for_copies(int copies, int at_least) {
  DF_CHECK(copies >= 1, "graph timing needs at least one copy");
  return copies * ((at_least + copies - 1) / copies);
}

double median_host_call_us(const std::function<void()>& call, int repetitions) {
  std::vector<double> us;
  for (int rep = 0; rep < repetitions; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median(us);
}

std::string Table::render() const {
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  widen(header_);
  for (const auto& row : rows_) widen(row);
  auto line = [&](const std::vector<std::string>& row) {
    std::string text;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      text += (c ? "  " : "") + std::string(width[c] - cell.size(), ' ') + cell;
    }
    return text + "\n";
  };
  std::string text = line(header_);
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  text += std::string(total > 2 ? total - 2 : 0, '-') + "\n";
  for (const auto& row : rows_) text += line(row);
  return text;
}

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

const char* build_commit() { return DEEPFUSE_GIT_COMMIT; }

nlohmann::json run_header(const DeviceInfo& device, double copy_bytes_per_s) {
  return {{"gpu", device.name},
          {"copy_tbps", copy_bytes_per_s / 1e12},
          {"dram_peak_tbps", dram_peak_bandwidth(device) / 1e12},
          {"read_ceiling_tbps", read_ceiling(device, copy_bytes_per_s) / 1e12},
          {"l2_bytes", device.l2_bytes},
          {"commit", build_commit()}};
}

void write_json(const std::string& path, const nlohmann::json& document) {
  std::ofstream out(path);
  DF_CHECK(out.good(), "cannot write JSON results to '" + path + "'");
  out << document.dump(2) << "\n";
  DF_CHECK(out.good(), "writing JSON results to '" + path + "' failed");
}

}  // namespace deepfuse::bench
