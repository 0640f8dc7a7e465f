// dist::NcclGroup and its collectives against CPU results, one thread per rank: bf16 all-reduce
// sums (NCCL rounds partial sums to bf16, so within a bound, but identical on every rank), fp32
// all-gather and int32 broadcast exactly; eagerly and captured into a CUDA graph per rank
// (thread-local capture mode: all ranks capture at once) replayed with new inputs.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "dist/nccl_group.hpp"
#include "dist_test_util.hpp"

namespace deepfuse {
namespace {

using testing::run_on_ranks;

constexpr size_t kReduceElements = 64 * 8192 + 5;  // not a multiple of any vector width
constexpr size_t kGatherElements = 1000;
constexpr size_t kBroadcastCount = 37;

std::vector<int> gpus_or_none(int wanted, std::string* why) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  if (count < wanted) {
    *why = "needs " + std::to_string(wanted) + " GPUs, this machine has " + std::to_string(count);
    return {};
  }
  std::vector<int> devices;
  for (int d = 0; d < (wanted > 0 ? wanted : count); ++d) devices.push_back(d);
  return devices;
}

// One rank's device buffers and stream.
struct Rank {
  cudaStream_t stream = nullptr;
  __nv_bfloat16 *reduce_in = nullptr, *reduce_out = nullptr;
  float *gather_in = nullptr, *gather_out = nullptr;
  int32_t *bcast_in = nullptr, *bcast_out = nullptr;
  void release() {
    if (stream) cudaStreamDestroy(stream);
    for (void* p : {static_cast<void*>(reduce_in), static_cast<void*>(reduce_out), static_cast<void*>(gather_in),
                    static_cast<void*>(gather_out), static_cast<void*>(bcast_in), static_cast<void*>(bcast_out)})
      cudaFree(p);
    *this = Rank{};
  }
};

struct Inputs {
  std::vector<std::vector<uint16_t>> reduce;  // [rank][kReduceElements]
  std::vector<std::vector<float>> gather;     // [rank][kGatherElements]
  std::vector<int32_t> bcast;                 // the root's
};

Inputs make_inputs(std::mt19937_64& rng, int ranks) {
  Inputs in;
  for (int r = 0; r < ranks; ++r) {
    in.reduce.push_back(to_bf16_bits(testing::random_uniform(rng, kReduceElements, 1.0f)));
    in.gather.push_back(testing::random_uniform(rng, kGatherElements, 100.0f));
  }
  std::uniform_int_distribution<int32_t> id(0, 1 << 30);
  for (size_t i = 0; i < kBroadcastCount; ++i) in.bcast.push_back(id(rng));
  return in;
}

struct Outputs {
  std::vector<uint16_t> reduce;
  std::vector<float> gather;
  std::vector<int32_t> bcast;
};

void upload(const Rank& d, const Inputs& in, int rank) {
  DF_CHECK_CUDA(cudaMemcpy(d.reduce_in, in.reduce[rank].data(), kReduceElements * 2, cudaMemcpyHostToDevice));
  DF_CHECK_CUDA(cudaMemcpy(d.gather_in, in.gather[rank].data(), kGatherElements * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> mine(kBroadcastCount, -rank - 1);  // only the root's may arrive anywhere
  if (rank == 0) mine = in.bcast;
  DF_CHECK_CUDA(cudaMemcpy(d.bcast_in, mine.data(), kBroadcastCount * 4, cudaMemcpyHostToDevice));
}

// Poisons the outputs, then the three collectives (rank 0 is the broadcast root).
void enqueue(ncclComm_t comm, const Rank& d, int ranks) {
  DF_CHECK_CUDA(cudaMemsetAsync(d.reduce_out, 0xFF, kReduceElements * 2, d.stream));
  DF_CHECK_CUDA(cudaMemsetAsync(d.gather_out, 0xFF, kGatherElements * 4 * ranks, d.stream));
  DF_CHECK_CUDA(cudaMemsetAsync(d.bcast_out, 0xFF, kBroadcastCount * 4, d.stream));
  dist::all_reduce_sum(comm, d.reduce_in, d.reduce_out, kReduceElements, d.stream);
  dist::all_gather(comm, d.gather_in, d.gather_out, kGatherElements, d.stream);
  dist::broadcast(comm, d.bcast_in, d.bcast_out, kBroadcastCount, 0, d.stream);
}

Outputs download(const Rank& d, int ranks) {
  DF_CHECK_CUDA(cudaStreamSynchronize(d.stream));
  Outputs o{std::vector<uint16_t>(kReduceElements), std::vector<float>(kGatherElements * ranks),
            std::vector<int32_t>(kBroadcastCount)};
  DF_CHECK_CUDA(cudaMemcpy(o.reduce.data(), d.reduce_out, kReduceElements * 2, cudaMemcpyDeviceToHost));
  DF_CHECK_CUDA(cudaMemcpy(o.gather.data(), d.gather_out, o.gather.size() * 4, cudaMemcpyDeviceToHost));
  DF_CHECK_CUDA(cudaMemcpy(o.bcast.data(), d.bcast_out, kBroadcastCount * 4, cudaMemcpyDeviceToHost));
  return o;
}

void check(const Inputs& in, const std::vector<Outputs>& out, const std::string& what) {
  const int ranks = static_cast<int>(out.size());
  // NCCL adds in its own order and may round partial sums to bf16: each of the ranks - 1 adds
  // and the final rounding err by at most 2^-8 of the magnitudes summed.
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < kReduceElements; ++i) {
    double sum = 0, magnitude = 0;
    for (int r = 0; r < ranks; ++r) {
      const double v = bf16_bits_to_float(in.reduce[r][i]);
      sum += v, magnitude += std::fabs(v);
    }
    const double got = bf16_bits_to_float(out[0].reduce[i]);
    if (!(std::fabs(got - sum) <= ranks * magnitude / 256 + 1e-30)) first_bad = bad++ ? first_bad : i;
  }
  EXPECT_EQ(bad, 0u) << what << ": all-reduce off at " << bad << " elements, first " << first_bad;
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(testing::first_difference(out[r].reduce, out[0].reduce), -1) << what << ": rank " << r << " differs from rank 0";
    for (int from = 0; from < ranks; ++from)
      for (size_t i = 0; i < kGatherElements; ++i)
        ASSERT_EQ(out[r].gather[from * kGatherElements + i], in.gather[from][i])
            << what << ": all-gather on rank " << r << ", from " << from << ", element " << i;
    EXPECT_EQ(out[r].bcast, in.bcast) << what << ": broadcast on rank " << r;
  }
}

void check_group(const std::vector<int>& devices) {
  const int ranks = static_cast<int>(devices.size());
  std::printf("NCCL %s, %d ranks\n", dist::nccl_version().c_str(), ranks);
  dist::NcclGroup group(devices);
  ASSERT_EQ(group.size(), ranks);
  auto rng = testing::make_rng(300 + ranks);
  std::vector<Rank> state(ranks);
  run_on_ranks(devices, [&](int r) {
    Rank& d = state[r];
    DF_CHECK_CUDA(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    DF_CHECK_CUDA(cudaMalloc(&d.reduce_in, kReduceElements * 2));
    DF_CHECK_CUDA(cudaMalloc(&d.reduce_out, kReduceElements * 2));
    DF_CHECK_CUDA(cudaMalloc(&d.gather_in, kGatherElements * 4));
    DF_CHECK_CUDA(cudaMalloc(&d.gather_out, kGatherElements * 4 * ranks));
    DF_CHECK_CUDA(cudaMalloc(&d.bcast_in, kBroadcastCount * 4));
    DF_CHECK_CUDA(cudaMalloc(&d.bcast_out, kBroadcastCount * 4));
  });

  {  // eager
    const Inputs in = make_inputs(rng, ranks);
    std::vector<Outputs> out(ranks);
    run_on_ranks(devices, [&](int r) {
      upload(state[r], in, r);
      enqueue(group.comm(r), state[r], ranks);
      out[r] = download(state[r], ranks);
    });
    check(in, out, "eager");
  }

  std::vector<cudaGraphExec_t> execs(ranks, nullptr);
  run_on_ranks(devices, [&](int r) {
    cudaGraph_t graph = nullptr;
    DF_CHECK_CUDA(cudaStreamBeginCapture(state[r].stream, cudaStreamCaptureModeThreadLocal));
    enqueue(group.comm(r), state[r], ranks);
    DF_CHECK_CUDA(cudaStreamEndCapture(state[r].stream, &graph));
    DF_CHECK_CUDA(cudaGraphInstantiate(&execs[r], graph, 0));
    DF_CHECK_CUDA(cudaGraphDestroy(graph));
  });
  for (int replay = 0; replay < 3; ++replay) {
    const Inputs in = make_inputs(rng, ranks);
    std::vector<Outputs> out(ranks);
    run_on_ranks(devices, [&](int r) {
      upload(state[r], in, r);
      DF_CHECK_CUDA(cudaGraphLaunch(execs[r], state[r].stream));
      out[r] = download(state[r], ranks);
    });
    check(in, out, "graph replay " + std::to_string(replay));
  }
  run_on_ranks(devices, [&](int r) {
    DF_CHECK_CUDA(cudaGraphExecDestroy(execs[r]));
    state[r].release();
  });
}

TEST(NcclGroupGpu, TwoRanks) {
  DF_REQUIRE_GPU();
  std::string why;
  const auto devices = gpus_or_none(2, &why);
  if (devices.empty()) GTEST_SKIP() << "NCCL test skipped: " << why;
  check_group(devices);
}

TEST(NcclGroupGpu, EveryGpu) {
  DF_REQUIRE_GPU();
  std::string why;
  auto devices = gpus_or_none(3, &why);
  if (devices.empty()) GTEST_SKIP() << "NCCL test skipped: " << why << " (the two-rank test covers 2)";
  devices = gpus_or_none(0, &why);
  check_group(devices);
}

TEST(NcclGroupGpu, AbortDoesNotHang) {
  DF_REQUIRE_GPU();
  std::string why;
  const auto devices = gpus_or_none(2, &why);
  if (devices.empty()) GTEST_SKIP() << "NCCL test skipped: " << why;
  dist::NcclGroup group(devices);
  group.abort();
  group.abort();  // idempotent
  EXPECT_THROW(group.comm(0), Error);
}

}  // namespace
}  // namespace deepfuse
