// Speculative decoding in the engine: the per-request verification of draft tokens against the
// target's logits rows (spec/acceptance.h's rule on the request's own sampling distribution), and
// the controller that decides how many draft tokens a step carries (none when speculation does
// not pay). Proposals come from spec/ (n-gram lookup, the EAGLE3 draft through the runner).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "spec/config.h"

namespace sieve::engine {

// What one request's step produced: its new tokens in order (1 to K + 1) and how many of the
// step's draft tokens were kept.
struct Verified {
  std::vector<SampleResult> tokens;
  int accepted = 0;
};

// Whether emitting `token` as output token number n_out ends request r, and why: Stop for EOS or
// a stop id once min_tokens are out and for guided decoding that is complete, Length for
// max_tokens or the length limit; None while it goes on. `total` counts the request's tokens
// with it.
FinishReason ending(const Request& r, int32_t token, int64_t n_out, int64_t total);

// Samples the request's next token from row(0) when `draft` is empty; otherwise checks each draft
// token in turn: row(i) is the target's logits after the request's tokens and draft[0..i).
// Greedy requests keep a draft token while it is the target's argmax. A sampled request draws
// its token at row i as without speculation (one uniform a row) and keeps draft token d when the
// draw is d: for a deterministic proposer that is the rejection rule exactly (d is kept with
// probability p(d), and a rejected draft's replacement is distributed as p without d,
// normalised), so the tokens are distributed as without speculation. Stops at the first
// rejection (its correction is the last token) or at a token that ends the request; after K kept
// drafts, one more token comes from row K. Advances r's guided state with every token it returns.
// `picked` (rows of a plain or filtered request without log-probs, engine/sampler.h): row i's
// token as the sample op chose it, -1 where the op left the row to the host (row(i) is read
// then). `drawn_from`: for a sampled request whose uniforms the op took, r's generator before
// them (row i's was its (i + 1)-th); r's generator ends as after one uniform a returned token,
// as the host's own draws leave it.
Verified verify_and_sample(Request& r, const std::function<std::span<const float>(int i)>& row, int64_t vocab,
                           std::span<const int32_t> draft, std::span<const int32_t> stop_ids,
                           std::span<const int32_t> picked = {}, const std::mt19937_64* drawn_from = nullptr);

// Counts for /metrics (vLLM's spec_decode_* names).
struct SpecStats {
  uint64_t num_drafts = 0, num_draft_tokens = 0, num_accepted_tokens = 0;
  std::vector<uint64_t> accepted_per_pos;  // [K]
};

// Chooses the number of draft tokens of each step. Speculation costs every decode step extra
// rows (and the draft's passes); it pays only when enough of them are accepted. The controller
// measures both modes on the running workload: the wall time of a decode-only step (with the
// draft's passes that made its drafts; without the passes a plain step needs none of) divided by
// the tokens each sequence gained in it, an exponential average per mode. It keeps the cheaper
// mode (the other must be `switch_margin` cheaper to take over) and re-measures the other with one
// probe step, first after `first_probe` decisions; each probe that confirms the mode doubles the
// interval (up to `max_probe_every`), a switch resets it. A probe whose step measured nothing (it
// had prompt chunks or captured a graph) stays due for up to `max_probe_tries` decisions in all;
// when none of them measured, the interval doubles as after a confirming probe.
// It also drops the draft positions whose acceptance rate fell below `min_position_rate` (they
// cost a row each and rarely pay).
class SpecController {
 public:
  SpecController(const spec::SpeculativeConfig& c);

  // Draft tokens for this step given the running batch size (0: plain decoding). `can_probe`:
  // whether a step with drafts could run now (with EAGLE3 in plain mode, only sequences whose
  // draft followed every position can draft); a probe of speculation that is due waits for one.
  int choose(int num_running, bool can_probe = true);
  // After a decode-only step for which choose() returned `k`: its wall time (with the draft's
  // passes that proposed its drafts), the sequences in it and the tokens they gained. Call it
  // before the next choose(); leave out steps that include one-off costs (a CUDA graph capture).
  void record_step(int k, double seconds, int num_seqs, int64_t tokens);
  // After each verified draft: how many of its `drafted` tokens were kept.
  void record_draft(int drafted, int accepted);

  // Whether the cheaper mode measured so far is speculation (EAGLE3's draft then follows every
  // step).
  bool speculating() const { return !plain_; }
  // In plain mode: a probe of speculation is due and waits for a sequence that can draft. Only
  // then does EAGLE3's draft follow new prompts (sequences whose draft skipped a position never
  // draft), so while speculation is off the draft runs over about one prompt a probe interval.
  bool probe_waiting() const { return plain_ && cfg_.adaptive && since_probe_ >= probe_every_; }
  // Whether EAGLE3's draft should follow the prompt chunks of the step just run.
  bool covers_prompts() const { return speculating() || probe_waiting(); }
  bool probing() const { return probe_; }  // the last choose() was a probe
  int probe_interval() const { return probe_every_; }
  double cost_spec() const { return cost_[1]; }
  double cost_plain() const { return cost_[0]; }

  static constexpr int first_probe = 8;
  static constexpr int max_probe_every = 512;
  static constexpr int max_probe_tries = 4;
  static constexpr double min_position_rate = 0.1;
  static constexpr double switch_margin = 0.03;

 private:
  spec::SpeculativeConfig cfg_;
  bool plain_ = false;  // the cheaper mode measured so far
  bool probe_ = false;
  int probe_tries_ = 0;  // probes in a row whose step measured nothing
  int since_probe_ = 0, probe_every_ = first_probe;
  double cost_[2] = {0, 0};  // seconds per token per sequence (0: not measured yet)
  std::vector<double> pos_rate_;
};

// A verification step for benchmarks (`sieve bench step`): `batch` sequences that hold `context`
// tokens, each with K + 1 new rows (its last token and K drafts) and their logits, tables on
// consecutive blocks from block 0 (blocks_needed of them, room left for the draft's positions);
// and the EAGLE3 draft's passes after it when every draft was kept. Run `verify` through
// Runner::run and then `draft` through Runner::propose (a draft set) to time both.
struct SyntheticVerification {
  StepInputs verify;
  DraftPlan draft;
  int64_t blocks_needed = 0;
};
SyntheticVerification synthetic_verification(int batch, int64_t context, int k, int block_size,
                                             int64_t vocab, uint64_t seed = 0);

}  // namespace sieve::engine
