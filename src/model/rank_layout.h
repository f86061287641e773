// What one tensor-parallel rank holds of the model (spec §6): query heads split; kv heads split
// up to num_key_value_heads ranks and replicated beyond; index-q heads follow the kv heads;
// the index key head replicated; the dense MLP, shared and routed expert intermediate sizes
// split; the vocabulary split for the embedding and lm_head. With expert parallelism the routed
// experts are not split but dealt out whole (rank r holds experts [expert0, expert0 + experts));
// the shared expert stays split. Computed once from the config and (tp_size, rank); the loader
// reads only the rank's slices and the model sizes its work from it. With tp_size 1 every slice
// is the whole.
#pragma once

#include <cstdint>
#include <string>

#include "io/config.h"

namespace sieve::model {

struct RankLayout {
  int tp_size = 1, rank = 0;
  int q_heads = 0, q_head0 = 0;          // query heads [q_head0, q_head0 + q_heads)
  int kv_heads = 0, kv_head0 = 0;        // kv heads
  int index_heads = 0, index_head0 = 0;  // index-q heads (= the kv heads, spec §2.2)
  int64_t dense_inter = 0, dense_inter0 = 0;    // dense MLP intermediate columns
  int64_t expert_inter = 0, expert_inter0 = 0;  // each routed expert's (whole with expert_parallel)
  bool expert_parallel = false;
  int experts = 0, expert0 = 0;  // routed experts held (all of them without expert_parallel)
  int64_t shared_inter = 0, shared_inter0 = 0;  // the shared expert's
  int64_t vocab = 0, vocab0 = 0;                // embedding / lm_head rows

  // Throws Error naming the config key that tp_size does not divide.
  static RankLayout make(const ModelConfig& cfg, int tp_size, int rank, bool expert_parallel = false);
  // "rank 2 of 8" (or "" for one rank), for messages.
  std::string describe() const;
};

}  // namespace sieve::model
