// The paged KV cache on the device: one allocation holding every layer's key and value pools
// (layout: include/deepfuse/kernels/paged_kv.hpp) and the device block table. Which page holds
// which positions is the step scheduler's (src/batching: each running sequence's pages, its row);
// the block table mirrors it with small stream-ordered copies, against a host copy of what the
// device holds:
//   - a row's pages change (admission, growth): only the entries that differ are copied up (from
//     pinned staging);
//   - a sequence moves from the last row into a hole: its row is copied device-to-device.
// Whole tables are never uploaded per step. The pools are zeroed once, so pages that were never
// written (benchmark contexts) hold finite values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <vector>

#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "runtime/pinned_buffer.hpp"

namespace deepfuse::runtime {

struct KvGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;

  // Elements of one layer's key (or value) pool of `pages` pages.
  size_t pool_elements(int pages) const;
  // Bytes one page costs across all layers, keys and values.
  size_t page_bytes() const;
};

class KvCache {
 public:
  KvCache(const KvGeometry& geometry, int pages, int max_rows, int max_pages_per_row, cudaStream_t stream);

  // Layer `layer`'s pools and the shared block table, as the kernels take them.
  kernels::PagedKv layer(int layer) const;

  int pages() const { return pages_; }
  size_t pool_bytes() const { return pool_.bytes(); }
  int max_pages_per_row() const { return max_pages_per_row_; }

  // Makes block-table row `row` list `pages` (page ids in position order) on the device: a
  // sequence newly on the row.
  void set_row(int row, std::span<const int32_t> pages) { upload(row, pages, 0); }
  // The row's sequence grew: only its new pages (past those the row lists) are copied up.
  void grow_row(int row, std::span<const int32_t> pages);
  // Row `to` takes row `from`'s entries (a sequence moved rows).
  void move_row(int from, int to);
  // Tests: every element of the pools set to the 16-bit pattern `bits` (a NaN, so a read of a
  // position no step wrote shows up). Synchronous.
  void fill_pools(uint16_t bits);

 private:
  void check_row(int row) const;
  // Entries [first, pages.size()) of the row copied up; the row then lists `pages`.
  void upload(int row, std::span<const int32_t> pages, int first);

  KvGeometry geometry_;
  int pages_;
  int max_rows_;
  int max_pages_per_row_;
  cudaStream_t stream_;
  DeviceBuffer pool_;              // [layer][K, V][pages][kv_heads][kKvPageSize][head_dim] bf16
  DeviceBuffer block_table_;       // int32 [max_rows, max_pages_per_row]
  std::vector<int32_t> entries_;   // what block_table_ holds (or will, once the copies run)
  std::vector<int> row_pages_;     // per row: entries of it that are meaningful
  PinnedBuffer staging_;           // int32 [max_rows, max_pages_per_row]: source of entry uploads
  CopyEvent staging_read_;         // recorded after the last upload from staging_
  // Per row: the upload count when it last wrote its staging region. A row's region is its own, so
  // only a row written again since the last wait can still be the source of a pending copy.
  std::vector<uint64_t> row_staged_;
  uint64_t uploads_ = 0;        // uploads recorded so far
  uint64_t uploads_waited_ = 0; // uploads known to have run (staging_read_ waited on)
};

}  // namespace deepfuse::runtime
