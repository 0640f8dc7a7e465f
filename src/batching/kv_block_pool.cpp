#include "batching/kv_block_pool.hpp"

#include <algorithm>
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/paged_kv.hpp"

namespace deepfuse::batching {

KvBlockPool::KvBlockPool(int total_pages, bool prefix_caching)
    : total_pages_(total_pages), prefix_caching_(prefix_caching), pages_(total_pages) {
  DF_CHECK(total_pages >= 1, "KV cache needs at least one page (got " + std::to_string(total_pages) + ")");
  // Descending, so a fresh pool hands out page 0 first (as the engine's page table does).
  for (PageId page = total_pages - 1; page >= 0; --page) free_list_.push_back(page);
}

int KvBlockPool::block_tokens() { return kernels::kKvPageSize; }

int KvBlockPool::pages_for(int tokens) { return (tokens + block_tokens() - 1) / block_tokens(); }

BlockHash KvBlockPool::block_hash(BlockHash parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent hash and the ids: cheap, and hits are verified against the tokens.
  BlockHash h = kRootHash;
  auto mix = [&h](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (value >> (8 * byte)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent);
  for (const int32_t id : tokens) mix(static_cast<uint32_t>(id));
  return h;
}

void KvBlockPool::take_reference(PageId page) {
  Page& p = pages_[page];
  if (p.references == 0) {
    if (p.hash) lru_.erase(p.lru_position);
    ++used_;
  }
  ++p.references;
}

void KvBlockPool::forget_block(PageId page) {
  Page& p = pages_[page];
  if (!p.hash) return;
  by_hash_.erase(*p.hash);
  p.hash.reset();
  p.tokens.clear();
}

std::optional<PageId> KvBlockPool::allocate() {
  PageId page;
  if (!free_list_.empty()) {
    page = free_list_.back();
    free_list_.pop_back();
  } else if (!lru_.empty()) {
    page = lru_.front();
    lru_.pop_front();
    forget_block(page);
  } else {
    return std::nullopt;
  }
  pages_[page].references = 1;
  ++used_;
  return page;
}

void KvBlockPool::release(PageId page) {
  Page& p = pages_.at(page);
  DF_CHECK(p.references > 0, "internal: KV page " + std::to_string(page) + " released more often than taken");
  if (--p.references > 0) return;
  --used_;
  if (p.hash) {
    p.lru_position = lru_.insert(lru_.end(), page);
  } else {
    free_list_.push_back(page);
  }
}

std::vector<PageId> KvBlockPool::match_prefix(std::span<const int32_t> tokens, int max_blocks,
                                              std::vector<BlockHash>& hashes) {
  std::vector<PageId> matched;
  hashes.clear();
  if (!prefix_caching_) return matched;
  const int block = block_tokens();
  const int blocks = std::min<int>(max_blocks, static_cast<int>(tokens.size()) / block);
  BlockHash parent = kRootHash;
  for (int b = 0; b < blocks; ++b) {
    const std::span<const int32_t> ids = tokens.subspan(static_cast<size_t>(b) * block, block);
    const BlockHash hash = block_hash(parent, ids);
    const auto it = by_hash_.find(hash);
    if (it == by_hash_.end() || !std::equal(ids.begin(), ids.end(), pages_[it->second].tokens.begin(),
                                            pages_[it->second].tokens.end()))
      break;
    take_reference(it->second);
    matched.push_back(it->second);
    hashes.push_back(hash);
    parent = hash;
  }
  return matched;
}

bool KvBlockPool::register_block(PageId page, BlockHash hash, std::span<const int32_t> tokens) {
  if (!prefix_caching_ || by_hash_.count(hash) != 0) return false;
  Page& p = pages_.at(page);
  DF_CHECK(p.references > 0 && !p.hash, "internal: only a referenced, uncached KV page can be registered");
  p.hash = hash;
  p.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, page);
  return true;
}

}  // namespace deepfuse::batching
