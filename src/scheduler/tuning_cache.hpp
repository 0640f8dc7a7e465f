// The tuning cache: plans `deepfuse tune` measured, in one versioned JSON file, keyed by the GPU
// (name, SMs, memory, driver, CUDA runtime), the deepfuse version and the model's shape signature.
// Written atomically (a temporary file renamed over the old one, under an exclusive lock, merged
// with what other writers saved meanwhile), so concurrent tuners never corrupt it. A missing
// entry means the built-in plan; a corrupt, foreign or stale file is ignored with one line saying
// why, never a crash.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "deepfuse/decode_plan.hpp"

namespace deepfuse::scheduler {

inline constexpr int kTuningCacheSchema = 1;

struct TuningKey {
  std::string gpu;          // cudaDeviceProp::name
  int sms = 0;
  size_t memory_bytes = 0;
  int driver = 0;           // cudaDriverGetVersion
  int runtime = 0;          // cudaRuntimeGetVersion
  std::string deepfuse;     // deepfuse version (PROJECT_VERSION)
  std::string model;        // PlanShape::signature()

  std::string text() const;  // one string, the entry's key in the file
};

struct CacheLookup {
  std::optional<DecodePlan> plan;  // the entry for the key, if any
  std::string notice;              // empty, or one line: why the file was ignored
};

// Reads `path`. A missing file: no plan, no notice. Unreadable, corrupt JSON, another schema
// version ("stale"), a file that is not a deepfuse tuning cache ("foreign"), or an entry that does
// not parse: no plan and a notice naming the path and the reason.
CacheLookup load_tuned_plan(const std::filesystem::path& path, const TuningKey& key);

// Adds or replaces the entry for `key` (the plan's source records when it was tuned). Creates the
// parent folders. Throws deepfuse::Error naming the path when it cannot be written.
void save_tuned_plan(const std::filesystem::path& path, const TuningKey& key, const DecodePlan& plan);

// JSON form of a plan (also recorded in benchmark results).
std::string plan_to_json(const DecodePlan& plan);
DecodePlan plan_from_json(const std::string& json);  // throws deepfuse::Error on a malformed plan

}  // namespace deepfuse::scheduler
