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

Verified verify_and_sample(Request& r, std::span<const float> logits, int64_t V,
                           std::span<const int32_t> draft, std::span<const int32_t> stop_ids,
                           std::span<const int32_t> picked) {
  Verified v;
  const SamplingParams& p = r.params;
  std::vector<int32_t> history(r.tokens.begin(), r.tokens.end());
  const int k = int(draft.size());
  for (int i = 0; i <= k; ++i) {
    if (!picked.empty()) {
      // (Greedy when there are drafts: the op's argmax decides as dist.greedy below would.)
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
    const std::span<const float> row = logits.subspan(size_t(i) * size_t(V), size_t(V));
    const SamplingDist dist = sampling_distribution(row, p, history, r.num_prompt_tokens, stop_ids,
                                                    r.constraint_state.get());
    int32_t tok;
    bool kept = false;
    if (i < k) {
      const int32_t d = draft[size_t(i)];
      if (dist.greedy) {
        tok = dist.ids[0];
        kept = tok == d;
      } else {
        // Keep with probability min(1, p(d) / q(d)), q(d) = 1 (spec/acceptance.h).
        kept = std::uniform_real_distribution<double>(0.0, 1.0)(r.rng) < dist.prob(d);
        tok = kept ? d : dist.draw(r.rng, d);
      }
    } else {
      tok = dist.draw(r.rng);
    }
    v.tokens.push_back(with_logprobs(row, p, tok));
    if (r.constraint_state) r.constraint_state->accept(tok);
    history.push_back(tok);
    if (!kept) break;
    ++v.accepted;
    if (ending(r, tok, int64_t(history.size()) - r.num_prompt_tokens, int64_t(history.size())) !=
        FinishReason::None)
      break;
  }
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
