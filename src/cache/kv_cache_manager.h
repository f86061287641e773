// Per-request block tables over one BlockPool. Every layer's KV cache and index cache share the
// block ids, so one table per request describes all of them.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_pool.h"

namespace sieve::cache {

using RequestId = uint64_t;

// A prefix cache hit: blocks holding the first num_tokens tokens of a request (full blocks only).
struct PrefixHit {
  std::vector<int32_t> blocks;
  std::vector<BlockHash> hashes;
  int64_t num_tokens = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int64_t num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  int64_t blocks_for(int64_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // Longest run of cached full blocks at the start of `tokens`. At least one token is always
  // left to compute, because the step that samples needs the logits of the last one. Takes no
  // references: pass the hit to allocate().
  PrefixHit find_prefix(std::span<const int32_t> tokens) const;

  // Makes the table of `id` cover `num_tokens` tokens: first the hit's blocks (only when the
  // table is empty), then fresh blocks. Returns false and changes nothing when the pool has too
  // few free blocks.
  bool allocate(RequestId id, int64_t num_tokens, const PrefixHit* hit = nullptr);
  // Registers the full blocks among the first `num_computed` of `tokens` in the prefix cache.
  void cache_full_blocks(RequestId id, std::span<const int32_t> tokens, int64_t num_computed);
  // Releases every block of `id` at once (finish, abort, preemption).
  void free(RequestId id);
  // Speculative decoding's rollback: shrinks the table of `id` to the blocks of its first
  // `num_tokens` tokens (the tail goes back to the pool, last block first) and forgets prefix
  // hashes past its full blocks, leaving the table as if the tokens after num_tokens had never
  // been scheduled.
  void truncate(RequestId id, int64_t num_tokens);

  bool has(RequestId id) const { return tables_.count(id) != 0; }
  const std::vector<int32_t>& block_table(RequestId id) const;
  int64_t num_free_blocks() const { return pool_.num_free(); }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  double usage() const { return pool_.usage(); }
  // Queries and hits of the prefix cache, in tokens (for metrics).
  int64_t prefix_query_tokens() const { return query_tokens_; }
  int64_t prefix_hit_tokens() const { return hit_tokens_; }

 private:
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<BlockHash> hashes;  // of the leading blocks already registered
  };
  int block_size_;
  BlockPool pool_;
  std::unordered_map<RequestId, Table> tables_;
  int64_t query_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace sieve::cache
