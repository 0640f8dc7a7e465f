// Built-in plans per GPU class, so an untuned GPU starts sane. The rules come from measurements
// recorded in docs/ (docs/scheduler.md lists each with its source); `deepfuse tune` replaces them
// with the GPU's own measurements.
#pragma once

#include <span>
#include <string>

#include "deepfuse/decode_plan.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse::scheduler {

// "sm_90" (H100, H200), "sm_89", "sm_80", or "sm_<major><minor>" for others (served by the sm_80 rules).
std::string gpu_class(const GpuInfo& gpu);

// The built-in plan for these decode buckets (ascending) on this GPU and model shape; every
// choice supported (check_plan passes). source: "built-in (<class>)".
DecodePlan builtin_plan(const PlanShape& shape, const GpuInfo& gpu, std::span<const int> buckets);

}  // namespace deepfuse::scheduler
