// The block pool: physical cache block ids with reference counts, a free queue, and the prefix
// cache index. It manages ids only; the KV and index caches of every layer are addressed by the
// same id, so reusing a block for a prefix reuses its KV and index-key entries together.
//
// Free queue order is eviction order: allocation takes from the front. A freed block that holds a
// cached prefix stays findable until it is taken again (LRU eviction), and a prefix hit on such a
// block takes it off the queue ("touch").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace sieve::cache {

using BlockHash = uint64_t;

// Hash of a full block: its token ids chained to the hash of the blocks before it (0 for the
// first block), so equal hashes mean equal prefixes up to collisions, which the pool rules out by
// comparing the stored tokens.
BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

class BlockPool {
 public:
  BlockPool(int64_t num_blocks, bool enable_caching);

  int64_t num_blocks() const { return num_blocks_; }
  // Blocks that can be allocated now: unreferenced, cached or not.
  int64_t num_free() const { return num_free_; }
  int64_t num_used() const { return num_blocks_ - num_free_; }
  double usage() const { return num_blocks_ ? double(num_used()) / double(num_blocks_) : 0.0; }
  bool caching_enabled() const { return caching_; }
  int64_t num_cached() const { return int64_t(by_hash_.size()); }

  // n blocks with reference count 1, taken from the front of the free queue (evicting any cached
  // prefix they held); nullopt and no change when fewer than n are free.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  // Drops one reference from each block; blocks that reach zero go to the back of the free queue
  // in the order given (so pass a table's blocks tail first: tails are evicted before heads).
  void release(std::span<const int32_t> blocks);
  // The same for blocks that hold no cached prefix (speculative decoding's rejected tail): they
  // go to the front of the free queue, so the next allocation takes them back before it evicts a
  // cached block.
  void release_uncached(std::span<const int32_t> blocks);
  // Takes one more reference on each block (prefix hits); removes unreferenced ones from the free
  // queue.
  void retain(std::span<const int32_t> blocks);
  int ref_count(int32_t block) const { return refs_.at(size_t(block)); }

  // The cached block holding exactly `tokens` after prefix `parent`, if any.
  std::optional<int32_t> lookup(BlockHash hash, BlockHash parent,
                                std::span<const int32_t> tokens) const;
  // Records that `block` (referenced, full) holds `tokens` after `parent`. A hash already held by
  // another block keeps that block.
  void insert(int32_t block, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens);
  // Forgets every cached prefix (for example after the caches were reallocated).
  void reset_cache();

 private:
  struct Cached {
    BlockHash hash = 0, parent = 0;
    std::vector<int32_t> tokens;
    bool valid = false;
  };
  void queue_push_back(int32_t b);
  void queue_push_front(int32_t b);
  void queue_remove(int32_t b);
  void evict(int32_t b);

  int64_t num_blocks_;
  bool caching_;
  std::vector<int> refs_;
  // Intrusive doubly linked free queue over block ids (-1 = none), so a hit can take a block out
  // of the middle in O(1).
  std::vector<int32_t> prev_, next_;
  std::vector<bool> in_queue_;
  int32_t head_ = -1, tail_ = -1;
  int64_t num_free_ = 0;
  std::vector<Cached> cached_;  // per block
  std::unordered_map<BlockHash, int32_t> by_hash_;
};

}  // namespace sieve::cache
