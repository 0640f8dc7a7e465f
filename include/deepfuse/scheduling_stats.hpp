// The step scheduler's state (src/batching), as the CUDA engine (Engine::scheduling_stats) and
// the server's /metrics report it. Cheap to read after every step: no driver call.
#pragma once

#include <cstdint>

namespace deepfuse {

struct SchedulingStats {
  int running = 0;                           // sequences holding a decode row (prefilling or decoding)
  int waiting = 0;                           // queued, or preempted and waiting to recompute
  int kv_pages_total = 0;
  int kv_pages_used = 0;                     // referenced by some sequence
  int kv_pages_cached = 0;                   // kept by the prefix cache, evictable
  uint64_t preemptions = 0;
  uint64_t prefix_cache_queried_tokens = 0;  // prompt tokens looked up in the prefix cache at admission
  uint64_t prefix_cache_hit_tokens = 0;      // of those, served from it
  uint64_t mixed_steps = 0;                  // steps whose one pass carried prompt chunks and decode rows
};

}  // namespace deepfuse
