// What a bandwidth-bound timing can physically be. Every benchmark checks its rows against this
// floor, so a timing bug (an interval that is not the whole call, calls that overlap, a readback
// that returns early) shows up as an error instead of a figure above what the hardware can do.
#pragma once

#include <cstddef>

#include "deepfuse/device.hpp"

namespace deepfuse {

// The DRAM's peak rate in bytes/s from the device's attributes: memory clock x bus width x 2
// (double data rate), as CUDA's bandwidthTest computes it; 0 where the driver reports neither.
double dram_peak_bandwidth(const DeviceInfo& device);

// The fastest a kernel can read this device's DRAM, in bytes/s: its peak, or the copy bandwidth
// measured on it where that is higher or the peak is unknown. Not the copy bandwidth alone: a
// read-only stream runs faster than a copy (read + write), e.g. attention at 107% of it on an H200.
double read_ceiling(const DeviceInfo& device, double copy_bytes_per_s);

// The fewest seconds in which a call can read `bytes`: what L2 may still hold from earlier calls
// (up to l2_bytes) is free, the rest streams at read_bytes_per_s.
double fastest_read_seconds(double bytes, double read_bytes_per_s, size_t l2_bytes);

// False when `seconds` is below fastest_read_seconds: the measurement cannot be the call it names.
bool physically_possible(double bytes, double seconds, double read_bytes_per_s, size_t l2_bytes);

}  // namespace deepfuse
