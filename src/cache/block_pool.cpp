#include "cache/block_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace sieve::cache {

namespace {
uint64_t mix(uint64_t x) {
  // splitmix64 finalizer: cheap and well distributed, so chained hashes do not cluster.
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent ^ 0x51e7eull);
  for (int32_t t : tokens) h = mix(h ^ uint64_t(uint32_t(t)));
  return mix(h ^ uint64_t(tokens.size()));
}

BlockPool::BlockPool(int64_t num_blocks, bool enable_caching)
    : num_blocks_(num_blocks),
      caching_(enable_caching),
      refs_(size_t(num_blocks), 0),
      prev_(size_t(num_blocks), -1),
      next_(size_t(num_blocks), -1),
      in_queue_(size_t(num_blocks), false),
      cached_(size_t(num_blocks)) {
  SIEVE_CHECK(num_blocks > 0 && num_blocks < (int64_t(1) << 31), "block count out of range");
  for (int32_t b = 0; b < int32_t(num_blocks); ++b) queue_push_back(b);
}

void BlockPool::queue_push_back(int32_t b) {
  prev_[b] = tail_;
  next_[b] = -1;
  if (tail_ >= 0)
    next_[tail_] = b;
  else
    head_ = b;
  tail_ = b;
  in_queue_[b] = true;
  ++num_free_;
}

void BlockPool::queue_push_front(int32_t b) {
  next_[b] = head_;
  prev_[b] = -1;
  if (head_ >= 0)
    prev_[head_] = b;
  else
    tail_ = b;
  head_ = b;
  in_queue_[b] = true;
  ++num_free_;
}

void BlockPool::queue_remove(int32_t b) {
  SIEVE_CHECK(in_queue_[b], "block not in free queue");
  if (prev_[b] >= 0)
    next_[prev_[b]] = next_[b];
  else
    head_ = next_[b];
  if (next_[b] >= 0)
    prev_[next_[b]] = prev_[b];
  else
    tail_ = prev_[b];
  prev_[b] = next_[b] = -1;
  in_queue_[b] = false;
  --num_free_;
}

void BlockPool::evict(int32_t b) {
  Cached& c = cached_[b];
  if (!c.valid) return;
  auto it = by_hash_.find(c.hash);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  c = Cached{};
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int64_t n) {
  if (n < 0 || n > num_free_) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t b = head_;
    queue_remove(b);
    evict(b);
    refs_[b] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    SIEVE_CHECK(b >= 0 && b < num_blocks_ && refs_[b] > 0,
                "release of a free block " + std::to_string(b));
    if (--refs_[b] == 0) {
      // Without prefix caching a freed block holds nothing worth keeping.
      if (!caching_) evict(b);
      queue_push_back(b);
    }
  }
}

void BlockPool::release_uncached(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    SIEVE_CHECK(b >= 0 && b < num_blocks_ && refs_[b] > 0, "release of a free block " + std::to_string(b));
    if (--refs_[b] > 0) continue;
    if (cached_[b].valid) {
      queue_push_back(b);  // (a cached prefix after all: keep LRU order)
    } else {
      queue_push_front(b);
    }
  }
}

void BlockPool::retain(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    SIEVE_CHECK(b >= 0 && b < num_blocks_, "retain of a bad block id");
    if (refs_[b]++ == 0) queue_remove(b);
  }
}

std::optional<int32_t> BlockPool::lookup(BlockHash hash, BlockHash parent,
                                         std::span<const int32_t> tokens) const {
  if (!caching_) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Cached& c = cached_[it->second];
  if (c.parent != parent ||
      !std::equal(c.tokens.begin(), c.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  return it->second;
}

void BlockPool::insert(int32_t block, BlockHash hash, BlockHash parent,
                       std::span<const int32_t> tokens) {
  if (!caching_) return;
  SIEVE_CHECK(refs_[block] > 0, "caching an unreferenced block");
  if (cached_[block].valid) return;
  if (by_hash_.count(hash)) return;
  cached_[block] = Cached{hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end()), true};
  by_hash_[hash] = block;
}

void BlockPool::reset_cache() {
  by_hash_.clear();
  for (auto& c : cached_) c = Cached{};
}

}  // namespace sieve::cache
