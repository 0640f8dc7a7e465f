#include "runtime/kv_cache.hpp"

#include <cstring>

#include "deepfuse/error.hpp"

namespace deepfuse::runtime {

size_t KvGeometry::pool_elements(int pages) const {
  return static_cast<size_t>(pages) * kv_heads * kernels::kKvPageSize * head_dim;
}

size_t KvGeometry::page_bytes() const {
  return size_t{2} * layers * pool_elements(1) * sizeof(__nv_bfloat16);
}

KvCache::KvCache(const KvGeometry& geometry, int pages, int max_rows, int max_pages_per_row, cudaStream_t stream,
                 bool prefix_caching)
    : geometry_(geometry),
      pages_(pages),
      stream_(stream),
      pool_(static_cast<size_t>(pages) * geometry.page_bytes()),
      block_table_(static_cast<size_t>(max_rows) * max_pages_per_row * sizeof(int32_t)),
      table_(pages, max_rows, max_pages_per_row, prefix_caching),
      staging_(block_table_.bytes()) {
  pool_.zero(stream_);
  // Entries past a row's pages are never read (lengths bound every kernel), but -1 everywhere
  // makes a stray read an obvious out-of-range page rather than a plausible one.
  DF_CHECK_CUDA(cudaMemsetAsync(block_table_.data(), 0xff, block_table_.bytes(), stream_));
}

kernels::PagedKv KvCache::layer(int layer) const {
  DF_CHECK(layer >= 0 && layer < geometry_.layers, "KV cache has no layer " + std::to_string(layer));
  const size_t pool = geometry_.pool_elements(pages_);
  kernels::PagedKv kv;
  kv.k_pages = pool_.as<__nv_bfloat16>() + (2 * static_cast<size_t>(layer)) * pool;
  kv.v_pages = pool_.as<__nv_bfloat16>() + (2 * static_cast<size_t>(layer) + 1) * pool;
  kv.block_table = block_table_.as<int32_t>();
  kv.max_pages_per_seq = table_.max_pages_per_row();
  kv.kv_heads = geometry_.kv_heads;
  kv.head_dim = geometry_.head_dim;
  return kv;
}

bool KvCache::reserve(int row, int tokens) {
  const int before = table_.pages_in_row(row);
  if (!table_.reserve(row, tokens)) return false;
  upload_entries(row, before, table_.pages_in_row(row) - before);
  return true;
}

int KvCache::adopt_prefix(int row, std::span<const int32_t> tokens, int max_blocks) {
  const int positions = table_.adopt_prefix(row, tokens, max_blocks);
  upload_entries(row, 0, table_.pages_in_row(row));
  return positions;
}

void KvCache::upload_entries(int row, int first_page, int pages) {
  if (pages <= 0) return;
  // The staging bytes of these entries may still be the source of an earlier, not yet executed
  // copy (a row freed and refilled within one step): wait for the last upload before rewriting.
  staging_read_.wait();
  const size_t first = static_cast<size_t>(row) * table_.max_pages_per_row() + first_page;
  const size_t count = static_cast<size_t>(pages);
  std::memcpy(staging_.as<int32_t>() + first, table_.entries().data() + first, count * sizeof(int32_t));
  DF_CHECK_CUDA(cudaMemcpyAsync(block_table_.as<int32_t>() + first, staging_.as<int32_t>() + first,
                                count * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  staging_read_.record(stream_);
}

int KvCache::remove_row(int row) {
  const int moved_from = table_.remove_row(row);
  if (moved_from >= 0 && table_.pages_in_row(row) > 0) {
    const size_t stride = table_.max_pages_per_row();
    DF_CHECK_CUDA(cudaMemcpyAsync(block_table_.as<int32_t>() + row * stride, block_table_.as<int32_t>() + moved_from * stride,
                                  table_.pages_in_row(row) * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream_));
  }
  return moved_from;
}

}  // namespace deepfuse::runtime
