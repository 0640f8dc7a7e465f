// Shared helpers for tests: seeds that change every run (printed, and overridable with
// DEEPFUSE_TEST_SEED for reproducing a failure), random data, error norms, GPU gating.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/device.hpp"

namespace deepfuse::testing {

inline uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* fixed = std::getenv("DEEPFUSE_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
    return static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  }();
  return seed;
}

// A generator per test case, derived from the run's seed and a per-case salt; the seed is
// recorded in the test's output so a failure can be replayed.
inline std::mt19937_64 make_rng(uint64_t salt) {
  ::testing::Test::RecordProperty("seed", std::to_string(test_seed()));
  std::printf("[ seed     ] DEEPFUSE_TEST_SEED=%llu (salt %llu)\n",
              static_cast<unsigned long long>(test_seed()), static_cast<unsigned long long>(salt));
  return std::mt19937_64(test_seed() ^ (salt * 0x9e3779b97f4a7c15ull));
}

// DEEPFUSE_TEST_QUICK=1: the GPU tests keep their small cases (compute-sanitizer runs, which
// are 10-100x slower).
inline bool quick_mode() {
  const char* quick = std::getenv("DEEPFUSE_TEST_QUICK");
  return quick && std::string(quick) == "1";
}

inline std::vector<float> random_uniform(std::mt19937_64& rng, size_t count, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(count);
  for (auto& v : values) v = dist(rng);
  return values;
}

// ||out - ref|| / ||ref||; NaN anywhere in out makes it NaN (so EXPECT_LT fails).
inline double relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

inline size_t count_nan(const std::vector<float>& values) {
  size_t n = 0;
  for (float v : values) n += std::isnan(v) ? 1 : 0;
  return n;
}

// A fake device address for the launchers' host-side argument checks, which must refuse a bad
// call before anything dereferences it.
template <typename T>
T* fake_device_pointer(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace deepfuse::testing

// First statement of every GPU test.
#define DF_REQUIRE_GPU()                                                                  \
  do {                                                                                    \
    if (!::deepfuse::cuda_device_available())                                             \
      GTEST_SKIP() << "no CUDA device on this machine: GPU test skipped (run it on a GPU)"; \
  } while (0)
