// The acceptance rule of speculative decoding (Leviathan et al. 2023, Chen et al. 2023; what
// vLLM's rejection sampler implements): K draft tokens are checked against the target model's
// distributions at the K draft positions, and one more token always comes out, so a step emits
// between 1 and K + 1 tokens, distributed exactly as K + 1 steps of plain sampling would be.
//
// Rows are probability distributions over the vocabulary after the request's own sampling
// transforms (temperature, top-k, top-p, min-p, penalties, logit bias, guided masks).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>

namespace sieve::spec {

struct Verdict {
  int accepted = 0;  // draft tokens kept, a prefix of the draft
  int32_t next = 0;  // the token after them: a correction of the first rejected draft, or a bonus
};

using Row = std::function<std::span<const float>(int i)>;

// target(i), i = 0..K: the target's distribution at draft position i (i = K: after the whole
// draft). draft_probs(i), i = 0..K-1: the proposer's distribution q_i it drew draft[i] from; null
// for a deterministic proposer (n-gram lookup), whose q_i puts all its mass on draft[i].
// Draft i is kept with probability min(1, p_i(d_i) / q_i(d_i)); the first rejected one is replaced
// by a draw from the normalised max(0, p_i - q_i); when all are kept, `next` is drawn from p_K.
Verdict verify_drafts(std::span<const int32_t> draft, const Row& target, const Row* draft_probs,
                      std::mt19937_64& rng);

// Greedy requests: target_argmax(i) is the token the target picks at position i (ties to the lower
// id, as the sampler does); drafts are kept while they equal it, and `next` is the target's token
// at the first mismatch (or after the whole draft). Exactly the tokens of non-speculative greedy
// decoding.
Verdict verify_greedy(std::span<const int32_t> draft, const std::function<int32_t(int i)>& target_argmax);

// A draw from a probability row (its mass need not sum exactly to 1; zero rows are refused).
int32_t draw(std::span<const float> probs, std::mt19937_64& rng);

}  // namespace sieve::spec
