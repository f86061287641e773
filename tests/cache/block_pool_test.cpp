#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace sieve::cache {

TEST(BlockPool, AllocatesDistinctIdsAndRefusesOverdraw) {
  BlockPool pool(8, false);
  auto a = pool.allocate(5);
  ASSERT_TRUE(a);
  EXPECT_EQ(pool.num_free(), 3);
  std::set<int32_t> ids(a->begin(), a->end());
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_FALSE(pool.allocate(4));
  EXPECT_EQ(pool.num_free(), 3);  // a refused allocation changes nothing
  auto b = pool.allocate(3);
  ASSERT_TRUE(b);
  for (int32_t id : *b) EXPECT_FALSE(ids.count(id));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  pool.release(*a);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.ref_count((*a)[0]), 0);
}

TEST(BlockPool, RefCountsKeepSharedBlocksAlive) {
  BlockPool pool(4, true);
  auto a = pool.allocate(2);
  pool.retain(*a);
  EXPECT_EQ(pool.ref_count((*a)[0]), 2);
  pool.release(*a);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(*a);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_ANY_THROW(pool.release(*a));  // a double free is a bug, caught
}

TEST(BlockPool, FreedBlocksGoToTheBackInTheGivenOrder) {
  BlockPool pool(4, false);
  auto all = pool.allocate(4);
  ASSERT_TRUE(all);
  std::vector<int32_t> order = {(*all)[2], (*all)[0], (*all)[3], (*all)[1]};
  pool.release(order);
  auto again = pool.allocate(4);
  EXPECT_EQ(*again, order);
}

TEST(BlockPool, PrefixLookupComparesTokensAndParent) {
  BlockPool pool(4, true);
  auto a = pool.allocate(1);
  std::vector<int32_t> toks = {1, 2, 3, 4};
  BlockHash h = hash_block(0, toks);
  pool.insert((*a)[0], h, 0, toks);
  EXPECT_EQ(pool.lookup(h, 0, toks), (*a)[0]);
  std::vector<int32_t> other = {1, 2, 3, 5};
  EXPECT_FALSE(pool.lookup(h, 0, other));  // same hash key, different tokens: no false hit
  EXPECT_FALSE(pool.lookup(h, 77, toks));  // different prefix
  EXPECT_NE(hash_block(0, toks), hash_block(1, toks));
  EXPECT_NE(hash_block(0, toks), hash_block(0, other));
}

TEST(BlockPool, CachedBlocksSurviveReleaseUntilEvictedLru) {
  BlockPool pool(3, true);
  auto a = pool.allocate(3);
  std::vector<std::vector<int32_t>> toks = {{1, 1}, {2, 2}, {3, 3}};
  std::vector<BlockHash> hs;
  for (int i = 0; i < 3; ++i) {
    hs.push_back(hash_block(0, toks[size_t(i)]));
    pool.insert((*a)[size_t(i)], hs.back(), 0, toks[size_t(i)]);
  }
  // Release block 0 first, then 1, then 2: 0 is least recently used.
  pool.release(std::vector<int32_t>{(*a)[0]});
  pool.release(std::vector<int32_t>{(*a)[1]});
  pool.release(std::vector<int32_t>{(*a)[2]});
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_cached(), 3);
  // A hit on block 1 takes it out of the free queue.
  auto hit = pool.lookup(hs[1], 0, toks[1]);
  ASSERT_TRUE(hit);
  pool.retain(std::vector<int32_t>{*hit});
  EXPECT_EQ(pool.num_free(), 2);
  // The next allocation evicts the LRU block (0), not the touched one.
  auto b = pool.allocate(1);
  EXPECT_EQ((*b)[0], (*a)[0]);
  EXPECT_FALSE(pool.lookup(hs[0], 0, toks[0]));
  EXPECT_TRUE(pool.lookup(hs[2], 0, toks[2]));
  EXPECT_TRUE(pool.lookup(hs[1], 0, toks[1]));
  auto c = pool.allocate(1);
  EXPECT_EQ((*c)[0], (*a)[2]);
  EXPECT_FALSE(pool.lookup(hs[2], 0, toks[2]));
  EXPECT_EQ(pool.num_cached(), 1);
}

TEST(BlockPool, WithoutCachingNothingIsFound) {
  BlockPool pool(2, false);
  auto a = pool.allocate(1);
  std::vector<int32_t> toks = {9};
  pool.insert((*a)[0], hash_block(0, toks), 0, toks);
  EXPECT_FALSE(pool.lookup(hash_block(0, toks), 0, toks));
}

}  // namespace sieve::cache
