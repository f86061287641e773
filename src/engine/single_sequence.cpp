#include "engine/single_sequence.h"

#include <algorithm>

#include "core/error.h"

namespace sieve::engine {

SingleSequence::SingleSequence(Runner& r, model::CacheOptions opts, int64_t capacity)
    : r_(r), capacity_(capacity) {
  model::Model& m = r.model();
  const int bs = m.block_size();
  const int64_t blocks = std::max<int64_t>(1, (capacity + bs - 1) / bs);
  opts.num_blocks = blocks;
  r.allocate_caches(opts);
  table_.resize(size_t(blocks));
  for (int64_t b = 0; b < blocks; ++b) table_[size_t(b)] = int32_t(blocks - 1 - b);
}

std::vector<float> SingleSequence::append(const std::vector<int32_t>& ids, bool all_logits,
                                          int64_t chunk) {
  if (length_ + int64_t(ids.size()) > capacity_)
    throw Error("sequence of " + std::to_string(length_ + int64_t(ids.size())) +
                " tokens exceeds the " + std::to_string(capacity_) + " it was sized for");
  const int bs = r_.model().block_size();
  std::vector<float> out, logits;
  for (size_t at = 0; at < ids.size(); at += size_t(chunk)) {
    const size_t end = std::min(ids.size(), at + size_t(chunk));
    StepInputs in;
    for (size_t i = at; i < end; ++i) {
      const int64_t p = length_ + int64_t(i - at);
      in.token_ids.push_back(ids[i]);
      in.positions.push_back(int32_t(p));
      in.slot_mapping.push_back(int64_t(table_[size_t(p / bs)]) * bs + p % bs);
      if (all_logits || i + 1 == ids.size()) in.logits_indices.push_back(int32_t(i - at));
    }
    in.query_start_loc = {0, int32_t(end - at)};
    in.seq_lens = {int32_t(length_ + int64_t(end - at))};
    in.block_tables = table_;
    in.max_blocks_per_seq = int(table_.size());
    r_.run(in, logits);
    length_ += int64_t(end - at);
    if (all_logits || end == ids.size()) out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

}  // namespace sieve::engine
