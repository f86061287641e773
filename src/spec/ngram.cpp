#include "spec/ngram.h"

#include <algorithm>

namespace sieve::spec {

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, const NgramConfig& c, int max_tokens) {
  const int64_t n = int64_t(tokens.size());
  const int k = std::min(max_tokens, c.num_speculative_tokens);
  if (k <= 0 || n < 2) return {};
  // Longest suffix first: a longer match predicts better. For each length, the most recent
  // earlier occurrence (scanning backwards from the position just before the suffix).
  for (int len = int(std::min<int64_t>(c.prompt_lookup_max, n - 1)); len >= c.prompt_lookup_min && len >= 1; --len) {
    const int32_t* suffix = tokens.data() + (n - len);
    for (int64_t start = n - len - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + len, tokens.data() + start)) continue;
      const int64_t from = start + len;  // the tokens that followed the earlier occurrence
      const int64_t take = std::min<int64_t>(k, n - from);
      if (take <= 0) continue;
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + take);
    }
  }
  return {};
}

}  // namespace sieve::spec
