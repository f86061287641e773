// One sequence through the model's paged path, for the commands that run a single prompt
// (generate, eval perplexity). Its block table holds the physical blocks in reverse order, so
// logical and physical ids differ as they do when serving.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace sieve::model {

// Cache dtypes as the flags give them: `index` empty means "follow the kv cache dtype".
CacheOptions cache_options_from_flags(const std::string& kv, const std::string& index);

class SingleSequence {
 public:
  // Allocates the model's caches for `capacity` tokens with `opts` (num_blocks is set here).
  SingleSequence(Model& m, CacheOptions opts, int64_t capacity);

  // Appends `ids` at positions [length(), length() + ids.size()) in chunks of at most `chunk`
  // tokens; returns the logits [rows, vocab] of every new token when all_logits, else of the
  // last one only.
  std::vector<float> append(const std::vector<int32_t>& ids, bool all_logits, int64_t chunk);
  // Starts over at position 0, reusing the blocks.
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }

 private:
  Model& m_;
  std::vector<int32_t> table_;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

}  // namespace sieve::model
