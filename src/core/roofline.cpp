#include "core/roofline.hpp"

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse {

double dram_peak_bandwidth(const DeviceInfo& device) {
  return 2.0 * device.memory_clock_khz * 1e3 * (device.memory_bus_bits / 8.0);
}

double read_ceiling(const DeviceInfo& device, double copy_bytes_per_s) {
  return std::max(dram_peak_bandwidth(device), copy_bytes_per_s);
}

double fastest_read_seconds(double bytes, double read_bytes_per_s, size_t l2_bytes) {
  DF_CHECK(bytes >= 0, "fastest_read_seconds: bytes must not be negative");
  DF_CHECK(read_bytes_per_s > 0, "fastest_read_seconds: the read bandwidth must be positive");
  return std::max(0.0, bytes - static_cast<double>(l2_bytes)) / read_bytes_per_s;
}

bool physically_possible(double bytes, double seconds, double read_bytes_per_s, size_t l2_bytes) {
  return seconds >= fastest_read_seconds(bytes, read_bytes_per_s, l2_bytes);
}

}  // namespace deepfuse
