// Continuous batching policy. Each step it picks the work that fits the token budget
// (max_num_batched_tokens) and the sequence limit (max_num_seqs):
//   1. running requests first, in arrival order: one token each for decodes, the next chunk for
//      a prefill that is still under way;
//   2. then waiting requests, first come first served (no skipping: a request that does not fit
//      blocks the ones behind it), each getting as much of its prompt as the budget allows
//      (chunked prefill).
// When the cache has no block for a running request, the most recently admitted running
// request is preempted: its blocks are freed and it goes back to the front of the waiting queue
// to be recomputed (prompt + tokens generated so far) later. The scheduler never touches tensors;
// it emits a StepPlan.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "engine/request.h"

namespace sieve::engine {

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 8192;
  int max_num_seqs = 256;
  int64_t max_model_len = 8192;
};

// One sequence of one step: feed token_ids at positions start_pos.. and, when `sample`, sample
// the next token from the logits of the last one.
struct ScheduledSeq {
  RequestId request_id = 0;
  std::vector<int32_t> token_ids;
  int64_t start_pos = 0;
  std::vector<int32_t> block_table;
  bool sample = false;
  // Logits of every token of the step, not only the last: set for a request that still collects
  // prompt log-probs (prompt_logprobs) when the step's tokens cover prompt positions it lacks;
  // the sampled row is then the last of them.
  bool all_logits = false;
  // Speculative decoding: the last num_draft of token_ids are draft tokens, each with a logits
  // row (the sampled rows are the last 1 + num_draft). The engine sets num_rejected (drafts the
  // target did not keep) before step_done, which then counts only the kept tokens as computed
  // and gives the blocks past them back.
  int num_draft = 0;
  int num_rejected = 0;
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int64_t num_tokens = 0;
  std::vector<RequestId> preempted;  // preempted while planning this step
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, cache::KvCacheManager& kv);

  const SchedulerConfig& config() const { return cfg_; }
  // Queues a request (its tokens, limits and params set). The scheduler keeps the pointer until
  // the request finishes or is aborted.
  void add(Request* r);
  // Removes a request wherever it is and frees its blocks at once. False if unknown.
  bool abort(RequestId id);
  StepPlan schedule();
  // After the step ran: advances computed tokens by what was scheduled. The engine appends
  // sampled tokens to the requests before calling this, and finishes requests with finish().
  void step_done(const StepPlan& plan);
  // Removes a running request that is done and frees its blocks.
  void finish(Request* r);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  Request* find(RequestId id) const;
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }

 private:
  void preempt(Request* r);

  SchedulerConfig cfg_;
  cache::KvCacheManager& kv_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  int64_t num_preemptions_ = 0;
};

}  // namespace sieve::engine
