// Host-side checks for tensor parallelism, on any machine: the all-reduce oracle's order and
// rounding, the one-shot launcher refusing bad arguments before anything reaches a GPU, its grid
// sizes, and the NCCL library the build linked.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"
#include "deepfuse/reference.hpp"
#include "dist/nccl_group.hpp"
#include "dist/peer_exchange.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using testing::fake_device_pointer;

uint16_t bf(float v) { return float_to_bf16_bits(v); }

TEST(AllReduceReference, SumsInRankOrderInFp32AndRoundsOnce) {
  // 2^24 + 1 - 2^24 in fp32: (2^24 + 1) rounds to 2^24 first, so rank order gives 0 where
  // another order would give 1; bf16 holds 2^24 exactly.
  const float big = 16777216.0f;
  auto out = reference::all_reduce_sum_bf16({{bf(big)}, {bf(1.0f)}, {bf(-big)}});
  EXPECT_EQ(out[0], bf(0.0f));
  out = reference::all_reduce_sum_bf16({{bf(1.0f)}, {bf(big)}, {bf(-big)}});  // 1 + 2^24 = 2^24 in fp32, then 0
  EXPECT_EQ(out[0], bf(0.0f));
  out = reference::all_reduce_sum_bf16({{bf(big)}, {bf(-big)}, {bf(1.0f)}});
  EXPECT_EQ(out[0], bf(1.0f));
  // One rounding at the end: 1 + 2^-8 + 2^-8 is exact in fp32 (1 + 2^-7, a bf16 value); rounding
  // after each add would give 1 twice (ties to even).
  const float eps = 1.0f / 256;
  out = reference::all_reduce_sum_bf16({{bf(1.0f)}, {bf(eps)}, {bf(eps)}});
  EXPECT_EQ(out[0], bf(1.0f + 2 * eps));
  // The sum starts from rank 0's value: -0 stays -0 (0 + -0 would be +0).
  out = reference::all_reduce_sum_bf16({{0x8000}, {0x8000}});
  EXPECT_EQ(out[0], 0x8000);
  // Single rank: a copy.
  const std::vector<uint16_t> one = {bf(1.5f), bf(-3.0f), bf(1e-3f)};
  EXPECT_EQ(reference::all_reduce_sum_bf16({one}), one);
  EXPECT_THROW(reference::all_reduce_sum_bf16({{1, 2}, {3}}), Error);
  EXPECT_THROW(reference::all_reduce_sum_bf16({}), Error);
}

// 4096 elements; receive areas of `ranks` regions of 8192 elements (16 KiB) each, 16 MiB apart.
kernels::OneShotAllReduceParams valid_params(int ranks) {
  kernels::OneShotAllReduceParams p;
  p.own_input = fake_device_pointer<const __nv_bfloat16>(0x1000000);
  for (int r = 0; r < ranks; ++r) {
    p.receive[r] = fake_device_pointer<__nv_bfloat16>(0x4000000 + 0x1000000 * r);
    p.signals[r] = fake_device_pointer<uint32_t>(0x10000000 + 0x10000 * r);
  }
  p.receive_stride = 8192;
  p.out = fake_device_pointer<__nv_bfloat16>(0x20000000);
  p.ranks = ranks, p.rank = ranks - 1, p.elements = 4096;
  return p;
}

TEST(OneShotAllReduceChecks, RejectsBadArguments) {
  auto expect_invalid = [](const kernels::OneShotAllReduceParams& p, const char* what) {
    EXPECT_EQ(kernels::launch_one_shot_all_reduce(p, nullptr), cudaErrorInvalidValue) << what;
  };
  auto p = valid_params(4);
  p.ranks = 0, expect_invalid(p, "no ranks");
  p = valid_params(4), p.ranks = 9, expect_invalid(p, "9 ranks");
  p = valid_params(4), p.rank = 4, expect_invalid(p, "rank outside the group");
  p = valid_params(4), p.rank = -1, expect_invalid(p, "negative rank");
  p = valid_params(4), p.own_input = nullptr, expect_invalid(p, "null input");
  p = valid_params(4), p.own_input = fake_device_pointer<const __nv_bfloat16>(0x1000008), expect_invalid(p, "unaligned input");
  p = valid_params(4), p.receive[3] = nullptr, expect_invalid(p, "null receive area");
  p = valid_params(4), p.receive[0] = nullptr, expect_invalid(p, "null receive area of another rank");
  p = valid_params(4), p.receive[1] = fake_device_pointer<__nv_bfloat16>(0x5000004), expect_invalid(p, "unaligned receive area");
  p = valid_params(4), p.receive_stride = 4095, expect_invalid(p, "receive regions shorter than the message");
  p = valid_params(4), p.receive_stride = 4100, expect_invalid(p, "receive stride not a multiple of 8 (unaligned regions)");
  p = valid_params(4), p.receive_stride = 0, expect_invalid(p, "no receive stride");
  // flags_in_data reads its own line areas: two 16-byte lines per 8 elements.
  auto lines_params = [] {
    auto p = valid_params(4);
    for (int r = 0; r < 4; ++r) p.lines[r] = fake_device_pointer<uint4>(0x30000000 + 0x1000000 * r);
    p.line_stride = 1024;
    p.protocol = kernels::OneShotProtocol::flags_in_data;
    return p;
  };
  p = lines_params(), p.line_stride = 1023, expect_invalid(p, "line regions shorter than the message's lines");
  p = lines_params(), p.lines[1] = nullptr, expect_invalid(p, "null line area");
  p = lines_params(), p.lines[2] = fake_device_pointer<uint4>(0x32000008), expect_invalid(p, "unaligned line area");
  p = lines_params(), p.out = fake_device_pointer<__nv_bfloat16>(0x31000000 + 3 * 16384 + 16368),
  expect_invalid(p, "out inside the last line region a call touches");
  p = valid_params(4), p.protocol = kernels::OneShotProtocol::flags_in_data, expect_invalid(p, "flags_in_data without line areas");
  p = lines_params(), p.receive_stride = 0, p.out = fake_device_pointer<__nv_bfloat16>(0x6000000),
  p.elements = 0;  // receive areas are flag_after_data's: ignored here, and nothing to do
  EXPECT_EQ(kernels::launch_one_shot_all_reduce(p, nullptr), cudaSuccess);
  p = valid_params(4), p.signals[2] = nullptr, expect_invalid(p, "null signal area");
  p = valid_params(4), p.out = nullptr, expect_invalid(p, "null out");
  p = valid_params(4), p.out = fake_device_pointer<__nv_bfloat16>(0x20000002), expect_invalid(p, "unaligned out");
  p = valid_params(4), p.out = fake_device_pointer<__nv_bfloat16>(0x1000000 + 4096), expect_invalid(p, "out inside the input");
  // Region 3 of rank 2's receive area (the last region a call touches) starts at 3 x 16 KiB.
  p = valid_params(4), p.out = fake_device_pointer<__nv_bfloat16>(0x6000000 + 3 * 16384 + 8176),
  expect_invalid(p, "out inside a receive area");
  p = valid_params(4), p.own_input = fake_device_pointer<const __nv_bfloat16>(0x4000000 + 16384),
  expect_invalid(p, "input inside a receive area");
  // Nothing to do: no launch, no device needed.
  p = valid_params(4), p.elements = 0;
  EXPECT_EQ(kernels::launch_one_shot_all_reduce(p, nullptr), cudaSuccess);
}

TEST(OneShotAllReduceChecks, GridSizes) {
  using kernels::OneShotProtocol;
  for (OneShotProtocol protocol : {OneShotProtocol::flag_after_data, OneShotProtocol::flags_in_data}) {
    EXPECT_EQ(kernels::one_shot_blocks(1, protocol), 1);
    int previous = 0;
    for (size_t elements = 8; elements <= (size_t{1} << 24); elements *= 2) {
      const int blocks = kernels::one_shot_blocks(elements, protocol);
      EXPECT_GE(blocks, previous) << elements;
      EXPECT_LE(blocks, kernels::one_shot_max_blocks()) << elements;
      previous = blocks;
    }
    EXPECT_EQ(kernels::one_shot_blocks(64 * 8192, protocol), kernels::one_shot_max_blocks());  // 1 MB: all of them
  }
  // One token of a 4096-wide model: latency, not bandwidth. flags_in_data: a vector per thread
  // (more pollers), so at least as many blocks as the flag protocol's two per thread.
  EXPECT_EQ(kernels::one_shot_blocks(4096, OneShotProtocol::flag_after_data), 1);
  EXPECT_EQ(kernels::one_shot_blocks(4096, OneShotProtocol::flags_in_data), 2);
  for (size_t elements : {size_t{8}, size_t{8192}, size_t{32768}, size_t{64 * 8192}})
    EXPECT_GE(kernels::one_shot_blocks(elements, OneShotProtocol::flags_in_data),
              kernels::one_shot_blocks(elements, OneShotProtocol::flag_after_data))
        << elements;
  // A flag per (block, rank) and an epoch per block; the call's epoch and a finished-block count.
  EXPECT_GE(kernels::one_shot_signal_bytes(),
            sizeof(uint32_t) * (kernels::one_shot_max_blocks() * (kernels::kMaxTensorParallelRanks + 1) + 2));
  // Two lines of 16 bytes per 8 elements, a started group of 8 counting whole.
  EXPECT_EQ(kernels::one_shot_lines(8), 2u);
  EXPECT_EQ(kernels::one_shot_lines(9), 4u);
  EXPECT_EQ(kernels::one_shot_lines(4096), 1024u);
}

// automatic follows the measured crossovers (bench allreduce on H100s): flags_in_data up to
// 256 KiB with one peer, 32 KiB with three, 16 KiB beyond.
TEST(OneShotAllReduceChecks, AutomaticProtocolBySizeAndRanks) {
  using kernels::OneShotProtocol;
  auto automatic = [](size_t kib, int ranks) { return kernels::one_shot_automatic_protocol(kib * 512, ranks); };
  EXPECT_EQ(automatic(8, 2), OneShotProtocol::flags_in_data);
  EXPECT_EQ(automatic(256, 2), OneShotProtocol::flags_in_data);
  EXPECT_EQ(automatic(512, 2), OneShotProtocol::flag_after_data);
  EXPECT_EQ(automatic(16, 4), OneShotProtocol::flags_in_data);
  EXPECT_EQ(automatic(32, 4), OneShotProtocol::flags_in_data);
  EXPECT_EQ(automatic(64, 4), OneShotProtocol::flag_after_data);
  EXPECT_EQ(automatic(16, 8), OneShotProtocol::flags_in_data);
  EXPECT_EQ(automatic(32, 8), OneShotProtocol::flag_after_data);
}

TEST(PeerExchangeChecks, RefusesAGpuListedTwice) {
  std::string why;
  EXPECT_FALSE(dist::enable_peer_access({0, 1, 0}, &why));
  EXPECT_NE(why.find("listed twice"), std::string::npos) << why;
}

TEST(NcclChecks, VersionOfTheLinkedLibrary) {
  const std::string version = dist::nccl_version();
  std::printf("NCCL %s (built against %d.%d.%d)\n", version.c_str(), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  EXPECT_EQ(version.rfind(std::to_string(NCCL_MAJOR) + ".", 0), 0u) << version;
}

}  // namespace
}  // namespace deepfuse
