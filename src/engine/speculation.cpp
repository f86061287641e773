#include "engine/speculation.h"

#include <algorithm>

namespace sieve::engine {

FinishReason ending(const Request& r, int32_t token, int64_t n_out, int64_t total) {
  const SamplingParams& p = r.params;
  const bool is_eos =
      !p.ignore_eos && std::find(r.eos_ids.begin(), r.eos_ids.end(), token) != r.eos_ids.end();
  const bool is_stop_id =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if ((is_eos || is_stop_id) && n_out >= p.min_tokens) return FinishReason::Stop;
  if (r.constraint_state && r.constraint_state->must_end())
    return FinishReason::Stop;  // the output is complete
  if (n_out >= p.max_tokens || total >= r.max_total_tokens) return FinishReason::Length;
  return FinishReason::None;
}

Verified verify_and_sample(Request& r, const std::function<std::span<const float>(int i)>& row_of, int64_t V,
                           std::span<const int32_t> draft, std::span<const int32_t> stop_ids,
                           std::span<const int32_t> picked, const std::mt19937_64* drawn_from) {
  Verified v;
  const SamplingParams& p = r.params;
  std::vector<int32_t> history(r.tokens.begin(), r.tokens.end());
  // The generator as it was before row i's uniform: the op's uniforms came from `drawn_from` in row
  // order, so a row left to the host draws the uniform the op would have taken.
  auto generator_at = [&](size_t i) {
    if (!drawn_from) return;
    r.rng = *drawn_from;
    std::uniform_real_distribution<double> uni(0.0, 1.0);
    for (size_t j = 0; j < i; ++j) uni(r.rng);
  };
  const int k = int(draft.size());
  for (int i = 0; i <= k; ++i) {
    if (!picked.empty() && picked[size_t(i)] >= 0) {
      const int32_t tok = picked[size_t(i)];
      const bool kept = i < k && tok == draft[size_t(i)];
      v.tokens.push_back(SampleResult{tok, 0.0f, {}});
      history.push_back(tok);
      if (!kept) break;
      ++v.accepted;
      if (ending(r, tok, int64_t(history.size()) - r.num_prompt_tokens, int64_t(history.size())) != FinishReason::None)
        break;
      continue;
    }
    generator_at(size_t(i));
    const std::span<const float> row = row_of(i).first(size_t(V));
    const SamplingDist dist = sampling_distribution(row, p, history, r.num_prompt_tokens, stop_ids,
                                                    r.constraint_state.get());
    // Greedy: the argmax; sampled: the draw plain sampling makes, which keeps draft token d when
    // it is d (see above).
    const int32_t tok = dist.draw(r.rng);
    const bool kept = i < k && tok == draft[size_t(i)];
    v.tokens.push_back(with_logprobs(row, p, tok));
    if (r.constraint_state) r.constraint_state->accept(tok);
    history.push_back(tok);
    if (!kept) break;
    ++v.accepted;
    if (ending(r, tok, int64_t(history.size()) - r.num_prompt_tokens, int64_t(history.size())) !=
        FinishReason::None)
      break;
  }
  generator_at(v.tokens.size());
  return v;
}

// ---------------------------------------------------------------------------------------------

SpecController::SpecController(const spec::SpeculativeConfig& c)
    : cfg_(c), pos_rate_(size_t(std::max(c.num_speculative_tokens, 0)), 1.0) {}

int SpecController::choose(int num_running, bool can_probe) {
  const bool unmeasured = probe_;  // record_step() did not see the last probe's step
  probe_ = false;
  const int K = cfg_.num_speculative_tokens;
  if (!cfg_.enabled() || K <= 0) return 0;
  if (cfg_.disable_by_batch_size > 0 && num_running > cfg_.disable_by_batch_size) return 0;
  if (!cfg_.adaptive) return K;
  // A probe step that measured nothing is tried again a few times: in prompt-heavy traffic many
  // steps carry a prompt chunk, and a lost probe would otherwise wait a whole interval. (Its
  // sequences were followed by the draft, so in plain mode they can still draft.)
  if (unmeasured && ++probe_tries_ < max_probe_tries) {
    since_probe_ = probe_every_ - 1;
  } else {
    // Every try measured nothing: those steps cost what the other mode costs and said nothing
    // (traffic where most steps carry a prompt chunk). The next probe waits longer, as after one
    // that confirmed the mode in use; otherwise a quarter of such a workload's steps would probe.
    if (unmeasured) probe_every_ = std::min(2 * probe_every_, max_probe_every);
    probe_tries_ = 0;
  }
  ++since_probe_;
  if (since_probe_ >= probe_every_ && (can_probe || !plain_)) {
    since_probe_ = 0;
    probe_ = true;
    return plain_ ? K : 0;  // a probe of speculation uses every position
  }
  if (plain_) return 0;
  int k = 1;
  while (k < K && pos_rate_[size_t(k)] >= min_position_rate) ++k;
  return k;
}

void SpecController::record_step(int k, double seconds, int num_seqs, int64_t tokens) {
  if (num_seqs <= 0 || tokens <= 0 || !(seconds > 0)) return;
  const double c = seconds * double(num_seqs) / double(tokens);
  double& e = cost_[k > 0 ? 1 : 0];
  // A probe's sample is the other mode's only news for a while: it weighs more.
  const double w = probe_ ? 0.3 : 0.1;
  e = e == 0 ? c : (1 - w) * e + w * c;
  // The cheaper mode wins once both were measured, by a margin over the mode in use (modes within
  // noise of each other would otherwise flip often, and each switch to plain leaves the running
  // EAGLE3 sequences unable to draft); speculation starts on.
  const bool was = plain_;
  if (cost_[0] > 0 && cost_[1] > 0)
    plain_ = plain_ ? cost_[1] > cost_[0] * (1 - switch_margin) : cost_[0] < cost_[1] * (1 - switch_margin);
  if (plain_ != was)
    probe_every_ = first_probe;
  else if (probe_)
    probe_every_ = std::min(2 * probe_every_, max_probe_every);
  probe_ = false;
  probe_tries_ = 0;
}

void SpecController::record_draft(int drafted, int accepted) {
  for (int i = 0; i < drafted && i < int(pos_rate_.size()); ++i)
    pos_rate_[size_t(i)] = 0.95 * pos_rate_[size_t(i)] + 0.05 * (i < accepted ? 1.0 : 0.0);
}

SyntheticVerification synthetic_verification(int batch, int64_t context, int k, int bs,
                                             int64_t vocab, uint64_t seed) {
  SyntheticVerification v;
  const int64_t per_seq = (context + 2 * int64_t(k) + 2 + bs - 1) / bs;
  v.blocks_needed = per_seq * batch;
  std::mt19937_64 rng(seed);
  StepInputs& in = v.verify;
  in.max_blocks_per_seq = int(per_seq);
  in.query_start_loc.push_back(0);
  for (int s = 0; s < batch; ++s) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b < per_seq; ++b) table.push_back(int32_t(s * per_seq + b));
    for (int i = 0; i <= k; ++i) {
      const int64_t pos = context + i;
      in.token_ids.push_back(int32_t(rng() % uint64_t(vocab)));
      in.positions.push_back(int32_t(pos));
      in.slot_mapping.push_back(int64_t(table[size_t(pos / bs)]) * bs + pos % bs);
      in.logits_indices.push_back(int32_t(in.token_ids.size() - 1));
    }
    in.query_start_loc.push_back(int32_t(in.token_ids.size()));
    in.seq_lens.push_back(int32_t(context + k + 1));
    in.block_tables.insert(in.block_tables.end(), table.begin(), table.end());
    DraftPlan::Seq q;
    q.step_seq = s;
    q.last_row = in.query_start_loc.back() - 1;
    q.first_pos = context + k + 1;
    q.block_table = table;
    v.draft.seqs.push_back(std::move(q));
  }
  v.draft.num_tokens = k;
  v.draft.next_tokens.assign(in.token_ids.begin() + 1, in.token_ids.end());
  v.draft.next_tokens.push_back(0);
  v.draft.slots = in.slot_mapping;
  return v;
}

}  // namespace sieve::engine
