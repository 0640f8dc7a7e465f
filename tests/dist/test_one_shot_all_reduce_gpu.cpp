// The one-shot (push) all-reduce (kernels/one_shot_all_reduce.hpp), each protocol alone and both
// mixed in one graph, on 2, 4 and 8 GPUs with peer access, each rank driven from its own thread as
// the engine drives it: sizes of 8, 1000, 1003 (a tail of 3 past the 16-byte vectors), 4096,
// 64 x 8192 - 5 (every block and a tail) and 64 x 8192 elements, fresh order-sensitive inputs for every call, outputs poisoned with NaN
// (0xFFFF) before every call, results bit-identical to the CPU reference on every rank.
// Eagerly, 50 calls in a row per size without the host waiting in between (a slot's receive
// areas are rewritten every other call, so a peer still reading would show); buffers whose
// capacity is not a multiple of 8 (receive regions padded); then one CUDA graph per rank of calls
// of mixed sizes, replayed 20 times with new inputs (the epochs in device memory must keep the
// barrier right across replays). DEEPFUSE_TEST_QUICK=1: 5 calls, 3 replays.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"
#include "deepfuse/reference.hpp"
#include "dist/peer_exchange.hpp"
#include "dist_test_util.hpp"

namespace deepfuse {
namespace {

using testing::first_difference;
using testing::order_sensitive_bf16;
using testing::run_on_ranks;

const std::vector<size_t> kSizes = {8, 1000, 1003, 4096, 64 * 8192 - 5, 64 * 8192};
constexpr size_t kMaxElements = 64 * 8192;

// Per rank, on its device: a stream, `calls` staged inputs and `calls` outputs, so a sequence of
// calls runs back to back on the device and is checked afterwards.
struct RankState {
  cudaStream_t stream = nullptr;
  __nv_bfloat16* staged = nullptr;  // [calls][kMaxElements]
  __nv_bfloat16* outs = nullptr;    // [calls][kMaxElements]
  // Called on the rank's thread (its device current); the destructor only covers a failed test.
  void release() {
    if (stream) cudaStreamDestroy(stream);
    cudaFree(staged);
    cudaFree(outs);
    stream = nullptr, staged = outs = nullptr;
  }
  ~RankState() { release(); }
};

// inputs[call][rank] on the host; the rank order sums, one per call.
struct Trial {
  std::vector<std::vector<std::vector<uint16_t>>> inputs;
  std::vector<std::vector<uint16_t>> expected;
};

Trial make_trial(std::mt19937_64& rng, int ranks, const std::vector<size_t>& sizes) {
  Trial t;
  for (size_t elements : sizes) {
    std::vector<std::vector<uint16_t>> per_rank;
    for (int r = 0; r < ranks; ++r) per_rank.push_back(order_sensitive_bf16(rng, elements));
    t.expected.push_back(reference::all_reduce_sum_bf16(per_rank));
    t.inputs.push_back(std::move(per_rank));
  }
  return t;
}

// Enqueues call `c` of this rank: its staged input into the slot's buffer, NaN into out, the
// kernel. Slots alternate with the call index, as the kernel's contract asks.
void enqueue_call(const dist::OneShotBuffers& buffers, const RankState& s, int rank, int c, size_t elements,
                  kernels::OneShotProtocol protocol) {
  const int slot = c % 2;
  const size_t bytes = elements * sizeof(__nv_bfloat16);
  __nv_bfloat16* out = s.outs + static_cast<size_t>(c) * kMaxElements;
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers.input(rank, slot), s.staged + static_cast<size_t>(c) * kMaxElements, bytes,
                                cudaMemcpyDeviceToDevice, s.stream));
  DF_CHECK_CUDA(cudaMemsetAsync(out, 0xFF, bytes, s.stream));  // 0xFFFF: a NaN the kernel must overwrite
  kernels::OneShotAllReduceParams p = buffers.params(rank, slot, elements, out);
  p.protocol = protocol;
  DF_CHECK_CUDA(kernels::launch_one_shot_all_reduce(p, s.stream));
}

void stage(const RankState& s, const Trial& t, int rank) {
  for (size_t c = 0; c < t.inputs.size(); ++c)
    DF_CHECK_CUDA(cudaMemcpy(s.staged + c * kMaxElements, t.inputs[c][rank].data(),
                             t.inputs[c][rank].size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
}

// results[rank][call] read back after the stream finished.
void read_back(const RankState& s, const Trial& t, std::vector<std::vector<uint16_t>>& results) {
  DF_CHECK_CUDA(cudaStreamSynchronize(s.stream));
  results.assign(t.expected.size(), {});
  for (size_t c = 0; c < t.expected.size(); ++c) {
    results[c].resize(t.expected[c].size());
    DF_CHECK_CUDA(cudaMemcpy(results[c].data(), s.outs + c * kMaxElements, results[c].size() * sizeof(uint16_t),
                             cudaMemcpyDeviceToHost));
  }
}

void expect_exact(const Trial& t, const std::vector<std::vector<std::vector<uint16_t>>>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r)
    for (size_t c = 0; c < t.expected.size(); ++c) {
      const long at = first_difference(results[r][c], t.expected[c]);
      EXPECT_EQ(at, -1) << what << ": rank " << r << ", call " << c << " (" << t.expected[c].size()
                        << " elements): element " << at << " is 0x" << std::hex
                        << (at >= 0 ? results[r][c][at] : 0) << ", the reference 0x" << (at >= 0 ? t.expected[c][at] : 0);
    }
}

void allocate(std::vector<RankState>& states, int rank, int calls) {
  RankState& s = states[rank];
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  DF_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.staged), static_cast<size_t>(calls) * kMaxElements * sizeof(__nv_bfloat16)));
  DF_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&s.outs), static_cast<size_t>(calls) * kMaxElements * sizeof(__nv_bfloat16)));
}

std::string name(kernels::OneShotProtocol protocol) {
  switch (protocol) {
    case kernels::OneShotProtocol::automatic: return "automatic";
    case kernels::OneShotProtocol::flag_after_data: return "flag_after_data";
    case kernels::OneShotProtocol::flags_in_data: return "flags_in_data";
  }
  return "?";
}

void check_eager(const std::vector<int>& devices, kernels::OneShotProtocol protocol,
                 const std::vector<size_t>& sizes = kSizes, size_t capacity = kMaxElements) {
  const int ranks = static_cast<int>(devices.size());
  const int calls = testing::quick_mode() ? 5 : 50;
  auto rng = testing::make_rng(100 + ranks + static_cast<int>(capacity % 7) + 10 * static_cast<int>(protocol));
  dist::OneShotBuffers buffers(devices, capacity, capacity);
  std::vector<RankState> states(ranks);
  run_on_ranks(devices, [&](int rank) { allocate(states, rank, calls); });
  for (size_t elements : sizes) {
    const Trial t = make_trial(rng, ranks, std::vector<size_t>(calls, elements));
    std::vector<std::vector<std::vector<uint16_t>>> results(ranks);
    run_on_ranks(devices, [&](int rank) {
      stage(states[rank], t, rank);
      for (int c = 0; c < calls; ++c) enqueue_call(buffers, states[rank], rank, c, elements, protocol);
      read_back(states[rank], t, results[rank]);
    });
    expect_exact(t, results,
                 std::to_string(ranks) + " ranks, " + name(protocol) + ", eager, " + std::to_string(elements) + " elements");
  }
  run_on_ranks(devices, [&](int rank) { states[rank].release(); });
}

// protocols[c]: call c's (cycled), so both protocols meet within one graph.
void check_graph(const std::vector<int>& devices, const std::vector<kernels::OneShotProtocol>& protocols) {
  const int ranks = static_cast<int>(devices.size());
  const int replays = testing::quick_mode() ? 3 : 20;
  // Large and small mixed so blocks with different epoch counts meet; an even count keeps slots
  // alternating across replays.
  const std::vector<size_t> sizes = {8, 64 * 8192, 1003, 4096, 64 * 8192 - 5, 8};
  const int calls = static_cast<int>(sizes.size());
  auto rng = testing::make_rng(200 + ranks + 10 * static_cast<int>(protocols.size()));
  dist::OneShotBuffers buffers(devices, kMaxElements, kMaxElements);
  std::vector<RankState> states(ranks);
  std::vector<cudaGraphExec_t> execs(ranks, nullptr);
  run_on_ranks(devices, [&](int rank) {
    allocate(states, rank, calls);
    RankState& s = states[rank];
    cudaGraph_t graph = nullptr;
    // Thread-local: every rank's thread captures at the same time.
    DF_CHECK_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; ++c) enqueue_call(buffers, s, rank, c, sizes[c], protocols[c % protocols.size()]);
    DF_CHECK_CUDA(cudaStreamEndCapture(s.stream, &graph));
    DF_CHECK_CUDA(cudaGraphInstantiate(&execs[rank], graph, 0));
    DF_CHECK_CUDA(cudaGraphDestroy(graph));
  });
  for (int replay = 0; replay < replays; ++replay) {
    const Trial t = make_trial(rng, ranks, sizes);
    std::vector<std::vector<std::vector<uint16_t>>> results(ranks);
    run_on_ranks(devices, [&](int rank) {
      stage(states[rank], t, rank);
      DF_CHECK_CUDA(cudaGraphLaunch(execs[rank], states[rank].stream));
      read_back(states[rank], t, results[rank]);
    });
    expect_exact(t, results,
                 std::to_string(ranks) + " ranks, " + name(protocols[0]) + (protocols.size() > 1 ? " and more" : "") +
                     ", graph replay " + std::to_string(replay));
    if (::testing::Test::HasFailure()) break;  // one replay's report is enough
  }
  run_on_ranks(devices, [&](int rank) {
    DF_CHECK_CUDA(cudaGraphExecDestroy(execs[rank]));
    states[rank].release();
  });
}

using kernels::OneShotProtocol;
const std::vector<OneShotProtocol> kProtocols = {OneShotProtocol::flag_after_data, OneShotProtocol::flags_in_data};
// Calls cycle through these: each protocol follows the other on both slots' areas, and automatic
// picks per size.
const std::vector<OneShotProtocol> kMixed = {OneShotProtocol::flags_in_data, OneShotProtocol::flag_after_data,
                                             OneShotProtocol::flags_in_data, OneShotProtocol::automatic,
                                             OneShotProtocol::flag_after_data};

TEST(OneShotAllReduceGpu, TwoRanksEager) {
  DF_REQUIRE_PEER_GPUS(devices, 2);
  for (OneShotProtocol protocol : kProtocols) check_eager(devices, protocol);
}

// Capacity 1003: regions of 1024 elements (2 x 126 lines), the last vectors and the tail at their ends.
TEST(OneShotAllReduceGpu, TwoRanksOddCapacity) {
  DF_REQUIRE_PEER_GPUS(devices, 2);
  for (OneShotProtocol protocol : kProtocols) check_eager(devices, protocol, {1003, 8, 1000, 1001}, 1003);
}

// What OneShotBuffers hands the kernel: this rank's input, every rank's receive and line areas of
// the slot, all 16-byte aligned, regions long enough for the largest message, nothing shared
// between any two of them (slots, protocols, inputs).
TEST(OneShotAllReduceGpu, BufferLayout) {
  DF_REQUIRE_PEER_GPUS(devices, 2);
  const size_t input_capacity = 2000, exchange_capacity = 1003;
  dist::OneShotBuffers buffers(devices, input_capacity, exchange_capacity);
  const int ranks = buffers.ranks();
  auto begin = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::pair<uintptr_t, uintptr_t>> areas;  // [begin, end) on rank r's GPU
    for (int slot = 0; slot < buffers.slots(); ++slot) {
      const auto p = buffers.params(r, slot, exchange_capacity, nullptr);
      EXPECT_EQ(p.own_input, buffers.input(r, slot));
      EXPECT_EQ(p.ranks, ranks);
      EXPECT_EQ(p.rank, r);
      EXPECT_GE(p.receive_stride, exchange_capacity);
      EXPECT_EQ(p.receive_stride % 8, 0u);
      EXPECT_GE(p.line_stride, kernels::one_shot_lines(exchange_capacity));
      for (int q = 0; q < ranks; ++q) {
        const auto seen = buffers.params(q, slot, exchange_capacity, nullptr);
        EXPECT_EQ(seen.receive[r], p.receive[r]) << "every rank sees one area";
        EXPECT_EQ(seen.lines[r], p.lines[r]) << "every rank sees one area";
      }
      EXPECT_EQ(begin(p.own_input) % 16, 0u);
      EXPECT_EQ(begin(p.receive[r]) % 16, 0u);
      EXPECT_EQ(begin(p.lines[r]) % 16, 0u);
      areas.push_back({begin(p.own_input), begin(p.own_input) + input_capacity * sizeof(__nv_bfloat16)});
      areas.push_back({begin(p.receive[r]), begin(p.receive[r]) + ranks * p.receive_stride * sizeof(__nv_bfloat16)});
      areas.push_back({begin(p.lines[r]), begin(p.lines[r]) + ranks * p.line_stride * sizeof(uint4)});
    }
    for (size_t a = 0; a < areas.size(); ++a)
      for (size_t b = a + 1; b < areas.size(); ++b)
        EXPECT_TRUE(areas[a].second <= areas[b].first || areas[b].second <= areas[a].first)
            << "rank " << r << ": areas " << a << " and " << b << " overlap";
  }
}

TEST(OneShotAllReduceGpu, TwoRanksGraphReplays) {
  DF_REQUIRE_PEER_GPUS(devices, 2);
  for (OneShotProtocol protocol : kProtocols) check_graph(devices, {protocol});
  check_graph(devices, kMixed);
}

TEST(OneShotAllReduceGpu, FourRanksEager) {
  DF_REQUIRE_PEER_GPUS(devices, 4);
  for (OneShotProtocol protocol : kProtocols) check_eager(devices, protocol);
}

TEST(OneShotAllReduceGpu, FourRanksGraphReplays) {
  DF_REQUIRE_PEER_GPUS(devices, 4);
  for (OneShotProtocol protocol : kProtocols) check_graph(devices, {protocol});
  check_graph(devices, kMixed);
}

TEST(OneShotAllReduceGpu, EightRanksGraphReplays) {
  DF_REQUIRE_PEER_GPUS(devices, 8);
  for (OneShotProtocol protocol : kProtocols) check_graph(devices, {protocol});
  check_graph(devices, kMixed);
}

}  // namespace
}  // namespace deepfuse
