// The KV pages the step scheduler hands out, and the prefix cache that lets sequences share them.
//
// A page holds kKvPageSize positions of one sequence (the same 16-token pages the CUDA engine's
// paged cache uses). Pages are reference counted: a sequence holds one reference to each page of
// its block table, and a page that holds a full block of tokens other sequences start with is
// shared by all of them. When its last reference goes, a page that was registered in the prefix
// cache is not freed: it waits, evictable, in least-recently-used order, so the next request that
// starts with the same tokens picks it up instead of computing it again. A fresh page is taken from
// the free list first and only then by evicting the least recently used cached page.
//
// A block is found by a hash chained over all blocks before it (hash(parent hash, the block's 16
// tokens)), so a block matches only under the same prefix. The tokens are kept with the page and
// compared on every hit, so a hash collision can never hand out the wrong keys and values.
//
// Host bookkeeping only. The step scheduler (step_scheduler.hpp) takes every sequence's pages from
// it, for both backends: the CUDA engine's block table mirrors them, and the server's CPU backend
// (src/server/batching) keeps a copy of each registered block's keys and values.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepfuse::batching {

using PageId = int32_t;
using BlockHash = uint64_t;

class KvBlockPool {
 public:
  KvBlockPool(int total_pages, bool prefix_caching);

  static int block_tokens();                    // positions per page (kKvPageSize)
  static int pages_for(int tokens);
  // The chained hash of a full block of block_tokens() ids.
  static BlockHash block_hash(BlockHash parent, std::span<const int32_t> tokens);
  static constexpr BlockHash kRootHash = 0xcbf29ce484222325ull;

  int total_pages() const { return total_pages_; }
  // Pages some sequence references.
  int used_pages() const { return used_; }
  // Pages no sequence references but the prefix cache keeps (evictable).
  int cached_pages() const { return static_cast<int>(lru_.size()); }
  // Pages allocate() can still hand out: free ones and evictable cached ones.
  int available_pages() const { return total_pages_ - used_; }
  bool prefix_caching() const { return prefix_caching_; }

  // A page for one more reference holder: a free page, else the least recently used cached one
  // (dropped from the cache). nullopt when every page is referenced.
  std::optional<PageId> allocate();
  // Drops one reference; the last one frees the page or, when it holds a cached block, makes it
  // evictable (most recently used).
  void release(PageId page);

  // The longest run of cached blocks `tokens` starts with, at most max_blocks of them, each with
  // one more reference taken for the caller. `hashes` receives the chain of the matched blocks.
  std::vector<PageId> match_prefix(std::span<const int32_t> tokens, int max_blocks, std::vector<BlockHash>& hashes);

  // Records that `page` (referenced by the caller) now holds the full block `tokens`, whose chained
  // hash is `hash`. Returns false when prefix caching is off or another page already holds that
  // block (the page then stays private to its sequence and is freed with it).
  bool register_block(PageId page, BlockHash hash, std::span<const int32_t> tokens);

 private:
  struct Page {
    int references = 0;
    std::optional<BlockHash> hash;              // set while the page is in the prefix cache
    std::vector<int32_t> tokens;                // the block's ids, to verify a hit
    std::list<PageId>::iterator lru_position;   // valid while references == 0 and hash is set
  };
  void take_reference(PageId page);
  void forget_block(PageId page);

  int total_pages_;
  bool prefix_caching_;
  int used_ = 0;
  std::vector<Page> pages_;
  std::vector<PageId> free_list_;               // pages holding nothing
  std::list<PageId> lru_;                       // cached, unreferenced pages, least recent first
  std::unordered_map<BlockHash, PageId> by_hash_;
};

}  // namespace deepfuse::batching
