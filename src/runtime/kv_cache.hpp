// The paged KV cache on the device: one allocation holding every layer's key and value pools
// (layout: include/deepfuse/kernels/paged_kv.hpp), the device block table, and the host
// KvPageTable whose changes it mirrors to the device with small stream-ordered copies:
//   - a row gains pages: only the new entries are copied up (from pinned staging);
//   - a row is removed: the last row is moved into the hole device-to-device.
// Whole tables are never uploaded per step. The pools are zeroed once, so pages that were never
// written (benchmark contexts) hold finite values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "runtime/kv_page_table.hpp"
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
  KvCache(const KvGeometry& geometry, int pages, int max_rows, int max_pages_per_row, cudaStream_t stream,
          bool prefix_caching = false);

  // Layer `layer`'s pools and the shared block table, as the kernels take them.
  kernels::PagedKv layer(int layer) const;

  const KvPageTable& table() const { return table_; }
  size_t pool_bytes() const { return pool_.bytes(); }

  int add_row() { return table_.add_row(); }
  // KvPageTable::reserve, with the row's new entries copied to the device block table.
  bool reserve(int row, int tokens);
  // KvPageTable::remove_row, with the moved row copied device-to-device; returns where it came from.
  int remove_row(int row);
  // KvPageTable::adopt_prefix, with the adopted entries copied to the device block table.
  int adopt_prefix(int row, std::span<const int32_t> tokens, int max_blocks);
  void register_prompt_blocks(int row, std::span<const int32_t> tokens, int computed) {
    table_.register_prompt_blocks(row, tokens, computed);
  }

 private:
  // Copies entries [first, first + count) of `row` up to the device block table.
  void upload_entries(int row, int first, int count);

  KvGeometry geometry_;
  int pages_;
  cudaStream_t stream_;
  DeviceBuffer pool_;              // [layer][K, V][pages][kv_heads][kKvPageSize][head_dim] bf16
  DeviceBuffer block_table_;       // int32 [max_rows, max_pages_per_row]
  KvPageTable table_;
  PinnedBuffer staging_;           // int32 [max_rows, max_pages_per_row]: source of entry uploads
  CopyEvent staging_read_;         // recorded after the last upload from staging_
};

}  // namespace deepfuse::runtime
