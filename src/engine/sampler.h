// Per-request sampling from one row of logits. Order (as vLLM): logprobs from the raw logits;
// min_tokens masks the stop ids; logit_bias; repetition, frequency and presence penalties; then greedy
// (temperature 0: argmax, ties to the lower id) or temperature, min-p, top-k, top-p and one draw
// from the request's own RNG, so a seeded request samples the same tokens in any batch.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"

namespace sieve::engine {

struct SampleResult {
  int32_t token = 0;
  float logprob = 0;              // of `token` under the raw distribution (when asked)
  std::vector<TokenLogprob> top;  // top_logprobs alternatives, most likely first
};

// `history` is prompt + output so far (repetition penalty counts both); the output part starts at
// `num_prompt_tokens`. `stop_ids` are masked while fewer than min_tokens were generated.
// `constraint`: guided decoding's state (tokens it forbids are masked after min_tokens and
// logit_bias; when it forbids everything, it is ignored for this token).
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int32_t> history, int64_t num_prompt_tokens,
                          std::span<const int32_t> stop_ids, std::mt19937_64& rng,
                          const guided::OutputConstraint::State* constraint = nullptr);

// log_softmax over the whole row (natural log), in double for accuracy.
std::vector<float> log_softmax(std::span<const float> logits);

// The k most likely tokens of a row of log-probs, most likely first (ties: lower id).
std::vector<TokenLogprob> top_logprobs(std::span<const float> lp, int k);

// A prompt token's log-prob from the logits of the position before it, with k alternatives.
PromptTokenLogprob prompt_token_logprob(std::span<const float> logits, int32_t token, int k);

}  // namespace sieve::engine
