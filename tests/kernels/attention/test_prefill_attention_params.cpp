// Host-side argument checks of the prefill attention launcher: every bad field is refused with
// cudaErrorInvalidValue before anything touches a device, so this runs without a GPU, and with one
// (scripts/device/gpu.sh runs it there: a device must change nothing in the checks).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "deepfuse/device.hpp"
#include "deepfuse/kernels/prefill_attention.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::PrefillAttentionParams;
using testing::fake_device_pointer;

// 28 query heads over 4 kv heads of 128, a 100-token chunk at position 37 of sequence 2.
PrefillAttentionParams valid_params() {
  PrefillAttentionParams p;
  p.q = fake_device_pointer<const __nv_bfloat16>(0x100000);
  p.out = fake_device_pointer<__nv_bfloat16>(0x200000);
  p.kv.k_pages = fake_device_pointer<__nv_bfloat16>(0x300000);
  p.kv.v_pages = fake_device_pointer<__nv_bfloat16>(0x400000);
  p.kv.block_table = fake_device_pointer<const int32_t>(0x500000);
  p.kv.max_pages_per_seq = 9;  // 137 keys need exactly 9 pages
  p.kv.kv_heads = 4;
  p.kv.head_dim = 128;
  p.sequence = 2;
  p.q_start = 37;
  p.q_len = 100;
  p.q_heads = 28;
  p.scale = 1.0f / std::sqrt(128.0f);
  p.sliding_window = 0;
  return p;
}

struct Mutation {
  std::string what;
  std::function<void(PrefillAttentionParams&)> apply;
};

TEST(PrefillAttentionParams, RejectsEachBadField) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<Mutation> mutations = {
      {"q null", [](auto& p) { p.q = nullptr; }},
      {"out null", [](auto& p) { p.out = nullptr; }},
      {"k_pages null", [](auto& p) { p.kv.k_pages = nullptr; }},
      {"v_pages null", [](auto& p) { p.kv.v_pages = nullptr; }},
      {"block_table null", [](auto& p) { p.kv.block_table = nullptr; }},
      {"q not 16-byte aligned", [](auto& p) { p.q += 1; }},
      {"out not 16-byte aligned", [](auto& p) { p.out += 4; }},
      {"k_pages not 16-byte aligned", [](auto& p) { p.kv.k_pages += 2; }},
      {"v_pages not 16-byte aligned", [](auto& p) { p.kv.v_pages += 1; }},
      {"head_dim 96", [](auto& p) { p.kv.head_dim = 96; }},
      {"head_dim 0", [](auto& p) { p.kv.head_dim = 0; }},
      {"kv_heads 0", [](auto& p) { p.kv.kv_heads = 0; }},
      {"q_heads 0", [](auto& p) { p.q_heads = 0; }},
      {"q_heads not a multiple of kv_heads", [](auto& p) { p.q_heads = 30; }},
      {"q_len 0", [](auto& p) { p.q_len = 0; }},
      {"q_len negative", [](auto& p) { p.q_len = -3; }},
      {"q_start negative", [](auto& p) { p.q_start = -1; }},
      {"sequence negative", [](auto& p) { p.sequence = -1; }},
      {"sliding_window negative", [](auto& p) { p.sliding_window = -1; }},
      {"block table row one page short", [](auto& p) { p.kv.max_pages_per_seq = 8; }},
      {"max_pages_per_seq 0", [](auto& p) { p.kv.max_pages_per_seq = 0; }},
      {"more than 65535 query tiles",
       [](auto& p) {
         p.q_start = 0;
         p.q_len = 65535 * 64 + 1;
         p.kv.max_pages_per_seq = 1 << 26;
       }},
      {"q_start + q_len past INT_MAX",
       [](auto& p) {
         p.q_start = INT_MAX - 5;
         p.q_len = 17;
         p.kv.max_pages_per_seq = INT_MAX;
       }},
      {"positions within two key tiles of INT_MAX",
       [](auto& p) {
         p.q_start = INT_MAX - 100;
         p.q_len = 1;
         p.kv.max_pages_per_seq = INT_MAX;
       }},
      {"scale 0", [](auto& p) { p.scale = 0.0f; }},
      {"scale negative", [](auto& p) { p.scale = -0.1f; }},
      {"scale NaN", [nan](auto& p) { p.scale = nan; }},
      {"scale infinite", [inf](auto& p) { p.scale = inf; }},
  };
  for (const Mutation& m : mutations) {
    PrefillAttentionParams p = valid_params();
    m.apply(p);
    EXPECT_EQ(kernels::launch_prefill_attention(p, nullptr), cudaErrorInvalidValue) << m.what;
  }
}

// Device buffers for the base case (zeroed: every block table entry names page 0), freed on exit.
struct BaseCaseBuffers {
  std::vector<void*> allocations;
  ~BaseCaseBuffers() {
    for (void* a : allocations) cudaFree(a);
  }
  template <typename T>
  T* zeroed(size_t count) {
    void* p = nullptr;
    if (cudaMalloc(&p, count * sizeof(T)) != cudaSuccess) return nullptr;
    allocations.push_back(p);
    return cudaMemset(p, 0, count * sizeof(T)) == cudaSuccess ? static_cast<T*>(p) : nullptr;
  }
};

// The base case passes validation, on both kinds of machine. Without a device the launcher gets as
// far as asking for one; with one the base case runs on real, zeroed buffers of its sizes (the fake
// addresses would be dereferenced) and must launch and finish.
TEST(PrefillAttentionParams, AcceptsTheBaseCase) {
  const bool gpu = cuda_device_available();
  for (int head_dim : {64, 128}) {
    PrefillAttentionParams p = valid_params();
    p.kv.head_dim = head_dim;
    if (!gpu) {
      EXPECT_NE(kernels::launch_prefill_attention(p, nullptr), cudaErrorInvalidValue) << "head_dim " << head_dim;
      continue;
    }
    BaseCaseBuffers buffers;
    const size_t tokens = static_cast<size_t>(p.q_len) * p.q_heads * head_dim;
    const size_t page = static_cast<size_t>(p.kv.kv_heads) * kernels::kKvPageSize * head_dim;
    p.q = buffers.zeroed<__nv_bfloat16>(tokens);
    p.out = buffers.zeroed<__nv_bfloat16>(tokens);
    p.kv.k_pages = buffers.zeroed<__nv_bfloat16>(page);
    p.kv.v_pages = buffers.zeroed<__nv_bfloat16>(page);
    p.kv.block_table = buffers.zeroed<int32_t>(static_cast<size_t>(p.sequence + 1) * p.kv.max_pages_per_seq);
    ASSERT_TRUE(p.q && p.out && p.kv.k_pages && p.kv.v_pages && p.kv.block_table) << "device allocation failed";
    EXPECT_EQ(kernels::launch_prefill_attention(p, nullptr), cudaSuccess) << "head_dim " << head_dim;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "head_dim " << head_dim;
  }
}

}  // namespace
}  // namespace deepfuse
