#include "runtime/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "deepfuse/error.hpp"

namespace deepfuse::runtime {

size_t KvGeometry::pool_elements(int pages) const {
  return static_cast<size_t>(pages) * kv_heads * kernels::kKvPageSize * head_dim;
}

size_t KvGeometry::page_bytes() const {
  return size_t{2} * layers * pool_elements(1) * sizeof(__nv_bfloat16);
}

KvCache::KvCache(const KvGeometry& geometry, int pages, int max_rows, int max_pages_per_row, cudaStream_t stream)
    : geometry_(geometry),
      pages_(pages),
      max_rows_(max_rows),
      max_pages_per_row_(max_pages_per_row),
      stream_(stream),
      pool_(static_cast<size_t>(pages) * geometry.page_bytes()),
      block_table_(static_cast<size_t>(max_rows) * max_pages_per_row * sizeof(int32_t)),
      entries_(static_cast<size_t>(max_rows) * max_pages_per_row, -1),
      row_pages_(max_rows, 0),
      staging_(block_table_.bytes()),
      row_staged_(max_rows, 0) {
  DF_CHECK(pages >= 1 && max_rows >= 1 && max_pages_per_row >= 1,
           "KV cache needs at least one page, one row and one page per row");
  pool_.zero(stream_);
  // Entries past a row's pages are never read (lengths bound every kernel), but -1 everywhere
  // makes a stray read an obvious out-of-range page rather than a plausible one.
  DF_CHECK_CUDA(cudaMemsetAsync(block_table_.data(), 0xff, block_table_.bytes(), stream_));
}

void KvCache::fill_pools(uint16_t bits) {
  DF_CHECK_CUDA(cudaStreamSynchronize(stream_));
  const std::vector<uint16_t> host(pool_.bytes() / sizeof(uint16_t), bits);
  pool_.upload(host.data(), pool_.bytes());
}

kernels::PagedKv KvCache::layer(int layer) const {
  DF_CHECK(layer >= 0 && layer < geometry_.layers, "KV cache has no layer " + std::to_string(layer));
  const size_t pool = geometry_.pool_elements(pages_);
  kernels::PagedKv kv;
  kv.k_pages = pool_.as<__nv_bfloat16>() + (2 * static_cast<size_t>(layer)) * pool;
  kv.v_pages = pool_.as<__nv_bfloat16>() + (2 * static_cast<size_t>(layer) + 1) * pool;
  kv.block_table = block_table_.as<int32_t>();
  kv.max_pages_per_seq = max_pages_per_row_;
  kv.kv_heads = geometry_.kv_heads;
  kv.head_dim = geometry_.head_dim;
  return kv;
}

void KvCache::check_row(int row) const {
  DF_CHECK(row >= 0 && row < max_rows_, "internal: KV cache has no block-table row " + std::to_string(row));
}

void KvCache::grow_row(int row, std::span<const int32_t> pages) {
  check_row(row);
  DF_CHECK(static_cast<int>(pages.size()) >= row_pages_[row], "internal: a KV block-table row only grows");
  upload(row, pages, row_pages_[row]);
}

void KvCache::upload(int row, std::span<const int32_t> pages, int first) {
  check_row(row);
  DF_CHECK(static_cast<int>(pages.size()) <= max_pages_per_row_,
           "internal: " + std::to_string(pages.size()) + " KV pages for one sequence, a row holds at most " +
               std::to_string(max_pages_per_row_));
  row_pages_[row] = static_cast<int>(pages.size());
  const int count = static_cast<int>(pages.size()) - first;
  if (count <= 0) return;
  int32_t* mirror = entries_.data() + static_cast<size_t>(row) * max_pages_per_row_;
  std::copy(pages.begin() + first, pages.end(), mirror + first);
  // This row's staging bytes may still be the source of an earlier, not yet executed copy (a row
  // freed and refilled within one step): then wait for the uploads before rewriting them. Other
  // rows' regions are disjoint, so a step that grows many rows waits at most once, not once a row
  // behind the step in flight.
  if (row_staged_[row] > uploads_waited_) {
    staging_read_.wait();
    uploads_waited_ = uploads_;
  }
  const size_t offset = static_cast<size_t>(row) * max_pages_per_row_ + first;
  std::memcpy(staging_.as<int32_t>() + offset, mirror + first, count * sizeof(int32_t));
  DF_CHECK_CUDA(cudaMemcpyAsync(block_table_.as<int32_t>() + offset, staging_.as<int32_t>() + offset,
                                count * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  staging_read_.record(stream_);
  row_staged_[row] = ++uploads_;
}

void KvCache::move_row(int from, int to) {
  check_row(from);
  check_row(to);
  const size_t stride = max_pages_per_row_;
  std::copy_n(entries_.begin() + from * stride, row_pages_[from], entries_.begin() + to * stride);
  row_pages_[to] = row_pages_[from];
  if (row_pages_[to] > 0)
    DF_CHECK_CUDA(cudaMemcpyAsync(block_table_.as<int32_t>() + to * stride, block_table_.as<int32_t>() + from * stride,
                                  row_pages_[to] * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace deepfuse::runtime
