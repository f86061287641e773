#include "cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

namespace sieve::cache {

static std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(KvCacheManager, TablesGrowByBlocksAndFreeAtOnce) {
  KvCacheManager kv(10, 4, false);
  ASSERT_TRUE(kv.allocate(1, 5));
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(kv.allocate(1, 8));  // still two blocks
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(kv.allocate(1, 9));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  ASSERT_TRUE(kv.allocate(2, 28));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_FALSE(kv.allocate(1, 13));
  EXPECT_EQ(kv.block_table(1).size(), 3u);  // refused: unchanged
  std::set<int32_t> ids;
  for (auto b : kv.block_table(1)) ids.insert(b);
  for (auto b : kv.block_table(2)) ids.insert(b);
  EXPECT_EQ(ids.size(), 10u);
  kv.free(2);
  EXPECT_EQ(kv.num_free_blocks(), 7);
  EXPECT_FALSE(kv.has(2));
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 10);
}

TEST(KvCacheManager, PrefixHitReusesFullBlocksOnly) {
  KvCacheManager kv(16, 4, true);
  auto prompt = iota_tokens(10, 100);  // two full blocks + 2 tokens
  EXPECT_EQ(kv.find_prefix(prompt).num_tokens, 0);
  ASSERT_TRUE(kv.allocate(1, 10));
  kv.cache_full_blocks(1, prompt, 10);
  auto t1 = kv.block_table(1);

  auto hit = kv.find_prefix(prompt);
  EXPECT_EQ(hit.num_tokens, 8);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.blocks[0], t1[0]);
  EXPECT_EQ(hit.blocks[1], t1[1]);
  ASSERT_TRUE(kv.allocate(2, 10, &hit));
  auto t2 = kv.block_table(2);
  EXPECT_EQ(t2[0], t1[0]);
  EXPECT_EQ(t2[1], t1[1]);
  EXPECT_NE(t2[2], t1[2]);  // the partial block is private
  EXPECT_EQ(kv.pool().ref_count(t1[0]), 2);

  // A prompt that diverges in its second block shares only the first.
  auto other = prompt;
  other[5] = 7;
  EXPECT_EQ(kv.find_prefix(other).num_tokens, 4);
  // The whole prompt is never a hit: the last token must be computed for its logits.
  auto exact = iota_tokens(8, 100);
  EXPECT_EQ(kv.find_prefix(exact).num_tokens, 4);
  EXPECT_EQ(kv.prefix_hit_tokens(), 8);
}

TEST(KvCacheManager, FreedPrefixStaysReusableUntilEvicted) {
  KvCacheManager kv(4, 4, true);
  auto a = iota_tokens(9, 0);
  ASSERT_TRUE(kv.allocate(1, 9));
  kv.cache_full_blocks(1, a, 9);
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 4);
  auto hit = kv.find_prefix(a);
  EXPECT_EQ(hit.num_tokens, 8);
  // Reusing two free cached blocks plus one new one needs three free blocks.
  ASSERT_TRUE(kv.allocate(2, 9, &hit));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  kv.free(2);
  // A different request takes every block: the cached prefix is evicted.
  auto b = iota_tokens(16, 1000);
  ASSERT_TRUE(kv.allocate(3, 16));
  kv.cache_full_blocks(3, b, 16);
  EXPECT_EQ(kv.find_prefix(a).num_tokens, 0);
  kv.free(3);
  EXPECT_EQ(kv.find_prefix(b).num_tokens, 12);
}

TEST(KvCacheManager, RefusedHitAllocationTakesNoReferences) {
  KvCacheManager kv(3, 4, true);
  auto a = iota_tokens(5, 0);
  ASSERT_TRUE(kv.allocate(1, 5));
  kv.cache_full_blocks(1, a, 5);
  kv.free(1);
  ASSERT_TRUE(kv.allocate(9, 4));  // one block elsewhere
  auto hit = kv.find_prefix(a);
  ASSERT_EQ(hit.num_tokens, 4);
  EXPECT_FALSE(kv.allocate(2, 13, &hit));  // needs 1 reused + 3 new > 2 free
  EXPECT_EQ(kv.num_free_blocks(), 2);
  EXPECT_FALSE(kv.has(2));
}

TEST(KvCacheManager, DisabledCachingNeverHits) {
  KvCacheManager kv(8, 4, false);
  auto a = iota_tokens(9);
  ASSERT_TRUE(kv.allocate(1, 9));
  kv.cache_full_blocks(1, a, 9);
  EXPECT_EQ(kv.find_prefix(a).num_tokens, 0);
}

// Speculative decoding's rollback: the table shrinks to the computed tokens, the prefix cache is
// untouched, and the next allocation takes the same blocks back instead of evicting a cached one.
TEST(KvCacheManager, TruncateGivesTheTailBackWithoutEvictingCachedBlocks) {
  KvCacheManager kv(6, 4, true);
  auto a = iota_tokens(9, 0);
  ASSERT_TRUE(kv.allocate(1, 9));
  kv.cache_full_blocks(1, a, 9);
  kv.free(1);  // two cached blocks (and one empty) in the free queue
  auto b = iota_tokens(6, 100);
  ASSERT_TRUE(kv.allocate(2, 6));
  kv.cache_full_blocks(2, b, 5);
  ASSERT_TRUE(kv.allocate(2, 6 + 8));  // drafts reach two more blocks
  const std::vector<int32_t> long_table = kv.block_table(2);
  ASSERT_EQ(long_table.size(), 4u);
  kv.truncate(2, 7);  // two drafts kept
  EXPECT_EQ(kv.block_table(2), std::vector<int32_t>(long_table.begin(), long_table.begin() + 2));
  EXPECT_EQ(kv.num_free_blocks(), 4);
  EXPECT_EQ(kv.find_prefix(a).num_tokens, 8) << "cached prefix blocks survive";
  ASSERT_TRUE(kv.allocate(2, 7 + 8));
  EXPECT_EQ(kv.block_table(2), long_table) << "the same blocks come back";
  EXPECT_EQ(kv.find_prefix(a).num_tokens, 8);
  kv.truncate(2, 0);
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.num_free_blocks(), 6);
}

}  // namespace sieve::cache
