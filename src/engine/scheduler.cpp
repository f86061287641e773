#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace sieve::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
    default:
      return "";
  }
}

Scheduler::Scheduler(SchedulerConfig cfg, cache::KvCacheManager& kv) : cfg_(cfg), kv_(kv) {
  SIEVE_CHECK(cfg_.max_num_batched_tokens > 0 && cfg_.max_num_seqs > 0, "bad scheduler limits");
}

void Scheduler::add(Request* r) {
  SIEVE_CHECK(!r->tokens.empty(), "request without tokens");
  r->status = RequestStatus::Waiting;
  waiting_.push_back(r);
}

Request* Scheduler::find(RequestId id) const {
  for (Request* r : running_)
    if (r->id == id) return r;
  for (Request* r : waiting_)
    if (r->id == id) return r;
  return nullptr;
}

bool Scheduler::abort(RequestId id) {
  auto it = std::find_if(running_.begin(), running_.end(), [&](Request* r) { return r->id == id; });
  Request* r = nullptr;
  if (it != running_.end()) {
    r = *it;
    running_.erase(it);
  } else {
    auto w =
        std::find_if(waiting_.begin(), waiting_.end(), [&](Request* q) { return q->id == id; });
    if (w == waiting_.end()) return false;
    r = *w;
    waiting_.erase(w);
  }
  kv_.free(r->id);
  r->status = RequestStatus::Finished;
  if (r->finish == FinishReason::None) r->finish = FinishReason::Abort;
  return true;
}

void Scheduler::preempt(Request* r) {
  // Recompute, not swap: drop the cache and replay prompt + generated tokens on resumption.
  kv_.free(r->id);
  r->num_computed_tokens = 0;
  r->status = RequestStatus::Waiting;
  ++r->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(r);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = cfg_.max_num_batched_tokens;
  auto emit = [&](Request* r, int64_t n, int k = 0) {
    ScheduledSeq s;
    s.request_id = r->id;
    s.start_pos = r->num_computed_tokens;
    s.token_ids.assign(r->tokens.begin() + s.start_pos, r->tokens.begin() + s.start_pos + n);
    s.token_ids.insert(s.token_ids.end(), r->draft.begin(), r->draft.begin() + k);
    s.num_draft = k;
    n += k;
    s.block_table = kv_.block_table(r->id);
    s.sample = s.start_pos + n - k == int64_t(r->tokens.size());
    // Row j of such a step is the distribution of the token at start_pos + j + 1.
    s.all_logits = r->params.prompt_logprobs >= 0 && int64_t(r->prompt_lp.size()) + 1 < r->num_prompt_tokens &&
                   s.start_pos + 1 < r->num_prompt_tokens;
    plan.num_tokens += n;
    plan.seqs.push_back(std::move(s));
    budget -= n;
  };

  // 1. Running requests, oldest first.
  size_t i = 0;
  while (i < running_.size() && budget > 0) {
    Request* r = running_[i];
    int64_t n = std::min<int64_t>(int64_t(r->tokens.size()) - r->num_computed_tokens, budget);
    if (n <= 0) {  // nothing new (cannot happen for unfinished requests); keep it running
      ++i;
      continue;
    }
    // Draft tokens ride along with a decode when the budget, the length limit and free blocks
    // allow; they never cause a preemption.
    int k = 0;
    if (n == 1 && !r->draft.empty() && budget > 1) {
      k = int(std::min<int64_t>({int64_t(r->draft.size()), budget - 1,
                                  r->max_total_tokens - int64_t(r->tokens.size())}));
      k = std::max(k, 0);
      if (k > 0 && !kv_.allocate(r->id, r->num_computed_tokens + n + k)) k = 0;
    }
    bool scheduled = false;
    while (true) {
      if (kv_.allocate(r->id, r->num_computed_tokens + n + k)) {
        scheduled = true;
        break;
      }
      // Out of blocks: preempt the lowest-priority running request (the newest), which may be r.
      Request* victim = running_.back();
      running_.pop_back();
      preempt(victim);
      plan.preempted.push_back(victim->id);
      if (victim == r) break;
    }
    if (!scheduled) break;  // r was the last running request and is now waiting
    emit(r, n, k);
    ++i;
  }

  // 2. Waiting requests, first come first served, unless this step already had to preempt.
  if (plan.preempted.empty()) {
    while (!waiting_.empty() && budget > 0 && int(running_.size()) < cfg_.max_num_seqs) {
      Request* r = waiting_.front();
      cache::PrefixHit hit;
      if (r->num_computed_tokens == 0 && r->params.prompt_logprobs < 0) hit = kv_.find_prefix(r->tokens);
      const int64_t computed = hit.num_tokens;
      const int64_t n = std::min<int64_t>(int64_t(r->tokens.size()) - computed, budget);
      if (!kv_.allocate(r->id, computed + n, &hit)) break;
      waiting_.pop_front();
      r->num_computed_tokens = computed;
      r->status = RequestStatus::Running;
      running_.push_back(r);
      emit(r, n);
    }
  }
  return plan;
}

void Scheduler::step_done(const StepPlan& plan) {
  for (const ScheduledSeq& s : plan.seqs) {
    Request* r = nullptr;
    for (Request* q : running_)
      if (q->id == s.request_id) {
        r = q;
        break;
      }
    if (!r) continue;  // aborted while the step ran
    r->num_computed_tokens = s.start_pos + int64_t(s.token_ids.size()) - s.num_rejected;
    // Rejected draft tokens give their blocks back (no-op without speculation, whose tables
    // cover exactly the computed tokens after a step).
    kv_.truncate(r->id, r->num_computed_tokens);
    kv_.cache_full_blocks(r->id, r->tokens, r->num_computed_tokens);
  }
}

void Scheduler::finish(Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it != running_.end()) running_.erase(it);
  auto w = std::find(waiting_.begin(), waiting_.end(), r);
  if (w != waiting_.end()) waiting_.erase(w);
  kv_.free(r->id);
  r->status = RequestStatus::Finished;
}

}  // namespace sieve::engine
