// Prompt-lookup (n-gram) drafts, as vLLM's `{"method": "ngram"}`: the longest suffix of the
// sequence, between prompt_lookup_min and prompt_lookup_max tokens, that also occurs earlier in
// the sequence proposes the tokens that followed its most recent earlier occurrence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sieve::spec {

struct NgramConfig {
  int num_speculative_tokens = 3;  // K: at most this many draft tokens a step
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 4;
};

// Draft tokens for a sequence whose tokens so far (prompt and output) are `tokens`; empty when no
// suffix of allowed length occurs earlier. At most `max_tokens` (<= K) tokens.
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, const NgramConfig& c, int max_tokens);

}  // namespace sieve::spec
