#include "bench/power_cap.hpp"

#include <cstdio>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>

namespace deepfuse::bench {
namespace {

// NVML's C interface as documented (nvml.h is not needed to build): return codes are ints, 0 is
// success; devices are opaque handles; the power perf policy is 0.
constexpr int kNvmlSuccess = 0;
constexpr int kPerfPolicyPower = 0;
struct ViolationTime {
  unsigned long long reference_time_us;
  unsigned long long violation_time_ns;
};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

PowerCapCounter::PowerCapCounter() {
  char bus_id[32] = {0};
  int cuda_device = 0;
  if (cudaGetDevice(&cuda_device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), cuda_device) != cudaSuccess)
    return;
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library_) return;
  auto init = reinterpret_cast<int (*)()>(dlsym(library_, "nvmlInit_v2"));
  auto by_bus_id = reinterpret_cast<int (*)(const char*, void**)>(dlsym(library_, "nvmlDeviceGetHandleByPciBusId_v2"));
  violation_status_ = reinterpret_cast<int (*)(void*, int, void*)>(dlsym(library_, "nvmlDeviceGetViolationStatus"));
  shutdown_ = reinterpret_cast<int (*)()>(dlsym(library_, "nvmlShutdown"));
  if (!init || !by_bus_id || !violation_status_ || !shutdown_ || init() != kNvmlSuccess) {
    shutdown_ = nullptr;  // never initialised: nothing to shut down
    return;
  }
  void* device = nullptr;
  if (by_bus_id(bus_id, &device) == kNvmlSuccess) {
    device_ = device;
    if (!capped_ns()) device_ = nullptr;  // the counter is not supported on this GPU
  }
}

PowerCapCounter::~PowerCapCounter() {
  if (shutdown_) shutdown_();
  if (library_) dlclose(library_);
}

std::optional<uint64_t> PowerCapCounter::capped_ns() const {
  if (!device_) return std::nullopt;
  ViolationTime time{};
  if (violation_status_(device_, kPerfPolicyPower, &time) != kNvmlSuccess) return std::nullopt;
  return time.violation_time_ns;
}

std::string power_capped_cell(const std::optional<double>& fraction) {
  if (!fraction) return "-";
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", 100.0 * *fraction);
  return text;
}

nlohmann::json power_capped_json(const std::optional<double>& fraction) {
  return fraction ? nlohmann::json(*fraction) : nlohmann::json(nullptr);
}

bool power_capped_noteworthy(const std::optional<double>& fraction) { return fraction && *fraction > kPowerCappedNote; }

void print_power_capped_note(int rows) {
  if (rows > 0)
    std::printf("note: the power limit held the clocks down for more than %.0f%% of %d rows' timing "
                "(power-capped): those rows may read slow\n",
                100.0 * kPowerCappedNote, rows);
}

PowerCapWindow::PowerCapWindow(const PowerCapCounter& counter)
    : counter_(counter), start_ns_(counter.capped_ns()), start_wall_ns_(wall_ns()) {}

std::optional<double> PowerCapWindow::fraction() const {
  const std::optional<uint64_t> now = counter_.capped_ns();
  const int64_t wall = wall_ns() - start_wall_ns_;
  if (!start_ns_ || !now || wall <= 0) return std::nullopt;
  return std::clamp(static_cast<double>(*now - *start_ns_) / static_cast<double>(wall), 0.0, 1.0);
}

}  // namespace deepfuse::bench
