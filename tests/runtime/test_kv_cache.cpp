// The KV cache's host bookkeeping (runtime::KvPageTable): page allocation as sequences grow,
// exhaustion without partial allocation, compaction of block-table rows on removal, freeing.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "runtime/kv_page_table.hpp"

namespace deepfuse::runtime {
namespace {

constexpr int kPage = kernels::kKvPageSize;

std::vector<int32_t> pages_of(const KvPageTable& table, int row) {
  const auto pages = table.row_pages(row);
  return {pages.begin(), pages.end()};
}

// Every page is either free or owned by exactly one row.
void expect_pages_accounted_for(const KvPageTable& table) {
  std::multiset<int32_t> owned;
  for (int row = 0; row < table.rows(); ++row)
    for (int32_t page : table.row_pages(row)) {
      EXPECT_GE(page, 0);
      EXPECT_LT(page, table.total_pages());
      owned.insert(page);
    }
  EXPECT_EQ(static_cast<int>(owned.size()) + table.free_pages(), table.total_pages());
  EXPECT_EQ(std::set<int32_t>(owned.begin(), owned.end()).size(), owned.size()) << "a page owned twice";
}

TEST(KvPageTable, PagesForRoundsUpToWholePages) {
  EXPECT_EQ(KvPageTable::pages_for(0), 0);
  EXPECT_EQ(KvPageTable::pages_for(1), 1);
  EXPECT_EQ(KvPageTable::pages_for(kPage), 1);
  EXPECT_EQ(KvPageTable::pages_for(kPage + 1), 2);
  EXPECT_EQ(KvPageTable::pages_for(5 * kPage - 1), 5);
}

TEST(KvPageTable, GrowsAcrossPageBoundariesOnePageAtATime) {
  KvPageTable table(10, 4, 8);
  const int row = table.add_row();
  EXPECT_EQ(row, 0);
  EXPECT_EQ(table.pages_in_row(row), 0);
  ASSERT_TRUE(table.reserve(row, 1));
  EXPECT_EQ(table.pages_in_row(row), 1);
  ASSERT_TRUE(table.reserve(row, kPage));  // still the first page
  EXPECT_EQ(table.pages_in_row(row), 1);
  ASSERT_TRUE(table.reserve(row, kPage + 1));  // crosses into the second
  EXPECT_EQ(table.pages_in_row(row), 2);
  ASSERT_TRUE(table.reserve(row, 3));  // shrinking requests change nothing
  EXPECT_EQ(table.pages_in_row(row), 2);
  EXPECT_EQ(pages_of(table, row), (std::vector<int32_t>{0, 1}));  // a fresh cache hands out 0, 1, ...
  EXPECT_EQ(table.free_pages(), 8);
  expect_pages_accounted_for(table);
}

TEST(KvPageTable, ExhaustionAllocatesNothing) {
  KvPageTable table(5, 3, 8);
  const int a = table.add_row(), b = table.add_row();
  ASSERT_TRUE(table.reserve(a, 3 * kPage));
  EXPECT_FALSE(table.reserve(b, 3 * kPage));  // needs 3, 2 are free
  EXPECT_EQ(table.pages_in_row(b), 0);
  EXPECT_EQ(table.free_pages(), 2);
  ASSERT_TRUE(table.reserve(b, 2 * kPage));
  EXPECT_EQ(table.free_pages(), 0);
  EXPECT_FALSE(table.reserve(a, 3 * kPage + 1));
  EXPECT_EQ(table.pages_in_row(a), 3);
  EXPECT_TRUE(table.reserve(a, 3 * kPage));  // already held: no page needed
  expect_pages_accounted_for(table);
}

TEST(KvPageTable, RemovingARowMovesTheLastRowIntoItsPlace) {
  KvPageTable table(20, 4, 6);
  for (int i = 0; i < 4; ++i) {
    const int row = table.add_row();
    ASSERT_TRUE(table.reserve(row, (i + 1) * kPage));  // row i holds i + 1 pages
  }
  const std::vector<int32_t> last = pages_of(table, 3);
  EXPECT_EQ(table.remove_row(1), 3);  // the 4-page row moves into row 1
  EXPECT_EQ(table.rows(), 3);
  EXPECT_EQ(pages_of(table, 1), last);
  EXPECT_EQ(table.free_pages(), 20 - (1 + 3 + 4));
  expect_pages_accounted_for(table);

  EXPECT_EQ(table.remove_row(2), -1);  // the last row: nothing moves
  EXPECT_EQ(table.rows(), 2);
  EXPECT_EQ(pages_of(table, 1), last);
  expect_pages_accounted_for(table);

  // A freed row can be reused and grows from its own empty state.
  const int again = table.add_row();
  EXPECT_EQ(again, 2);
  EXPECT_EQ(table.pages_in_row(again), 0);
  ASSERT_TRUE(table.reserve(again, 2 * kPage + 3));
  EXPECT_EQ(table.pages_in_row(again), 3);
  expect_pages_accounted_for(table);
}

TEST(KvPageTable, FreedPagesAreReused) {
  KvPageTable table(4, 2, 4);
  const int a = table.add_row();
  ASSERT_TRUE(table.reserve(a, 4 * kPage));
  const std::vector<int32_t> held = pages_of(table, a);
  table.remove_row(a);
  EXPECT_EQ(table.rows(), 0);
  EXPECT_EQ(table.free_pages(), 4);
  const int b = table.add_row();
  ASSERT_TRUE(table.reserve(b, 4 * kPage));
  std::vector<int32_t> reused = pages_of(table, b);
  std::sort(reused.begin(), reused.end());
  EXPECT_EQ(reused, (std::vector<int32_t>{0, 1, 2, 3}));
  expect_pages_accounted_for(table);
}

// Many random operations: the invariants hold throughout.
TEST(KvPageTable, RandomWorkloadKeepsEveryPageAccountedFor) {
  KvPageTable table(37, 5, 9);
  std::vector<int> tokens;  // per row
  unsigned state = 12345;
  auto next = [&state](unsigned bound) {
    state = state * 1103515245u + 12345u;
    return (state >> 8) % bound;
  };
  for (int i = 0; i < 2000; ++i) {
    const unsigned action = next(10);
    if (action < 2 && table.rows() < table.max_rows()) {
      table.add_row();
      tokens.push_back(0);
    } else if (action < 3 && table.rows() > 0) {
      const int row = static_cast<int>(next(table.rows()));
      const int moved = table.remove_row(row);
      if (moved >= 0) tokens[row] = tokens[moved];
      tokens.pop_back();
    } else if (table.rows() > 0) {
      const int row = static_cast<int>(next(table.rows()));
      const int want = std::min(tokens[row] + static_cast<int>(next(40)), 9 * kPage);
      const int free_before = table.free_pages();
      const int needed = KvPageTable::pages_for(want) - table.pages_in_row(row);
      const bool ok = table.reserve(row, want);
      EXPECT_EQ(ok, needed <= free_before) << "step " << i;
      if (ok) tokens[row] = std::max(tokens[row], want);
      else EXPECT_EQ(table.free_pages(), free_before) << "step " << i;
    }
    for (int row = 0; row < table.rows(); ++row)
      ASSERT_EQ(table.pages_in_row(row), KvPageTable::pages_for(tokens[row])) << "step " << i << " row " << row;
    expect_pages_accounted_for(table);
  }
}

TEST(KvPageTable, RejectsBadUse) {
  EXPECT_THROW(KvPageTable(0, 1, 1), Error);
  KvPageTable table(8, 1, 2);
  EXPECT_THROW(table.reserve(0, 1), Error);  // no row yet
  const int row = table.add_row();
  EXPECT_THROW(table.add_row(), Error);  // max_rows reached
  EXPECT_THROW(table.reserve(row, 2 * kPage + 1), Error);  // beyond max_pages_per_row
  EXPECT_THROW(table.remove_row(1), Error);
}

}  // namespace
}  // namespace deepfuse::runtime

namespace deepfuse::runtime {
namespace {

// Prefix caching in the page table: a row adopts the pages of full blocks another row registered,
// never beyond max_blocks; the pages stay cached (and count as free) once no row holds them.
TEST(KvPageTable, RowsShareRegisteredPromptBlocks) {
  KvPageTable table(8, 3, 8, /*prefix_caching=*/true);
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 100 + i;
  const int first = table.add_row();
  EXPECT_EQ(table.adopt_prefix(first, prompt, 2), 0);
  ASSERT_TRUE(table.reserve(first, 40));
  table.register_prompt_blocks(first, prompt, 40);
  const int second = table.add_row();
  EXPECT_EQ(table.adopt_prefix(second, prompt, (40 - 1) / kernels::kKvPageSize), 32);
  EXPECT_EQ(table.row_pages(second)[0], table.row_pages(first)[0]);
  EXPECT_EQ(table.row_pages(second)[1], table.row_pages(first)[1]);
  ASSERT_TRUE(table.reserve(second, 40));
  EXPECT_NE(table.row_pages(second)[2], table.row_pages(first)[2]);  // the partial block is private
  EXPECT_EQ(table.free_pages(), 8 - 4);
  table.remove_row(second);
  table.remove_row(first);
  EXPECT_EQ(table.free_pages(), 8);
  EXPECT_EQ(table.pool().cached_pages(), 2);
  const int third = table.add_row();
  EXPECT_EQ(table.adopt_prefix(third, prompt, 1), 16);  // capped by max_blocks
}

TEST(KvPageTable, WithoutPrefixCachingNothingIsAdopted) {
  KvPageTable table(8, 2, 8);
  std::vector<int32_t> prompt(32, 7);
  const int row = table.add_row();
  ASSERT_TRUE(table.reserve(row, 32));
  table.register_prompt_blocks(row, prompt, 32);
  const int other = table.add_row();
  EXPECT_EQ(table.adopt_prefix(other, prompt, 2), 0);
}

}  // namespace
}  // namespace deepfuse::runtime

namespace deepfuse::runtime {
namespace {

// A long prompt registered chunk by chunk (the engine's prefill budget) is adopted whole by the next.
TEST(KvPageTable, BlocksRegisteredChunkByChunkAreAdoptedWhole) {
  KvPageTable table(1024, 2, 512, /*prefix_caching=*/true);
  std::vector<int32_t> prompt(6656);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1000 + (i * 7919) % 29000);
  const int row = table.add_row();
  ASSERT_TRUE(table.reserve(row, 6656));
  for (int done = 512; done <= 6656; done += 512) table.register_prompt_blocks(row, prompt, done);
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + 6144);
  for (int i = 0; i < 512; ++i) other.push_back(5);
  const int second = table.add_row();
  EXPECT_EQ(table.adopt_prefix(second, other, (6656 - 1) / kPage), 6144);
}

}  // namespace
}  // namespace deepfuse::runtime
