// The presence/frequency penalty kernel against the CPU reference
// (reference::apply_presence_frequency_penalties) on fresh random logits, token histories and
// penalties: vocabularies of 152064 down to 7, rows with and without penalties (and negative ones)
// in one launch, fed ids new to the row, already counted, or none. Penalized logits must match
// the reference (the same fp32 rounding), every other logit must keep its bits, the counts of
// penalized rows must gain the fed id, and nothing else may be written: rows without penalties
// keep their poisoned counts, and a row past the batch keeps its NaN logits and poisoned counts.
// A captured graph replayed over several steps keeps counting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/token_penalties.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::PenaltySlot;

constexpr int32_t kPoisonCount = -777;  // counts of rows the kernel must not touch

struct Row {
  PenaltySlot slot;
  std::vector<int32_t> generated;  // before this launch
  int32_t fed = -1;
};

std::vector<int32_t> counts_of(const std::vector<int32_t>& ids, int vocab) {
  std::vector<int32_t> counts(vocab, 0);
  for (const int32_t id : ids) ++counts[id];
  return counts;
}

// A random history over a few ids (so many repeat), penalties of every kind, and a fed id that is
// new, one already generated, or none (a padded row).
Row random_row(std::mt19937_64& rng, int vocab, int kind) {
  Row row;
  std::uniform_real_distribution<float> penalty(-2.0f, 2.0f);
  switch (kind % 5) {
    case 0: break;                                                         // no penalties
    case 1: row.slot.presence = penalty(rng); break;                       // presence only
    case 2: row.slot.frequency = penalty(rng); break;                      // frequency only
    default: row.slot = {penalty(rng), penalty(rng)}; break;               // both
  }
  std::uniform_int_distribution<int32_t> any(0, vocab - 1);
  std::vector<int32_t> pool(std::min(vocab, 12));
  for (int32_t& id : pool) id = any(rng);
  std::uniform_int_distribution<size_t> from_pool(0, pool.size() - 1);
  const int length = std::uniform_int_distribution<int>(0, 60)(rng);
  for (int i = 0; i < length; ++i) row.generated.push_back(i % 3 == 0 ? any(rng) : pool[from_pool(rng)]);
  switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
    case 0: row.fed = any(rng); break;
    case 1: row.fed = row.generated.empty() ? -1 : row.generated.back(); break;
    default: row.fed = -1; break;
  }
  return row;
}

// The logits after the kernel, per the reference; `count_fed` says whether the fed id counts.
std::vector<float> expected_logits(std::vector<float> logits, const Row& row, bool count_fed) {
  std::vector<int32_t> ids = row.generated;
  if (count_fed && row.fed >= 0) ids.push_back(row.fed);
  reference::apply_presence_frequency_penalties(logits, row.slot.presence, row.slot.frequency, ids);
  return logits;
}

template <typename T>
std::vector<T> row_of(const std::vector<T>& rows, int row, int vocab) {
  const auto begin = rows.begin() + static_cast<size_t>(row) * vocab;
  return std::vector<T>(begin, begin + vocab);
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Compares one row of the kernel's logits and counts with what the reference says.
void expect_row(const std::vector<float>& before, const std::vector<float>& after, const std::vector<int32_t>& counts,
                const Row& row, bool count_fed, const std::string& what) {
  const int vocab = static_cast<int>(before.size());
  if (!kernels::penalized(row.slot)) {
    for (int id = 0; id < vocab; ++id) {
      ASSERT_TRUE(same_bits(after[id], before[id])) << what << ": unpenalized row, id " << id << " changed";
      ASSERT_EQ(counts[id], kPoisonCount) << what << ": unpenalized row's counts written at id " << id;
    }
    return;
  }
  const std::vector<float> expected = expected_logits(before, row, count_fed);
  std::vector<int32_t> ids = row.generated;
  if (count_fed && row.fed >= 0) ids.push_back(row.fed);
  const std::vector<int32_t> expected_counts = counts_of(ids, vocab);
  for (int id = 0; id < vocab; ++id) {
    ASSERT_EQ(counts[id], expected_counts[id]) << what << ": count of id " << id;
    if (expected_counts[id] == 0) {
      ASSERT_TRUE(same_bits(after[id], before[id])) << what << ": id " << id << " never generated, but changed";
      continue;
    }
    // fp32 with the same rounding: equal, up to a compiler that contracts the reference's
    // multiply-add into one fused operation (a few ulp).
    const float scale = std::abs(before[id]) + std::abs(expected[id] - before[id]) + 1.0f;
    ASSERT_NEAR(after[id], expected[id], 4 * std::numeric_limits<float>::epsilon() * scale)
        << what << ": id " << id << " generated " << expected_counts[id] << " times";
  }
}

// One launch over `rows` (one more row in the buffers, past the batch, poisoned), checked per row.
void run_and_check(std::mt19937_64& rng, int vocab, const std::vector<Row>& rows, bool count_fed,
                   const std::string& what) {
  const int batch = static_cast<int>(rows.size());
  const size_t cells = static_cast<size_t>(batch + 1) * vocab;
  std::vector<float> logits = testing::random_uniform(rng, cells, 8.0f);
  std::vector<int32_t> counts(cells, kPoisonCount);
  std::vector<PenaltySlot> slots(batch + 1);
  std::vector<int32_t> fed(batch + 1, -1);
  for (int b = 0; b < batch; ++b) {
    slots[b] = rows[b].slot;
    fed[b] = rows[b].fed;
    if (!kernels::penalized(rows[b].slot)) continue;
    const std::vector<int32_t> start = counts_of(rows[b].generated, vocab);
    std::copy(start.begin(), start.end(), counts.begin() + static_cast<size_t>(b) * vocab);
  }
  std::fill(logits.begin() + static_cast<size_t>(batch) * vocab, logits.end(), std::numeric_limits<float>::quiet_NaN());
  slots[batch] = {1.0f, 1.0f};  // penalized, yet past the batch: must stay untouched

  DeviceBuffer logits_dev = DeviceBuffer::from_host(logits), counts_dev = DeviceBuffer::from_host(counts);
  DeviceBuffer slots_dev = DeviceBuffer::from_host(slots), fed_dev = DeviceBuffer::from_host(fed);
  kernels::TokenPenaltyParams p;
  p.logits = logits_dev.as<float>();
  p.counts = counts_dev.as<int32_t>();
  p.slots = slots_dev.as<PenaltySlot>();
  p.fed_ids = count_fed ? fed_dev.as<int32_t>() : nullptr;
  p.batch = batch;
  p.vocab = vocab;
  DF_CHECK_CUDA(kernels::launch_token_penalties(p, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> after = logits_dev.to_host<float>(cells);
  const std::vector<int32_t> counts_after = counts_dev.to_host<int32_t>(cells);

  for (int b = 0; b < batch; ++b)
    expect_row(row_of(logits, b, vocab), row_of(after, b, vocab), row_of(counts_after, b, vocab), rows[b], count_fed,
               what + ", row " + std::to_string(b));
  for (size_t i = static_cast<size_t>(batch) * vocab; i < cells; ++i) {
    ASSERT_TRUE(std::isnan(after[i])) << what << ": the row past the batch was written at " << i;
    ASSERT_EQ(counts_after[i], kPoisonCount) << what << ": the row past the batch had its counts written at " << i;
  }
}

TEST(TokenPenaltiesGpu, MatchTheReferenceAndTouchNothingElse) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(901);
  for (int vocab : {152064, 128256, 4097, 1000, 7}) {
    if (testing::quick_mode() && vocab > 4097) continue;
    for (int batch : {1, 3, 8}) {
      for (bool count_fed : {true, false}) {
        std::vector<Row> rows;
        for (int b = 0; b < batch; ++b) rows.push_back(random_row(rng, vocab, batch == 1 ? 3 : b));
        run_and_check(rng, vocab, rows, count_fed,
                      "vocab " + std::to_string(vocab) + ", batch " + std::to_string(batch) +
                          (count_fed ? ", fed ids counted" : ", no fed ids"));
      }
    }
  }
}

// In a captured graph, as the engine runs it: each replay counts the ids fed since, and penalizes
// fresh logits with every count so far.
TEST(TokenPenaltiesGpu, GraphReplaysKeepCounting) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(902);
  const int vocab = 50257, batch = 4, steps = 5;
  std::vector<Row> rows;
  for (int b = 0; b < batch; ++b) rows.push_back(random_row(rng, vocab, b + 1));  // kinds 1..4: all penalized
  const size_t cells = static_cast<size_t>(batch) * vocab;
  std::vector<int32_t> counts(cells);
  std::vector<PenaltySlot> slots;
  for (int b = 0; b < batch; ++b) {
    const std::vector<int32_t> start = counts_of(rows[b].generated, vocab);
    std::copy(start.begin(), start.end(), counts.begin() + static_cast<size_t>(b) * vocab);
    slots.push_back(rows[b].slot);
  }
  DeviceBuffer logits_dev(cells * sizeof(float)), counts_dev = DeviceBuffer::from_host(counts);
  DeviceBuffer slots_dev = DeviceBuffer::from_host(slots), fed_dev(batch * sizeof(int32_t));
  kernels::TokenPenaltyParams p;
  p.logits = logits_dev.as<float>();
  p.counts = counts_dev.as<int32_t>();
  p.slots = slots_dev.as<PenaltySlot>();
  p.fed_ids = fed_dev.as<int32_t>();
  p.batch = batch;
  p.vocab = vocab;

  cudaStream_t stream = nullptr;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  DF_CHECK_CUDA(kernels::launch_token_penalties(p, stream));
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::uniform_int_distribution<int32_t> any(0, vocab - 1);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> logits = testing::random_uniform(rng, cells, 8.0f);
    std::vector<int32_t> fed(batch);
    for (int b = 0; b < batch; ++b) {
      // Often a token the row generated before, so counts above 1 appear.
      fed[b] = step % 2 == 0 && !rows[b].generated.empty() ? rows[b].generated.front() : any(rng);
      rows[b].fed = fed[b];
    }
    logits_dev.upload(logits.data(), cells * sizeof(float));
    fed_dev.upload(fed.data(), fed.size() * sizeof(int32_t));
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::vector<float> after = logits_dev.to_host<float>(cells);
    const std::vector<int32_t> counts_after = counts_dev.to_host<int32_t>(cells);
    for (int b = 0; b < batch; ++b) {
      expect_row(row_of(logits, b, vocab), row_of(after, b, vocab), row_of(counts_after, b, vocab), rows[b], true,
                 "replay " + std::to_string(step) + ", row " + std::to_string(b));
      rows[b].generated.push_back(fed[b]);  // counted from now on
    }
  }
  DF_CHECK_CUDA(cudaGraphExecDestroy(exec));
  DF_CHECK_CUDA(cudaGraphDestroy(graph));
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace deepfuse
