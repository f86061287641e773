#include "cache/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace sieve::cache {

KvCacheManager::KvCacheManager(int64_t num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), pool_(num_blocks, enable_prefix_caching) {
  SIEVE_CHECK(block_size > 0, "block size must be positive");
}

PrefixHit KvCacheManager::find_prefix(std::span<const int32_t> tokens) const {
  PrefixHit hit;
  if (!pool_.caching_enabled() || tokens.empty()) return hit;
  const int64_t max_blocks = (int64_t(tokens.size()) - 1) / block_size_;
  BlockHash parent = 0;
  for (int64_t b = 0; b < max_blocks; ++b) {
    auto blk = tokens.subspan(size_t(b * block_size_), size_t(block_size_));
    BlockHash h = hash_block(parent, blk);
    auto found = pool_.lookup(h, parent, blk);
    if (!found) break;
    hit.blocks.push_back(*found);
    hit.hashes.push_back(h);
    parent = h;
  }
  hit.num_tokens = int64_t(hit.blocks.size()) * block_size_;
  return hit;
}

bool KvCacheManager::allocate(RequestId id, int64_t num_tokens, const PrefixHit* hit) {
  auto it = tables_.find(id);
  const bool fresh = it == tables_.end() || it->second.blocks.empty();
  const bool use_hit = hit && fresh && !hit->blocks.empty();
  int64_t have = it == tables_.end() ? 0 : int64_t(it->second.blocks.size());
  int64_t reused = 0, reused_free = 0;
  if (use_hit) {
    reused = int64_t(hit->blocks.size());
    for (int32_t b : hit->blocks)
      if (pool_.ref_count(b) == 0) ++reused_free;  // taking it off the free queue costs one
  }
  const int64_t need = std::max<int64_t>(0, blocks_for(num_tokens) - have - reused);
  if (need + reused_free > pool_.num_free()) return false;
  Table& t = tables_[id];
  if (use_hit) {
    pool_.retain(hit->blocks);
    t.blocks = hit->blocks;
    t.hashes = hit->hashes;
  }
  if (hit && fresh && pool_.caching_enabled()) {
    query_tokens_ += num_tokens;
    hit_tokens_ += use_hit ? hit->num_tokens : 0;
  }
  if (need > 0) {
    auto fresh_blocks = pool_.allocate(need);
    SIEVE_CHECK(fresh_blocks.has_value(), "free block count was checked");
    t.blocks.insert(t.blocks.end(), fresh_blocks->begin(), fresh_blocks->end());
  }
  return true;
}

void KvCacheManager::cache_full_blocks(RequestId id, std::span<const int32_t> tokens,
                                       int64_t num_computed) {
  if (!pool_.caching_enabled()) return;
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  int64_t full = std::min<int64_t>(num_computed, int64_t(tokens.size())) / block_size_;
  full = std::min<int64_t>(full, int64_t(t.blocks.size()));
  for (int64_t b = int64_t(t.hashes.size()); b < full; ++b) {
    BlockHash parent = b == 0 ? 0 : t.hashes[size_t(b - 1)];
    auto blk = tokens.subspan(size_t(b * block_size_), size_t(block_size_));
    BlockHash h = hash_block(parent, blk);
    pool_.insert(t.blocks[size_t(b)], h, parent, blk);
    t.hashes.push_back(h);
  }
}

void KvCacheManager::free(RequestId id) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  std::vector<int32_t> rev(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(rev);
  tables_.erase(it);
}

void KvCacheManager::truncate(RequestId id, int64_t num_tokens) {
  auto it = tables_.find(id);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const size_t keep = size_t(std::max<int64_t>(0, blocks_for(num_tokens)));
  if (t.hashes.size() > size_t(std::max<int64_t>(0, num_tokens)) / size_t(block_size_))
    t.hashes.resize(size_t(std::max<int64_t>(0, num_tokens)) / size_t(block_size_));
  if (t.blocks.size() <= keep) return;
  // Front of the free queue, last block first: the next allocation takes the first of them back.
  std::vector<int32_t> tail(t.blocks.begin() + long(keep), t.blocks.end());
  std::reverse(tail.begin(), tail.end());
  pool_.release_uncached(tail);
  t.blocks.resize(keep);
}

const std::vector<int32_t>& KvCacheManager::block_table(RequestId id) const {
  static const std::vector<int32_t> empty;
  auto it = tables_.find(id);
  return it == tables_.end() ? empty : it->second.blocks;
}

}  // namespace sieve::cache
