// One sequence through the runner and the model's paged path, for the commands that run a single
// prompt (generate, eval perplexity). Its block table holds the physical blocks in reverse order,
// so logical and physical ids differ as they do when serving.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runner.h"
#include "model/model.h"

namespace sieve::engine {

class SingleSequence {
 public:
  // Allocates the model's caches for `capacity` tokens with `opts` (num_blocks is set here).
  SingleSequence(Runner& r, model::CacheOptions opts, int64_t capacity);

  // Appends `ids` at positions [length(), length() + ids.size()) in chunks of at most `chunk`
  // tokens; returns the logits [rows, vocab] of every new token when all_logits, else of the
  // last one only.
  std::vector<float> append(const std::vector<int32_t>& ids, bool all_logits, int64_t chunk);
  // Starts over at position 0, reusing the blocks.
  void reset() { length_ = 0; }
  int64_t length() const { return length_; }

 private:
  Runner& r_;
  std::vector<int32_t> table_;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

}  // namespace sieve::engine
