#include "model/rank_layout.h"

#include "core/error.h"

namespace sieve::model {

namespace {

// [begin, begin + n / tp) of n split over tp ranks; the key names the config entry in errors.
int64_t split(int64_t n, int tp, const char* key) {
  if (n % tp != 0)
    throw Error(std::string(key) + " = " + std::to_string(n) + " does not split over " + std::to_string(tp) +
                " tensor-parallel ranks");
  return n / tp;
}

}  // namespace

RankLayout RankLayout::make(const ModelConfig& c, int tp, int rank, bool expert_parallel) {
  if (tp < 1) throw Error("tensor-parallel size must be at least 1, got " + std::to_string(tp));
  if (rank < 0 || rank >= tp)
    throw Error("tensor-parallel rank " + std::to_string(rank) + " is outside 0.." + std::to_string(tp - 1));
  RankLayout l;
  l.tp_size = tp;
  l.rank = rank;
  l.q_heads = int(split(c.num_attention_heads, tp, "num_attention_heads"));
  l.q_head0 = rank * l.q_heads;
  const int nkv = c.num_key_value_heads;
  if (tp <= nkv) {
    l.kv_heads = int(split(nkv, tp, "num_key_value_heads"));
    l.kv_head0 = rank * l.kv_heads;
  } else {
    // Replicated: tp / nkv ranks share each kv head (the one their query heads attend with).
    if (tp % nkv != 0)
      throw Error("num_key_value_heads = " + std::to_string(nkv) + " does not divide " + std::to_string(tp) +
                  " tensor-parallel ranks (kv heads are replicated over a whole number of ranks)");
    l.kv_heads = 1;
    l.kv_head0 = rank / (tp / nkv);
  }
  l.index_heads = c.use_sparse_attention ? l.kv_heads : 0;
  l.index_head0 = c.use_sparse_attention ? l.kv_head0 : 0;
  l.dense_inter = split(c.dense_intermediate_size, tp, "dense_intermediate_size");
  l.dense_inter0 = rank * l.dense_inter;
  l.expert_parallel = expert_parallel;
  if (expert_parallel && c.num_local_experts > 0) {
    if (c.num_local_experts % tp != 0)
      throw Error("--enable-expert-parallel: num_local_experts = " + std::to_string(c.num_local_experts) +
                  " does not split over " + std::to_string(tp) + " tensor-parallel ranks");
    l.experts = c.num_local_experts / tp;
    l.expert0 = rank * l.experts;
    l.expert_inter = c.intermediate_size;
    l.expert_inter0 = 0;
  } else {
    l.experts = c.num_local_experts;
    l.expert0 = 0;
    l.expert_inter = split(c.intermediate_size, tp, "intermediate_size");
    l.expert_inter0 = rank * l.expert_inter;
  }
  l.shared_inter = split(c.shared_intermediate_size, tp, "shared_intermediate_size");
  l.shared_inter0 = rank * l.shared_inter;
  l.vocab = split(c.vocab_size, tp, "vocab_size");
  l.vocab0 = rank * l.vocab;
  return l;
}

std::string RankLayout::describe() const {
  if (tp_size == 1) return "";
  return "rank " + std::to_string(rank) + " of " + std::to_string(tp_size);
}

}  // namespace sieve::model
