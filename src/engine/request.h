// What a request asks for and what the engine keeps about it while it runs.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "guided/constraint.h"

namespace sieve::engine {

using RequestId = uint64_t;

// A token's log-prob and its most likely alternatives.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};
struct PromptTokenLogprob {
  int32_t token = 0;  // the prompt's token at this position
  float logprob = 0;  // given the tokens before it
  std::vector<TokenLogprob> top;
};

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // (0, 1]
  int top_k = 0;             // 0 or -1 = off
  double min_p = 0.0;        // [0, 1]
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  bool has_seed = false;
  uint64_t seed = 0;
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // Added to the logits of these token ids before the penalties and sampling (OpenAI's
  // logit_bias, each in [-100, 100]); logprobs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool logprobs = false;
  int top_logprobs = 0;  // alternatives per position, natural log
  // Log-probs of the prompt's tokens (each given the tokens before it) with this many
  // alternatives; -1: none (vLLM's prompt_logprobs; the completions API's echo with logprobs).
  // Such a request never reuses cached prefix blocks: every prompt row must be computed.
  int prompt_logprobs = -1;
  // Guided decoding (guided/constraint.h): the output must satisfy this; null: free.
  std::shared_ptr<const guided::OutputConstraint> constraint;
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

enum class RequestStatus { Waiting, Running, Finished };

// Engine-side state. Only the engine thread touches it.
struct Request {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // prompt followed by the generated tokens
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  int64_t max_total_tokens = 0;     // prompt + max_tokens, capped by max_model_len
  SamplingParams params;
  std::vector<int32_t> eos_ids;  // the model's end-of-sequence ids
  std::mt19937_64 rng;
  // prompt_logprobs: entries for prompt positions 1, 2, ... collected so far (in order).
  std::vector<PromptTokenLogprob> prompt_lp;
  std::unique_ptr<guided::OutputConstraint::State> constraint_state;  // params.constraint's, after the output so far
  RequestStatus status = RequestStatus::Waiting;
  FinishReason finish = FinishReason::None;
  int num_preemptions = 0;
  // Speculative decoding: draft tokens proposed for the next step (after the last token), checked
  // by the target in that step and cleared after it.
  std::vector<int32_t> draft;
  // EAGLE3: the draft's K/V follow the target's over positions [0, draft_covered) (-1: not
  // scheduled yet). Below num_computed_tokens the draft skipped some of its rows (plain decoding
  // stops the draft's passes), so its drafts would be poor: it drafts no more.
  int64_t draft_covered = -1;
  // EAGLE3: whether rows from position `start_pos` on keep the draft's K/V whole: it followed
  // every position before them (a recompute or a rollback starts again at or below what it
  // followed). A sequence for which this fails is stale.
  bool draft_whole_at(int64_t start_pos) const { return draft_covered < 0 || start_pos <= draft_covered; }
  // For latency metrics (seconds, steady clock).
  double arrival_s = 0, first_token_s = 0, last_token_s = 0;

  int64_t num_output_tokens() const { return int64_t(tokens.size()) - num_prompt_tokens; }
};

}  // namespace sieve::engine
