// Benchmark plumbing shared by every `deepfuse bench` suite: CUDA-event timing with warm-up and
// medians, a results table printed for people, and the same rows as JSON for machines.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/power_cap.hpp"
#include "core/warm_up.hpp"  // warm_up, kWarmUpTime: every timing below warms the GPU first
#include "deepfuse/device.hpp"
#include "kernels/common/trace.hpp"

namespace deepfuse::bench {

// What every kernel benchmark starts from: the device, a non-blocking stream of its own
// (destroyed with this object) and the copy bandwidth measured on that stream. The constructor
// prints "GPU: <name>, <SMs> SMs, L2 <MB> MB; measured copy bandwidth <TB/s> TB/s (read+write),
// DRAM peak <TB/s> TB/s".
struct GpuBench {
  GpuBench();
  ~GpuBench();
  GpuBench(const GpuBench&) = delete;
  GpuBench& operator=(const GpuBench&) = delete;

  // Whether a call that must read `bytes` can take `us` microseconds here (core/roofline.hpp).
  bool possible(double bytes, double us) const;

  DeviceInfo device;
  cudaStream_t stream = nullptr;
  double copy_bw = 0.0;  // bytes/s, read + write
  PowerCapCounter power_cap;  // how much of each row's timing the power limit held the clocks down
};

// Counts a suite's rows the physical floor refuses (a row's JSON says "physically_possible").
// finish() prints an error naming them and returns the suite's exit status: 1 when any.
class ImpossibleRows {
 public:
  explicit ImpossibleRows(std::string suite) : suite_(std::move(suite)) {}
  // Records the row under `label`; returns `possible`, for the row's JSON.
  bool check(bool possible, const std::string& label);
  int finish() const;

 private:
  std::string suite_;
  std::vector<std::string> labels_;
};

// Device-to-device copies for kWarmUpTime, for a benchmark whose calls cannot simply repeat (a
// decode step consumes its sequences' token budget).
void warm_up_clocks();

// Median device time in microseconds of call(rep) over `repetitions` calls, after warm_up with
// `warmup` calls. Calls are enqueued back to back with an event between each, so the GPU never waits on
// the host and each interval includes the launch gaps a real step would see.
double median_call_us(const std::function<void(int rep)>& call, int warmup, int repetitions, cudaStream_t stream);

// Median device time in microseconds per call when `calls_per_graph` calls (call(0), call(1),
// ...) are captured into one CUDA graph and replayed `replays` times, one event pair around each
// replay: the calls run back to back as in the engine's captured decode step (programmatic
// launches overlap a kernel's start with the previous one's end), without host launch gaps.
double median_graph_call_us(const std::function<void(int rep)>& call, int calls_per_graph, int replays,
                            cudaStream_t stream);

// Calls per captured graph for a benchmark that rotates `copies` weight (or KV) copies: the
// smallest multiple of `copies` that is at least `at_least`, so every copy is called equally often.
int graph_calls_for_copies(int copies, int at_least = 20);

// Median wall time in microseconds of a host-side call (CPU reference backend).
double median_host_call_us(const std::function<void()>& call, int repetitions);

// Appends traced events (kernels/common/trace.hpp, a -DDEEPFUSE_TRACE=ON build) to the CSV at
// `path` that scripts/profile/summarize_trace.py reads: a header when the file is empty, then one
// row per block mark labelled with the case (arch or kernel name, batch, context) and its wall
// time.
void append_trace_csv(const std::string& path, const std::string& arch, int batch, int context, double case_ms,
                      const std::vector<kernels::trace::Event>& events);

// Per-block timelines of one graph of `calls` calls back to back (as median_graph_call_us runs
// them), appended to `path` with append_trace_csv under the label (case, batch, context). Needs
// a -DDEEPFUSE_TRACE=ON build; `suite` names the benchmark in its errors.
void trace_graph_calls(const std::function<void(int rep)>& call, int calls, const std::string& suite,
                       const std::string& label, int batch, int context, const std::string& path,
                       cudaStream_t stream);
// Checks that this build stamps marks and empties the CSV at `path` before a run appends to it.
void start_trace_csv(const std::string& suite, const std::string& path);

// A text table: set the header once, add rows of already formatted cells, print.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string format_fixed(double value, int decimals);

// The commit this binary was built from (configure time), "unknown" outside a git checkout.
const char* build_commit();

// Run-level facts every JSON result carries: GPU name, measured copy bandwidth, the DRAM's peak
// and L2 size (what physically_possible compares with), commit.
nlohmann::json run_header(const DeviceInfo& device, double copy_bytes_per_s);

void write_json(const std::string& path, const nlohmann::json& document);

}  // namespace deepfuse::bench
