// The verify step's acceptance kernel against the host rule (speculative::accept_drafts) on fresh
// random cases: 1 to 16 rows, every draft count from 0 to rows - 1, chosen tokens agreeing with
// the drafts for a random prefix (none, some, all), hundreds of sequences over several blocks.
// Outputs are poisoned first: every emitted slot, count and next id must be written, and slots
// past the emitted tokens must read -1.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/speculative_accept.hpp"
#include "speculative/verify.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

constexpr int32_t kPoison = -777;

struct Case {
  int sequences, rows;
  std::vector<int32_t> chosen, drafts, counts;
};

Case random_case(std::mt19937_64& rng, int sequences, int rows) {
  Case c{sequences, rows, {}, {}, {}};
  std::uniform_int_distribution<int32_t> token(0, 5);  // a small vocabulary: chance agreements too
  for (int s = 0; s < sequences; ++s) {
    const int count = std::uniform_int_distribution<int>(0, rows - 1)(rng);
    const int agree = std::uniform_int_distribution<int>(0, count)(rng);  // drafts the chosen tokens repeat
    std::vector<int32_t> drafts(rows - 1), chosen(rows);
    for (int32_t& d : drafts) d = token(rng);
    for (int r = 0; r < rows; ++r) chosen[r] = r < agree ? drafts[r] : token(rng) + (r < count ? 100 : 0);
    if (count > 0 && s % 3 == 0) chosen[count - 1] = drafts[count - 1];  // agreement up to the last draft
    c.counts.push_back(s % 7 == 6 ? rows + 3 : count);  // an out-of-range count is clamped
    c.chosen.insert(c.chosen.end(), chosen.begin(), chosen.end());
    c.drafts.insert(c.drafts.end(), drafts.begin(), drafts.end());
  }
  return c;
}

TEST(SpeculativeAccept, MatchesTheHostRuleAndWritesEveryOutput) {
  DF_REQUIRE_GPU();
  auto rng = testing::make_rng(5450);
  for (const int rows : {1, 2, 5, 9, kernels::kSpeculativeMaxRows}) {
    const Case c = random_case(rng, 300, rows);
    DeviceBuffer chosen = DeviceBuffer::from_host(c.chosen), drafts = DeviceBuffer::from_host(c.drafts),
                 counts = DeviceBuffer::from_host(c.counts);
    DeviceBuffer emitted = DeviceBuffer::from_host(std::vector<int32_t>(c.chosen.size(), kPoison));
    DeviceBuffer emitted_counts = DeviceBuffer::from_host(std::vector<int32_t>(c.sequences, kPoison));
    DeviceBuffer next_ids = DeviceBuffer::from_host(std::vector<int32_t>(c.sequences, kPoison));
    kernels::SpeculativeAcceptParams p;
    p.chosen = chosen.as<const int32_t>();
    p.drafts = drafts.as<const int32_t>();
    p.draft_counts = counts.as<const int32_t>();
    p.sequences = c.sequences;
    p.rows = rows;
    p.emitted = emitted.as<int32_t>();
    p.emitted_counts = emitted_counts.as<int32_t>();
    p.next_ids = next_ids.as<int32_t>();
    DF_CHECK_CUDA(kernels::launch_speculative_accept(p, nullptr));
    DF_CHECK_CUDA(cudaDeviceSynchronize());
    const auto got = emitted.to_host<int32_t>(c.chosen.size());
    const auto got_counts = emitted_counts.to_host<int32_t>(c.sequences);
    const auto got_next = next_ids.to_host<int32_t>(c.sequences);
    for (int s = 0; s < c.sequences; ++s) {
      const int count = std::min(c.counts[s], rows - 1);
      const std::span<const int32_t> fed(c.drafts.data() + static_cast<size_t>(s) * (rows - 1), count);
      const std::vector<int32_t> want = speculative::accept_drafts(fed, [&](int row) { return c.chosen[s * rows + row]; });
      const std::string where = std::to_string(rows) + " rows, sequence " + std::to_string(s);
      ASSERT_EQ(got_counts[s], static_cast<int>(want.size())) << where;
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(got[s * rows + r], r < static_cast<int>(want.size()) ? want[r] : -1) << where << ", row " << r;
      EXPECT_EQ(got_next[s], want.back()) << where;
    }
  }
}

}  // namespace
}  // namespace deepfuse
