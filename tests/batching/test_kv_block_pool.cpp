// The KV block pool and its prefix cache: reference counts, LRU eviction of unreferenced cached
// blocks, hash chains that only match under the same prefix.
#include <gtest/gtest.h>

#include <numeric>

#include "batching/kv_block_pool.hpp"

namespace deepfuse::batching {
namespace {

std::vector<int32_t> iota_tokens(int count, int start = 0) {
  std::vector<int32_t> ids(count);
  std::iota(ids.begin(), ids.end(), start);
  return ids;
}

// Allocates pages for `tokens` and registers their full blocks, as a sequence that computed them.
std::vector<PageId> compute(KvBlockPool& pool, const std::vector<int32_t>& tokens) {
  std::vector<PageId> pages;
  BlockHash parent = KvBlockPool::kRootHash;
  const int block = KvBlockPool::block_tokens();
  for (int b = 0; b < KvBlockPool::pages_for(static_cast<int>(tokens.size())); ++b) {
    pages.push_back(*pool.allocate());
    if ((b + 1) * block <= static_cast<int>(tokens.size())) {
      const std::span<const int32_t> ids(tokens.data() + b * block, block);
      parent = KvBlockPool::block_hash(parent, ids);
      pool.register_block(pages.back(), parent, ids);
    }
  }
  return pages;
}

TEST(KvBlockPool, AllocatesUntilEveryPageIsReferenced) {
  KvBlockPool pool(3, true);
  EXPECT_EQ(pool.allocate(), 0);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_FALSE(pool.allocate());
  EXPECT_EQ(pool.used_pages(), 3);
  pool.release(1);
  EXPECT_EQ(pool.available_pages(), 1);
  EXPECT_EQ(pool.allocate(), 1);
}

TEST(KvBlockPool, ASharedPrefixIsMatchedAndReferenceCounted) {
  KvBlockPool pool(8, true);
  const std::vector<int32_t> tokens = iota_tokens(40);  // 2 full blocks and a partial one
  const std::vector<PageId> first = compute(pool, tokens);
  std::vector<BlockHash> hashes;
  const std::vector<PageId> matched = pool.match_prefix(tokens, 10, hashes);
  ASSERT_EQ(matched.size(), 2u);
  EXPECT_EQ(matched[0], first[0]);
  EXPECT_EQ(matched[1], first[1]);
  EXPECT_EQ(hashes.size(), 2u);
  EXPECT_EQ(pool.used_pages(), 3);  // shared pages count once
  for (const PageId p : first) pool.release(p);
  EXPECT_EQ(pool.used_pages(), 2);  // still referenced by the match
  for (const PageId p : matched) pool.release(p);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.cached_pages(), 2);  // the full blocks stay cached, the partial one is free
  EXPECT_EQ(pool.available_pages(), 8);
}

TEST(KvBlockPool, MatchesStopAtTheFirstDifferentBlockAndAtMaxBlocks) {
  KvBlockPool pool(8, true);
  std::vector<int32_t> tokens = iota_tokens(48);
  compute(pool, tokens);
  std::vector<BlockHash> hashes;
  std::vector<int32_t> other = tokens;
  other[20] = 999;  // second block differs
  EXPECT_EQ(pool.match_prefix(other, 10, hashes).size(), 1u);
  EXPECT_EQ(pool.match_prefix(tokens, 2, hashes).size(), 2u);
  // The same second block under another first block is another block.
  std::vector<int32_t> shifted = tokens;
  shifted[0] = 777;
  EXPECT_EQ(pool.match_prefix(shifted, 10, hashes).size(), 0u);
}

TEST(KvBlockPool, EvictsTheLeastRecentlyUsedCachedBlockWhenFull) {
  KvBlockPool pool(2, true);
  const std::vector<int32_t> a = iota_tokens(16, 0), b = iota_tokens(16, 100);
  const PageId pa = compute(pool, a)[0];
  const PageId pb = compute(pool, b)[0];
  pool.release(pa);  // a is the least recently used
  pool.release(pb);
  EXPECT_EQ(pool.cached_pages(), 2);
  EXPECT_EQ(pool.allocate(), pa);
  std::vector<BlockHash> hashes;
  EXPECT_TRUE(pool.match_prefix(a, 1, hashes).empty());   // evicted
  EXPECT_EQ(pool.match_prefix(b, 1, hashes).size(), 1u);  // kept
}

TEST(KvBlockPool, WithoutPrefixCachingNothingIsShared) {
  KvBlockPool pool(4, false);
  const std::vector<int32_t> tokens = iota_tokens(32);
  for (const PageId p : compute(pool, tokens)) pool.release(p);
  std::vector<BlockHash> hashes;
  EXPECT_TRUE(pool.match_prefix(tokens, 4, hashes).empty());
  EXPECT_EQ(pool.cached_pages(), 0);
}

}  // namespace
}  // namespace deepfuse::batching
