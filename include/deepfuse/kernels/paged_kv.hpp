// The paged KV cache layout every kernel that touches the cache agrees on.
//
// Per layer, keys and values live in two pools of fixed-size pages:
//   k_pages, v_pages: [num_pages][kv_heads][kKvPageSize][head_dim] bf16
// so one (page, kv head) is kKvPageSize * head_dim contiguous bf16 (4 KB at head_dim 128): the
// unit a decode-attention block streams. A sequence's position p lives in page
//   block_table[seq * max_pages_per_seq + p / kKvPageSize], row p % kKvPageSize.
// The runtime (src/runtime/kv_cache) owns the pools and the block table; kernels only index.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

inline constexpr int kKvPageSize = 16;  // tokens per page

struct PagedKv {
  __nv_bfloat16* k_pages = nullptr;     // one layer's key pool
  __nv_bfloat16* v_pages = nullptr;     // one layer's value pool
  const int32_t* block_table = nullptr; // [sequences, max_pages_per_seq] page ids (device)
  int max_pages_per_seq = 0;
  int kv_heads = 0;
  int head_dim = 0;

  // Element offset of (page, kv_head, row 0, dim 0) within a pool.
  __host__ __device__ size_t page_offset(int32_t page, int kv_head) const {
    return (static_cast<size_t>(page) * kv_heads + kv_head) * kKvPageSize * head_dim;
  }
  // Element offset of (sequence, position, kv_head, dim 0) within a pool.
  __host__ __device__ size_t token_offset(int sequence, int position, int kv_head) const {
    const int32_t page = block_table[static_cast<size_t>(sequence) * max_pages_per_seq + position / kKvPageSize];
    return page_offset(page, kv_head) + static_cast<size_t>(position % kKvPageSize) * head_dim;
  }
};

}  // namespace deepfuse::kernels
