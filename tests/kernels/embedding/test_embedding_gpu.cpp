// The embedding gather against reference::embedding on fresh random tables and ids, the output
// poisoned with NaN before each launch. Ids outside [0, vocab) must give rows of zeros.
#include <gtest/gtest.h>

#include <climits>
#include <random>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/embedding.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;

std::vector<float> random_bf16(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> values = testing::random_uniform(rng, count, scale);
  for (float& v : values) v = round_to_bf16(v);
  return values;
}

// Runs the gather with the output poisoned; returns it as floats.
std::vector<float> gather_on_gpu(const DeviceBuffer& table, int vocab, int hidden, const std::vector<int32_t>& ids) {
  const int tokens = static_cast<int>(ids.size());
  const size_t count = static_cast<size_t>(tokens) * hidden;
  DeviceBuffer ids_dev = DeviceBuffer::from_host(ids);
  DeviceBuffer out = DeviceBuffer::from_host(std::vector<uint16_t>(count, kNanBits));
  kernels::EmbeddingParams params;
  params.table = table.as<__nv_bfloat16>();
  params.ids = ids_dev.as<int32_t>();
  params.out = out.as<__nv_bfloat16>();
  params.vocab = vocab;
  params.hidden = hidden;
  params.tokens = tokens;
  DF_CHECK_CUDA(kernels::launch_embedding(params, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return bf16_bits_to_floats(out.to_host<uint16_t>(count));
}

TEST(EmbeddingGpu, MatchesReferenceForEveryTokenCountAndWidth) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(401);
  const int vocab = 5003;
  for (int hidden : {8, 904, 4096}) {
    const std::vector<float> table = random_bf16(rng, static_cast<size_t>(vocab) * hidden, 1.0f);
    const DeviceBuffer table_dev = DeviceBuffer::from_host(to_bf16_bits(table));
    for (int tokens : {1, 2, 7, 64, 300}) {
      std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
      std::vector<int32_t> ids(tokens);
      for (int32_t& id : ids) id = pick(rng);
      ids[0] = vocab - 1;  // the last row
      if (tokens > 1) ids[tokens - 1] = 0;
      const std::vector<float> out = gather_on_gpu(table_dev, vocab, hidden, ids);
      std::vector<float> expected(out.size());
      reference::embedding(table.data(), vocab, hidden, ids.data(), tokens, expected.data());
      EXPECT_EQ(testing::count_nan(out), 0u) << "hidden " << hidden << " tokens " << tokens;
      const double err = testing::relative_error(out, std::vector<double>(expected.begin(), expected.end()));
      EXPECT_LT(err, 1e-2) << "hidden " << hidden << " tokens " << tokens;
      // A gather copies bits: anything but an exact copy is a wrong row.
      for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] != expected[i]) {
          ADD_FAILURE() << "hidden " << hidden << " tokens " << tokens << ": token " << i / hidden << " (id "
                        << ids[i / hidden] << ") element " << i % hidden << " is " << out[i] << ", expected "
                        << expected[i];
          break;
        }
      }
    }
  }
}

TEST(EmbeddingGpu, OutOfRangeIdsGiveZeroRows) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(402);
  const int vocab = 1001, hidden = 904;
  const std::vector<float> table = random_bf16(rng, static_cast<size_t>(vocab) * hidden, 1.0f);
  const DeviceBuffer table_dev = DeviceBuffer::from_host(to_bf16_bits(table));
  const std::vector<int32_t> ids = {5, -1, vocab, 17, INT_MAX, -7, vocab - 1, INT_MIN, 0};
  const std::vector<float> out = gather_on_gpu(table_dev, vocab, hidden, ids);
  ASSERT_EQ(testing::count_nan(out), 0u);
  for (size_t t = 0; t < ids.size(); ++t) {
    const bool valid = ids[t] >= 0 && ids[t] < vocab;
    for (int h = 0; h < hidden; ++h) {
      const float expected = valid ? table[static_cast<size_t>(ids[t]) * hidden + h] : 0.0f;
      ASSERT_EQ(out[t * hidden + h], expected) << "token " << t << " (id " << ids[t] << ") element " << h;
    }
  }
}

}  // namespace
}  // namespace deepfuse
