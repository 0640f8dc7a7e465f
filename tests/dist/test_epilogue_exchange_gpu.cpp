// The fused MLP summing its output over 2, 4 or 8 ranks in its own finish
// (kernels/line_exchange.hpp), each rank driven from its own thread as the engine drives it. Every
// rank has its own weights (its slice of the intermediate dimension) and the same x, the residual
// stream; rank 0 adds it in place (x, residual and y one buffer, as the decode step runs it), the
// others write into outputs poisoned with NaN. Calls alternate slots and shapes, back to back
// without the host waiting in between, fresh inputs each.
// With the input's sum too (SwigluFusedParams::x_exchange), each rank has its own partial of x
// and its x buffer poisoned with NaN: x must come out as the CPU all-reduce of the partials, bit
// for bit (checked where it is not overwritten by y: ranks 1..), and y as above on that x.
// The expected sum is the CPU all-reduce of each rank's partial from the same kernel without the
// exchange (itself checked against fp64 in test_mlp_gpu). The MLP's L2 reductions have no fixed
// order, so a partial may differ by a rounding between the two runs: the sum is held to one bf16
// step of each term, far below any term that went missing or came from another call.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "dist/peer_exchange.hpp"
#include "dist_test_util.hpp"

namespace deepfuse {
namespace {

using testing::run_on_ranks;

// One call: a fused MLP of `hidden` x `intermediate` (per rank) on `tokens` rows.
struct Call {
  int hidden = 0, intermediate = 0, tokens = 0;
  size_t outputs() const { return static_cast<size_t>(tokens) * hidden; }
};

std::vector<uint16_t> random_bits(std::mt19937_64& rng, size_t count, float scale) {
  return to_bf16_bits(testing::random_uniform(rng, count, scale));
}

// One rank's operands of one call, on its GPU.
struct RankCall {
  DeviceBuffer x, out, reference_out;
  DeviceBuffer x_partial;  // with the input's sum: this rank's share of x
  DeviceBuffer gate, up, down, norm;  // Hugging Face layouts
  std::unique_ptr<MlpLayer> layer;
  std::vector<uint16_t> residual_host;  // rank 0: x, added in place
};

RankCall make_rank_call(const Call& call, int rank, uint64_t seed, const std::vector<uint16_t>& shared_x,
                        const std::vector<uint16_t>& norm_weight) {
  auto rng = testing::make_rng(seed * 16 + rank);
  RankCall r;
  const size_t outputs = call.outputs();
  r.out = DeviceBuffer(outputs * sizeof(uint16_t));
  r.reference_out = DeviceBuffer(outputs * sizeof(uint16_t));
  if (rank == 0) r.residual_host = shared_x;
  r.x = DeviceBuffer::from_host(shared_x);
  const size_t hi = static_cast<size_t>(call.hidden) * call.intermediate;
  const float scale = 1.7f / std::sqrt(static_cast<float>(call.hidden));
  r.gate = DeviceBuffer::from_host(random_bits(rng, hi, scale));
  r.up = DeviceBuffer::from_host(random_bits(rng, hi, scale));
  r.down = DeviceBuffer::from_host(random_bits(rng, hi, 1.7f / std::sqrt(static_cast<float>(call.intermediate))));
  r.norm = DeviceBuffer::from_host(norm_weight);
  r.layer = std::make_unique<MlpLayer>(MlpVariant::fused, MlpShape{call.hidden, call.intermediate}, 32);
  r.layer->load_weights(MlpHfWeights::bf16(r.gate.data(), r.up.data(), r.down.data(), {call.hidden, call.intermediate}),
                        nullptr, MlpNorm{r.norm.as<__nv_bfloat16>(), 1e-5f});
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return r;
}

// The call on `stream`; exchange inactive: this rank's partial into reference_out. x_exchange
// active: x is summed from the ranks' x_partial first, into x poisoned with NaN.
void enqueue(const Call& call, RankCall& r, int rank, const kernels::LineExchange& exchange,
             const kernels::LineExchange& x_exchange, cudaStream_t stream) {
  const bool exchanged = exchange.active(), input_summed = x_exchange.active();
  const size_t bytes = call.outputs() * sizeof(uint16_t);
  __nv_bfloat16* out = exchanged ? r.out.as<__nv_bfloat16>() : r.reference_out.as<__nv_bfloat16>();
  // Rank 0: x, the residual and y in one buffer; the others read their copy of x, write over NaN.
  if (rank == 0 && !input_summed)
    DF_CHECK_CUDA(cudaMemcpyAsync(out, r.residual_host.data(), bytes, cudaMemcpyHostToDevice, stream));
  else
    DF_CHECK_CUDA(cudaMemsetAsync(out, 0xFF, bytes, stream));
  __nv_bfloat16* x = rank == 0 ? out : r.x.as<__nv_bfloat16>();
  if (input_summed && rank != 0) DF_CHECK_CUDA(cudaMemsetAsync(x, 0xFF, bytes, stream));
  const __nv_bfloat16* residual = rank == 0 ? out : nullptr;
  if (input_summed)
    r.layer->run_summed_exchanged(r.x_partial.as<__nv_bfloat16>(), x_exchange, x, residual, out, call.tokens, exchange,
                                  stream);
  else if (exchanged)
    r.layer->run_exchanged(x, residual, out, call.tokens, exchange, stream);
  else
    r.layer->run(x, residual, out, call.tokens, stream);
}

void check_calls(const std::vector<int>& devices, const std::vector<Call>& calls, uint64_t seed, bool input_summed) {
  const int ranks = static_cast<int>(devices.size());
  size_t largest = 0;
  for (const Call& c : calls) largest = std::max(largest, c.outputs());
  dist::OneShotBuffers buffers(devices, largest, largest);
  // Per call: x shared by the ranks' MLPs (with the input's sum: the CPU all-reduce of the ranks'
  // partials of it), the norm weight.
  auto rng = testing::make_rng(seed);
  std::vector<std::vector<uint16_t>> shared_x, norm;
  std::vector<std::vector<std::vector<uint16_t>>> x_partials(calls.size());
  for (size_t c = 0; c < calls.size(); ++c) {
    if (input_summed) {
      for (int r = 0; r < ranks; ++r) x_partials[c].push_back(random_bits(rng, calls[c].outputs(), 0.6f));
      shared_x.push_back(reference::all_reduce_sum_bf16(x_partials[c]));
    } else {
      shared_x.push_back(random_bits(rng, calls[c].outputs(), 1.0f));
    }
    std::vector<float> weight = testing::random_uniform(rng, calls[c].hidden, 0.5f);
    for (float& w : weight) w += 1.0f;
    norm.push_back(to_bf16_bits(weight));
  }
  std::vector<std::vector<RankCall>> state(ranks);
  // partials[call][rank], results[call][rank]
  std::vector<std::vector<std::vector<uint16_t>>> partials(calls.size(), std::vector<std::vector<uint16_t>>(ranks)),
      results = partials, summed_x = partials;
  run_on_ranks(devices, [&](int rank) {
    cudaStream_t stream = nullptr;
    DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (size_t c = 0; c < calls.size(); ++c) {
      state[rank].push_back(make_rank_call(calls[c], rank, seed + c, shared_x[c], norm[c]));
      if (input_summed) state[rank].back().x_partial = DeviceBuffer::from_host(x_partials[c][rank]);
    }
    for (size_t c = 0; c < calls.size(); ++c) enqueue(calls[c], state[rank][c], rank, {}, {}, stream);
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    // Back to back, consecutive exchanges on alternate slots: the output's alone alternate; with
    // the input's sum, as in the decode step, the input's on slot 0 and the output's on slot 1.
    for (size_t c = 0; c < calls.size(); ++c) {
      const size_t n = calls[c].outputs();
      const int slot = input_summed ? 1 : static_cast<int>(c % 2);
      enqueue(calls[c], state[rank][c], rank, buffers.line_exchange(rank, slot, n),
              input_summed ? buffers.line_exchange(rank, 0, n) : kernels::LineExchange{}, stream);
    }
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    DF_CHECK_CUDA(cudaStreamDestroy(stream));
    for (size_t c = 0; c < calls.size(); ++c) {
      partials[c][rank] = state[rank][c].reference_out.to_host<uint16_t>(calls[c].outputs());
      results[c][rank] = state[rank][c].out.to_host<uint16_t>(calls[c].outputs());
      if (input_summed && rank != 0) summed_x[c][rank] = state[rank][c].x.to_host<uint16_t>(calls[c].outputs());
    }
    state[rank].clear();  // on the rank's own device
  });
  for (size_t c = 0; c < calls.size(); ++c) {
    const Call& call = calls[c];
    const std::string what = std::to_string(ranks) + " ranks, call " + std::to_string(c) + ", MLP " +
                             std::to_string(call.hidden) + "x" + std::to_string(call.intermediate) + ", " +
                             std::to_string(call.tokens) + " tokens";
    const std::vector<uint16_t> expected = reference::all_reduce_sum_bf16(partials[c]);
    for (int r = 1; r < ranks && input_summed; ++r) {
      const std::vector<uint16_t>& got = summed_x[c][r];
      const auto first = std::ranges::mismatch(got, shared_x[c]).in1 - got.begin();
      EXPECT_TRUE(got == shared_x[c]) << what << ", rank " << r
                                      << ": x is not the CPU sum of the ranks' partials, the first difference at " << first;
    }
    for (int r = 0; r < ranks; ++r) {
      const std::vector<uint16_t>& got = results[c][r];
      size_t bad = 0, first_bad = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        double magnitude = 0;
        for (int q = 0; q < ranks; ++q) magnitude += std::fabs(bf16_bits_to_float(partials[c][q][i]));
        const double error =
            std::fabs(static_cast<double>(bf16_bits_to_float(got[i])) - bf16_bits_to_float(expected[i]));
        if (!(error <= magnitude / 64) && bad++ == 0) first_bad = i;
      }
      EXPECT_EQ(bad, 0u) << what << ", rank " << r << ": " << bad << " values off, the first at " << first_bad
                         << ": " << bf16_bits_to_float(got[first_bad]) << " against "
                         << bf16_bits_to_float(expected[first_bad]);
    }
  }
}

// Llama-3-8B at TP 2 (4096 x 7168) at 1, 5, 8 and 16 tokens (one and two passes of 8), and a
// small shape.
TEST(EpilogueExchangeGpu, TwoRanks) {
  DF_REQUIRE_PEER_GPUS(devices, 2);
  const std::vector<Call> calls = {{4096, 7168, 1},  {4096, 7168, 5}, {512, 1024, 8},
                                   {4096, 7168, 16}, {4096, 7168, 1}, {4096, 7168, 8}};
  check_calls(devices, calls, 1, false);
  check_calls(devices, calls, 4, true);
}

// Llama-3-70B at TP 4 (8192 x 7168) and TP 8 (8192 x 3584).
TEST(EpilogueExchangeGpu, FourRanks) {
  DF_REQUIRE_PEER_GPUS(devices, 4);
  const std::vector<Call> calls = {{8192, 7168, 1}, {8192, 7168, 8}, {8192, 7168, 3}, {512, 1024, 16}};
  check_calls(devices, calls, 2, false);
  check_calls(devices, calls, 5, true);
}

TEST(EpilogueExchangeGpu, EightRanks) {
  DF_REQUIRE_PEER_GPUS(devices, 8);
  const std::vector<Call> calls = {{8192, 3584, 1}, {8192, 3584, 4}, {8192, 3584, 8}, {512, 1024, 2}};
  check_calls(devices, calls, 3, false);
  check_calls(devices, calls, 6, true);
}

}  // namespace
}  // namespace deepfuse
