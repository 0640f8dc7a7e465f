// Host bookkeeping of the paged KV cache: which page holds which positions of which sequence.
//
// The pool has `total_pages` pages of kKvPageSize tokens (include/deepfuse/kernels/paged_kv.hpp). A
// free list hands them out; each running sequence owns one row of the block table, listing its
// pages in position order, and grows by whole pages as its context grows. Rows are kept compact
// (rows 0..rows()-1 are in use) because row i of the block table is entry i of the decode batch:
// removing a row moves the last row into the hole, so a decode step's rows are always a prefix.
//
// Pages come from a KvBlockPool (reference counted). With prefix caching on, a new row can start
// with pages other rows computed (adopt_prefix), and full blocks of prompts are registered so
// later rows can (register_prompt_blocks); a page whose last row is gone then stays cached,
// evictable, instead of going back to the free list. With it off (the default), pages are
// private to their row and freed with it, as before.
//
// Pure host code, no CUDA: the device copy of the table is kept in step by runtime::KvCache, which
// mirrors every change this class reports (new pages of a row, a row moved on removal).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/kv_block_pool.hpp"

namespace deepfuse::runtime {

class KvPageTable {
 public:
  KvPageTable(int total_pages, int max_rows, int max_pages_per_row, bool prefix_caching = false);

  // Pages needed to hold `tokens` positions.
  static int pages_for(int tokens);

  int total_pages() const { return total_pages_; }
  // Pages a reserve() can still take: free ones and unreferenced cached ones.
  int free_pages() const { return pool_.available_pages(); }
  const KvBlockPool& pool() const { return pool_; }
  int rows() const { return static_cast<int>(pages_per_row_.size()); }
  int max_rows() const { return max_rows_; }
  int max_pages_per_row() const { return max_pages_per_row_; }

  // Appends an empty row (index rows() before the call). Throws deepfuse::Error when all
  // max_rows rows are in use.
  int add_row();

  // Grows `row` so it holds positions 0..tokens-1, allocating pages as needed. Returns false and
  // allocates nothing when the free list is short; throws when `tokens` needs more than
  // max_pages_per_row pages.
  bool reserve(int row, int tokens);

  // Prefix caching: an empty `row` takes the pages of the longest cached run of full blocks that
  // `tokens` starts with, at most max_blocks; returns the positions they hold (0 when off).
  int adopt_prefix(int row, std::span<const int32_t> tokens, int max_blocks);
  // Registers the full blocks of `row` within positions [0, computed), whose ids `tokens` gives,
  // for later rows to adopt (blocks registered before are skipped). Nothing when off.
  void register_prompt_blocks(int row, std::span<const int32_t> tokens, int computed);

  int pages_in_row(int row) const;
  // The row's page ids in position order (pages_in_row(row) of them).
  std::span<const int32_t> row_pages(int row) const;
  // The whole table, [max_rows, max_pages_per_row] row-major, entries past a row's pages unspecified.
  std::span<const int32_t> entries() const { return entries_; }

  // Frees the row's pages. When `row` was not the last row, the last row moves into it; returns
  // the index it moved from, or -1 when nothing moved.
  int remove_row(int row);

 private:
  void check_row(int row) const;

  int total_pages_;
  int max_rows_;
  int max_pages_per_row_;
  KvBlockPool pool_;                    // its free list is a stack: the most recently freed page is reused first
  std::vector<int32_t> entries_;        // [max_rows, max_pages_per_row]
  std::vector<int> pages_per_row_;      // one entry per row in use
  std::vector<std::vector<BlockHash>> block_hashes_;  // per row in use: chained hashes of its registered-or-adopted blocks
};

}  // namespace deepfuse::runtime
