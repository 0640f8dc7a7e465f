#include "runtime/kv_page_table.hpp"

#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"

namespace deepfuse::runtime {

KvPageTable::KvPageTable(int total_pages, int max_rows, int max_pages_per_row, bool prefix_caching)
    : total_pages_(total_pages),
      max_rows_(max_rows),
      max_pages_per_row_(max_pages_per_row),
      pool_(total_pages, prefix_caching) {  // checks total_pages >= 1
  DF_CHECK(max_rows >= 1 && max_pages_per_row >= 1, "KV page table needs at least one row and one page per row");
  entries_.assign(static_cast<size_t>(max_rows) * max_pages_per_row, -1);
}

int KvPageTable::pages_for(int tokens) { return (tokens + kernels::kKvPageSize - 1) / kernels::kKvPageSize; }

void KvPageTable::check_row(int row) const {
  DF_CHECK(row >= 0 && row < rows(), "KV page table row " + std::to_string(row) + " is not in use (rows in use: " +
                                         std::to_string(rows()) + ")");
}

int KvPageTable::add_row() {
  DF_CHECK(rows() < max_rows_, "KV page table: all " + std::to_string(max_rows_) + " rows are in use");
  pages_per_row_.push_back(0);
  block_hashes_.emplace_back();
  return rows() - 1;
}

bool KvPageTable::reserve(int row, int tokens) {
  check_row(row);
  const int needed = pages_for(tokens);
  DF_CHECK(needed <= max_pages_per_row_, "KV page table: " + std::to_string(tokens) + " positions need " +
                                             std::to_string(needed) + " pages, a row holds at most " +
                                             std::to_string(max_pages_per_row_));
  int& have = pages_per_row_[row];
  if (needed <= have) return true;
  if (needed - have > free_pages()) return false;
  int32_t* row_entries = entries_.data() + static_cast<size_t>(row) * max_pages_per_row_;
  for (; have < needed; ++have) row_entries[have] = *pool_.allocate();
  return true;
}

int KvPageTable::adopt_prefix(int row, std::span<const int32_t> tokens, int max_blocks) {
  check_row(row);
  DF_CHECK(pages_per_row_[row] == 0, "internal: a prefix is adopted only by an empty row");
  std::vector<BlockHash> hashes;
  const std::vector<PageId> pages =
      pool_.match_prefix(tokens, std::min(max_blocks, max_pages_per_row_), hashes);
  std::copy(pages.begin(), pages.end(), entries_.begin() + static_cast<size_t>(row) * max_pages_per_row_);
  pages_per_row_[row] = static_cast<int>(pages.size());
  block_hashes_[row] = std::move(hashes);
  return static_cast<int>(pages.size()) * kernels::kKvPageSize;
}

void KvPageTable::register_prompt_blocks(int row, std::span<const int32_t> tokens, int computed) {
  check_row(row);
  if (!pool_.prefix_caching()) return;
  std::vector<BlockHash>& hashes = block_hashes_[row];
  const int32_t* row_entries = entries_.data() + static_cast<size_t>(row) * max_pages_per_row_;
  const int block = kernels::kKvPageSize;
  const int full = std::min({computed, static_cast<int>(tokens.size()), pages_per_row_[row] * block}) / block;
  for (int b = static_cast<int>(hashes.size()); b < full; ++b) {
    const std::span<const int32_t> ids = tokens.subspan(static_cast<size_t>(b) * block, block);
    hashes.push_back(KvBlockPool::block_hash(b == 0 ? KvBlockPool::kRootHash : hashes[b - 1], ids));
    pool_.register_block(row_entries[b], hashes.back(), ids);
  }
}

int KvPageTable::pages_in_row(int row) const {
  check_row(row);
  return pages_per_row_[row];
}

std::span<const int32_t> KvPageTable::row_pages(int row) const {
  check_row(row);
  return {entries_.data() + static_cast<size_t>(row) * max_pages_per_row_, static_cast<size_t>(pages_per_row_[row])};
}

int KvPageTable::remove_row(int row) {
  check_row(row);
  int32_t* row_entries = entries_.data() + static_cast<size_t>(row) * max_pages_per_row_;
  for (int i = 0; i < pages_per_row_[row]; ++i) pool_.release(row_entries[i]);
  const int last = rows() - 1;
  int moved_from = -1;
  if (row != last) {
    const int32_t* last_entries = entries_.data() + static_cast<size_t>(last) * max_pages_per_row_;
    for (int i = 0; i < pages_per_row_[last]; ++i) row_entries[i] = last_entries[i];
    pages_per_row_[row] = pages_per_row_[last];
    block_hashes_[row] = std::move(block_hashes_[last]);
    moved_from = last;
  }
  pages_per_row_.pop_back();
  block_hashes_.pop_back();
  return moved_from;
}

}  // namespace deepfuse::runtime
