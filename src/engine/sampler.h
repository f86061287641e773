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

// The distribution a request's next token is drawn from after every transform (min_tokens,
// logit_bias, guided mask, penalties, temperature, min-p, top-k, top-p): candidate ids (sorted by
// logit, ties to the lower id) with unnormalised weights, or the one greedy token. Speculative
// verification reads it to accept or reject draft tokens (spec/acceptance.h).
struct SamplingDist {
  bool greedy = false;
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0;
  // A draw (one uniform from rng unless greedy).
  int32_t draw(std::mt19937_64& rng) const;
};

SamplingDist sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                   std::span<const int32_t> history, int64_t num_prompt_tokens,
                                   std::span<const int32_t> stop_ids,
                                   const guided::OutputConstraint::State* constraint = nullptr);

// `token` with its log-prob and top alternatives from the raw logits (when params ask for them).
SampleResult with_logprobs(std::span<const float> logits, const SamplingParams& params, int32_t token);

// `history` is prompt + output so far (repetition penalty counts both); the output part starts at
// `num_prompt_tokens`. `stop_ids` are masked while fewer than min_tokens were generated.
// `constraint`: guided decoding's state (tokens it forbids are masked after min_tokens and
// logit_bias; when it forbids everything, it is ignored for this token).
SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int32_t> history, int64_t num_prompt_tokens,
                          std::span<const int32_t> stop_ids, std::mt19937_64& rng,
                          const guided::OutputConstraint::State* constraint = nullptr);

// A row that nothing transforms: no guided constraint, logit_bias, penalties, active min_tokens
// (num_out output tokens so far, stop ids to mask), and greedy or without top-k, top-p and min-p.
// Such rows are drawn by the sample op's rule (kernels/ops.h, Greedy or Draw), on the host
// (sample_token) or on the device (the runner), with the same result; they are most rows of a
// benchmark, and at a 200k vocabulary the general path's copies (the row, an id list, a weight per
// id: ~3 MB) cost more than the draw.
bool plain_row(const SamplingParams& p, int64_t vocab, int64_t num_out, bool has_stop_ids, bool constrained);
// A sampled row that nothing transforms (as plain_row) with 0 < top_k < vocab, top_k <=
// ops::kMaxDeviceTopK, and any top-p and min-p (the models' generation_config defaults): the
// sample op's Filtered rule draws from it what sampling_distribution(...).draw(rng) draws, with
// the uniform that draw takes from rng.
bool filtered_row(const SamplingParams& p, int64_t vocab, int64_t num_out, bool has_stop_ids, bool constrained);
// Whether the request samples greedily (temperature 0: the argmax, ties to the lower id).
bool greedy_row(const SamplingParams& p);

// log_softmax over the whole row (natural log), in double for accuracy.
std::vector<float> log_softmax(std::span<const float> logits);

// The k most likely tokens of a row of log-probs, most likely first (ties: lower id).
std::vector<TokenLogprob> top_logprobs(std::span<const float> lp, int k);

// A prompt token's log-prob from the logits of the position before it, with k alternatives.
PromptTokenLogprob prompt_token_logprob(std::span<const float> logits, int32_t token, int k);

}  // namespace sieve::engine
