#include "runtime/kv_page_table.hpp"

#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"

namespace deepfuse::runtime {

KvPageTable::KvPageTable(int total_pages, int max_rows, int max_pages_per_row)
    : total_pages_(total_pages), max_rows_(max_rows), max_pages_per_row_(max_pages_per_row) {
  DF_CHECK(total_pages >= 1, "KV cache needs at least one page (got " + std::to_string(total_pages) + ")");
  DF_CHECK(max_rows >= 1 && max_pages_per_row >= 1, "KV page table needs at least one row and one page per row");
  entries_.assign(static_cast<size_t>(max_rows) * max_pages_per_row, -1);
  // Pushed in descending order so a fresh cache hands out page 0 first: easy to read in tests.
  free_list_.reserve(total_pages);
  for (int page = total_pages - 1; page >= 0; --page) free_list_.push_back(page);
}

int KvPageTable::pages_for(int tokens) { return (tokens + kernels::kKvPageSize - 1) / kernels::kKvPageSize; }

void KvPageTable::check_row(int row) const {
  DF_CHECK(row >= 0 && row < rows(), "KV page table row " + std::to_string(row) + " is not in use (rows in use: " +
                                         std::to_string(rows()) + ")");
}

int KvPageTable::add_row() {
  DF_CHECK(rows() < max_rows_, "KV page table: all " + std::to_string(max_rows_) + " rows are in use");
  pages_per_row_.push_back(0);
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
  for (; have < needed; ++have) {
    row_entries[have] = free_list_.back();
    free_list_.pop_back();
  }
  return true;
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
  for (int i = 0; i < pages_per_row_[row]; ++i) free_list_.push_back(row_entries[i]);
  const int last = rows() - 1;
  int moved_from = -1;
  if (row != last) {
    const int32_t* last_entries = entries_.data() + static_cast<size_t>(last) * max_pages_per_row_;
    for (int i = 0; i < pages_per_row_[last]; ++i) row_entries[i] = last_entries[i];
    pages_per_row_[row] = pages_per_row_[last];
    moved_from = last;
  }
  pages_per_row_.pop_back();
  return moved_from;
}

}  // namespace deepfuse::runtime
