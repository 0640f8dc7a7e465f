// How long the GPU's power limit held its clocks down, from NVML's cumulative "power violation"
// counter (nvmlDeviceGetViolationStatus with the power policy: nanoseconds the GPU spent below its
// application clocks because of power). A benchmark reads it around each row: `bench mlp` can run
// at the GPU's power cap, where rows read slow (docs/kernels/swiglu_fused.md, "Per-block
// timelines of `bench mlp --trace`, and the power cap").
//
// libnvidia-ml.so.1 comes with the driver, not the toolkit: it is opened at run time, so nothing
// changes at build time and a machine without it (CI) reports the counter unavailable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepfuse::bench {

// Rows whose timing the power limit held down for more than this fraction get a note.
inline constexpr double kPowerCappedNote = 0.05;

class PowerCapCounter {
 public:
  // For the current CUDA device; unavailable without NVML or without the counter.
  PowerCapCounter();
  ~PowerCapCounter();
  PowerCapCounter(const PowerCapCounter&) = delete;
  PowerCapCounter& operator=(const PowerCapCounter&) = delete;

  bool available() const { return device_ != nullptr; }
  // Nanoseconds held below the application clocks by the power limit since the driver started.
  std::optional<uint64_t> capped_ns() const;

 private:
  void* library_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
  int (*violation_status_)(void*, int, void*) = nullptr;
  int (*shutdown_)() = nullptr;
};

// Fraction of a stretch of wall time the power limit held the clocks down: construct it at the
// start, call fraction() at the end (nullopt without the counter).
class PowerCapWindow {
 public:
  explicit PowerCapWindow(const PowerCapCounter& counter);
  std::optional<double> fraction() const;

 private:
  const PowerCapCounter& counter_;
  std::optional<uint64_t> start_ns_;
  int64_t start_wall_ns_ = 0;
};

// A row's share in its table ("12%"; "-" without the counter) and in its JSON (null without it).
std::string power_capped_cell(const std::optional<double>& fraction);
nlohmann::json power_capped_json(const std::optional<double>& fraction);
bool power_capped_noteworthy(const std::optional<double>& fraction);  // above kPowerCappedNote
// The note under a table when `rows` of its rows ran power-capped above kPowerCappedNote.
void print_power_capped_note(int rows);

}  // namespace deepfuse::bench
