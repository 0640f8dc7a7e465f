// Per-block timelines of the decode-step kernels, for a diagnostic build (cmake
// -DDEEPFUSE_TRACE=ON). Thread 0 of every block of the traced kernels stamps %globaltimer at a
// few marks (start, upstream grids done, phase ends, end) into one device buffer, with its grid
// id and SM; `deepfuse bench decode --trace FILE` writes one step's events, and
// scripts/profile/summarize_trace.py turns them into per-launch timelines. A normal build compiles
// every mark to nothing and begin() refuses.
#pragma once

#include <cstdint>
#include <vector>

namespace deepfuse::kernels::trace {

// Which kernel a start mark belongs to (the other marks carry 0: the grid id ties them to it).
enum class Kernel : std::uint8_t {
  unknown = 0,
  fused_qkv,
  decode_attention,
  gemv_residual,
  fused_mlp,
};
enum class Mark : std::uint8_t {
  start = 0,     // the block begins
  upstream = 1,  // wait_for_upstream_grids returned (programmatic dependents)
  phase = 2,     // a kernel's own midpoint: the fused MLP's phase 1 ends, the GEMVs' last weight
  barrier = 3,   // the cluster barrier after it has passed
  end = 4,       // the block's work is done (before a finishing ticket)
  finish = 5,    // a finishing block of the fused MLP has written y
};

struct Event {
  std::uint64_t time_ns;  // %globaltimer
  std::uint64_t grid;     // %gridid: one per launch, graph replays included
  std::uint32_t block;    // linear block index
  std::uint16_t sm;
  std::uint8_t kernel;    // Kernel, on start marks
  std::uint8_t mark;      // Mark
};

// What the device side writes into; generation changes whenever begin() allocates.
struct Buffer {
  Event* events = nullptr;
  unsigned* count = nullptr;
  unsigned capacity = 0;
  unsigned generation = 0;
};

// Whether this build stamps marks at all.
bool compiled_in();
// Allocates the buffer (first call, or a larger capacity) and clears it. Call before the first
// launch of the kernels to trace: each translation unit copies the buffer's address into its own
// device symbol at its next eager launch (never inside a graph capture).
void begin(unsigned capacity);
// Waits for the device and returns the events since begin() (at most its capacity).
std::vector<Event> collect();
Buffer current_buffer();
const char* kernel_name(std::uint8_t kernel);
const char* mark_name(std::uint8_t mark);

}  // namespace deepfuse::kernels::trace
