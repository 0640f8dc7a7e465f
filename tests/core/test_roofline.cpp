// The physical floor benchmarks check their rows against (src/core/roofline.hpp), on constructed
// numbers: the figures issue 55 found impossible, and ones measured honestly that must pass.
#include <gtest/gtest.h>

#include <limits>

#include "core/roofline.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse {
namespace {

// An H200 as the driver describes it: HBM3e at 3201 MHz on a 6144-bit bus, 50 MB of L2.
DeviceInfo h200() {
  return {.name = "H200-like", .l2_bytes = size_t{50} << 20, .memory_clock_khz = 3201000, .memory_bus_bits = 6144};
}

TEST(Roofline, DramPeakIsClockTimesBusTimesTwo) {
  EXPECT_NEAR(dram_peak_bandwidth(h200()), 2 * 3.201e9 * 768, 1e3);  // 4.92 TB/s
  DeviceInfo h100 = h200();
  h100.memory_clock_khz = 2619000;
  h100.memory_bus_bits = 5120;
  EXPECT_NEAR(dram_peak_bandwidth(h100) / 1e12, 3.352, 1e-3);
  EXPECT_EQ(dram_peak_bandwidth(DeviceInfo{}), 0.0);  // attributes unknown
}

TEST(Roofline, ReadCeilingIsThePeakOrTheMeasuredCopyWhicheverIsHigher) {
  EXPECT_DOUBLE_EQ(read_ceiling(h200(), 4.16e12), dram_peak_bandwidth(h200()));
  EXPECT_DOUBLE_EQ(read_ceiling(DeviceInfo{}, 4.16e12), 4.16e12);  // no peak known: the copy proves this much
  EXPECT_DOUBLE_EQ(read_ceiling(h200(), 6e12), 6e12);
}

TEST(Roofline, TheDecodeMinimumIssue55FoundIsImpossible) {
  // Llama-3-8B at batch 1: ~15 GB read per step, roofline 3.60 ms at 4.16 TB/s; bench decode
  // reported a 1.28 ms minimum and 0.013 ms for Llama-3.2-1B (~2.5 GB).
  const DeviceInfo d = h200();
  const double ceiling = read_ceiling(d, 4.16e12);
  const double llama8b = 3.60e-3 * 4.16e12, llama1b = 2.5e9;
  EXPECT_FALSE(physically_possible(llama8b, 1.28e-3, ceiling, d.l2_bytes));
  EXPECT_FALSE(physically_possible(llama1b, 0.013e-3, ceiling, d.l2_bytes));
  // What an honest step takes: above the roofline, or a little below it (reads beat a copy).
  EXPECT_TRUE(physically_possible(llama8b, 3.90e-3, ceiling, d.l2_bytes));
  EXPECT_TRUE(physically_possible(llama8b, 3.40e-3, ceiling, d.l2_bytes));
}

TEST(Roofline, ReadsFasterThanACopyButBelowThePeakArePossible) {
  // bench attention on an H200: 1.07 GB of K/V in 239 us, 107% of the 4.195 TB/s copy bandwidth.
  const DeviceInfo d = h200();
  EXPECT_TRUE(physically_possible(1.0737e9, 239.1e-6, read_ceiling(d, 4.195e12), d.l2_bytes));
  // The same bytes at 130% of the copy bandwidth would beat the DRAM's peak.
  EXPECT_FALSE(physically_possible(1.0737e9, 1.0737e9 / (1.3 * 4.195e12), read_ceiling(d, 4.195e12), d.l2_bytes));
}

TEST(Roofline, WhatL2CanHoldIsFree) {
  const DeviceInfo d = h200();
  const double ceiling = read_ceiling(d, 4.16e12);
  // A call whose bytes fit in L2 may take no time at all as far as DRAM is concerned.
  EXPECT_DOUBLE_EQ(fastest_read_seconds(static_cast<double>(d.l2_bytes), ceiling, d.l2_bytes), 0.0);
  EXPECT_TRUE(physically_possible(1e6, 1e-9, ceiling, d.l2_bytes));
  // Beyond it, only the bytes past the L2 count.
  const double bytes = static_cast<double>(d.l2_bytes) + 1e9;
  EXPECT_DOUBLE_EQ(fastest_read_seconds(bytes, ceiling, d.l2_bytes), 1e9 / ceiling);
  EXPECT_TRUE(physically_possible(bytes, 1e9 / ceiling, ceiling, d.l2_bytes));           // exactly the floor
  EXPECT_FALSE(physically_possible(bytes, 0.99 * 1e9 / ceiling, ceiling, d.l2_bytes));  // just under it
}

TEST(Roofline, NonsenseInputsAreRefusedOrImpossible) {
  EXPECT_THROW(fastest_read_seconds(-1.0, 4e12, 0), Error);
  EXPECT_THROW(fastest_read_seconds(1e9, 0.0, 0), Error);
  EXPECT_FALSE(physically_possible(1e9, std::numeric_limits<double>::quiet_NaN(), 4e12, 0));
}

}  // namespace
}  // namespace deepfuse
