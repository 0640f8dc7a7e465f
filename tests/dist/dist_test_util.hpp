// Helpers for the tensor-parallel tests: gating on a group of GPUs with peer access, one host
// thread per rank (as the engine drives them), and bf16 data whose fp32 sums depend on order.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "dist/peer_exchange.hpp"
#include "test_util.hpp"

namespace deepfuse::testing {

// Devices 0..ranks-1 when this machine has that many and they map each other's memory; otherwise
// empty, with the reason in *why.
inline std::vector<int> peer_group(int ranks, std::string* why) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();  // no device: not an error for a test that skips
  if (count < ranks) {
    *why = "needs " + std::to_string(ranks) + " GPUs, this machine has " + std::to_string(count);
    return {};
  }
  std::vector<int> devices;
  for (int d = 0; d < ranks; ++d) devices.push_back(d);
  if (!dist::enable_peer_access(devices, why)) return {};
  return devices;
}

// Runs fn(rank) on one std::thread per rank, each with its rank's device current; the first
// exception any rank threw is rethrown here after all have joined.
inline void run_on_ranks(const std::vector<int>& devices, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < devices.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        DF_CHECK_CUDA(cudaSetDevice(devices[r]));
        fn(static_cast<int>(r));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// bf16 values over a wide range of magnitudes (2^-12 .. 2^12), so fp32 sums of several of them
// round differently in different orders: a kernel summing out of rank order shows up.
inline std::vector<uint16_t> order_sensitive_bf16(std::mt19937_64& rng, size_t count) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = float_to_bf16_bits(std::ldexp(mantissa(rng), exponent(rng)));
  return bits;
}

// Index of the first difference of two equally long bf16 vectors, or -1.
inline long first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<long>(i);
  return -1;
}

}  // namespace deepfuse::testing

// First statement of a multi-GPU test: skips unless `ranks` GPUs with peer access exist; sets
// `devices` (a std::vector<int> declared by the macro).
#define DF_REQUIRE_PEER_GPUS(devices, ranks)                                            \
  DF_REQUIRE_GPU();                                                                     \
  std::string df_why_;                                                                  \
  const std::vector<int> devices = ::deepfuse::testing::peer_group((ranks), &df_why_);  \
  if (devices.empty()) GTEST_SKIP() << "tensor-parallel GPU test skipped: " << df_why_
