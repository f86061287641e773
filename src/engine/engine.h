// The engine loop: one thread owns the model, the scheduler and the cache tables. Other threads
// submit and abort requests through a queue and read each request's tokens from its
// RequestStream; they detokenize on their side, so the model thread never does.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "engine/metrics.h"
#include "engine/request.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculation.h"
#include "engine/workers.h"
#include "model/model.h"

namespace sieve::engine {

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t num_blocks = 0;  // the model's caches must already hold this many blocks
  bool enable_prefix_caching = false;
  std::vector<int32_t> eos_ids;  // end-of-sequence ids (tokenizer / config)
  // --seed: a request without a seed of its own samples from a generator seeded by this and its
  // arrival order, so a server restarted with the same seed and sent the same requests in the
  // same order samples the same tokens. Unset: from std::random_device.
  std::optional<uint64_t> seed;
  // The options of the runner an engine makes for itself (the Model& constructor).
  RunnerOptions runner;
  // --speculative-config. Method eagle3 needs the runner's draft (Runner::set_draft) set.
  spec::SpeculativeConfig speculative;
  // Tests: the time the speculation controller is told a decode-only step took (k drafts, the
  // sequences, the tokens they gained) instead of the measured one. Unset: measured.
  std::function<double(int k, int num_seqs, int64_t tokens)> spec_step_seconds;
};

struct TokenOutput {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenLogprob> top;
  // On a request's first token when it asked for prompt_logprobs: prompt positions 1, 2, ...
  std::vector<PromptTokenLogprob> prompt;
};

// Tokens of one request as the engine produces them; read by one consumer thread.
class RequestStream {
 public:
  explicit RequestStream(RequestId id, int64_t num_prompt_tokens)
      : id_(id), num_prompt_tokens_(num_prompt_tokens) {}
  RequestId id() const { return id_; }
  int64_t num_prompt_tokens() const { return num_prompt_tokens_; }

  // Waits up to `timeout` for tokens or the end; appends new tokens to `out`. Returns the finish
  // reason once every token has been handed out (None while running).
  FinishReason next(std::vector<TokenOutput>& out, std::chrono::milliseconds timeout);
  const std::string& error() const { return error_; }
  // Called whenever tokens or the end arrive (on the engine thread, so it must be quick), and at
  // once when some are already waiting: a consumer of many streams need not wait on any one.
  void set_waker(std::function<void()> waker);

  // Engine side.
  void push(TokenOutput t);
  void finish(FinishReason r, std::string error = {});

 private:
  RequestId id_;
  int64_t num_prompt_tokens_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenOutput> pending_;
  FinishReason finish_ = FinishReason::None;
  std::string error_;
  std::function<void()> waker_;
};

// One profiler event (Chrome trace "X" event), microseconds since the profile started.
struct TraceEvent {
  std::string name, cat;
  double ts_us = 0, dur_us = 0;
  int tid = 0;
  std::string args_json;  // object text or empty
};

class Engine {
 public:
  // Runs its steps through `runner` (kept alive by the caller; its model's caches must hold
  // cfg.num_blocks blocks).
  Engine(Runner& runner, EngineConfig cfg);
  // Runs its steps through a runner of its own over `model` (cfg.runner's options).
  Engine(model::Model& model, EngineConfig cfg);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Aborts whatever is still in flight and joins the engine thread.
  void stop();

  // Validates and queues a request; throws Error (a user error: 400) for an empty prompt, ids
  // outside the vocabulary, or a prompt + max_tokens longer than max_model_len.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, const SamplingParams& params);
  // Frees the request's blocks at the next loop turn (within one step); no-op when done.
  // `reason` is what the metrics count: Stop when the caller matched a stop string.
  void abort(RequestId id, FinishReason reason = FinishReason::Abort);
  void abort_all();

  EngineStats stats() const;
  const EngineConfig& config() const { return cfg_; }
  int64_t max_model_len() const { return cfg_.scheduler.max_model_len; }
  int64_t vocab_size() const { return model_.vocab_size(); }
  int block_size() const { return model_.block_size(); }
  // Blocks until no request is queued or running (tests, shutdown), up to `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout);

  // Profiling of engine steps (Chrome trace). stop_profile returns the trace JSON text.
  void start_profile();
  std::string stop_profile();
  bool profiling() const { return profiling_.load(); }

 private:
  struct Pending {
    std::unique_ptr<Request> req;
    std::shared_ptr<RequestStream> stream;
  };
  void loop();
  void drain_inbox();
  void step();
  void finish_request(Request* r, FinishReason reason, const std::string& error = {});
  void update_gauges();
  // What each logits row of the step needs (row_seq: its sequence): the sample op's token on the
  // device for the rows of requests that plain_row() or filtered_row() (top-k, top-p, min-p)
  // accepts, greedy or drawn (their uniforms drawn here, drafts' rows included), the full row on
  // the host for the rest.
  std::vector<ops::SampleRow> device_rows(const StepPlan& plan, const std::vector<int>& row_seq);
  // Speculative decoding: this step's draft tokens (n-gram lookup, or the EAGLE3 draft's from the
  // step before) and, after a step, the EAGLE3 draft's proposals for the next one.
  void prepare_drafts(int k);
  // `follow`: the draft's passes cover every row, keeping the sequences that drafted so far able
  // to draft; `cover_prompts`: they cover prompt chunks (so new sequences can draft). Returns the
  // prompt rows the draft ran over.
  uint64_t propose_eagle3(const StepPlan& plan, const StepInputs& in, const std::vector<bool>& finished, int k,
                          bool follow, bool cover_prompts);
  // EAGLE3: whether rows of r from `start_pos` keep the draft's K/V whole (Request::draft_whole_at,
  // and after a prefix-cache hit, blocks whose draft K/V were written with them).
  bool draft_whole(const Request& r, int64_t start_pos) const;
  void trace(const std::string& name, double t0, double t1, const std::string& args = {});
  Engine(std::unique_ptr<Runner> own, Runner* runner, EngineConfig cfg);

  std::unique_ptr<Runner> own_runner_;  // the Model& constructor's
  Runner& runner_;
  model::Model& model_;
  EngineConfig cfg_;
  cache::KvCacheManager kv_;
  Scheduler scheduler_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<RequestId> next_id_{1};

  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Pending> inbox_;
  std::vector<std::pair<RequestId, FinishReason>> aborts_;
  bool abort_all_ = false;
  std::condition_variable idle_cv_;
  bool idle_ = true;

  // Engine-thread state.
  std::unordered_map<RequestId, Pending> live_;
  StepOutput out_;                        // the last step's tokens and host logits rows
  std::vector<std::mt19937_64> next_rng_;  // by plan sequence: the generator before the op's uniforms
  Workers workers_{Workers::default_threads()};  // a step's draws, one request each
  SpecController spec_ctl_;
  int eagle_next_k_ = -1;  // draft tokens the EAGLE3 draft made for the next step (-1: none yet)
  double eagle_draft_s_ = 0;         // the time of those proposals (the draft's passes)
  bool eagle_draft_captured_ = false;  // whether they captured a CUDA graph
  // Per block id: whether the draft's K/V there were written with the target's, every position
  // in order (a prefix-cache hit on a block the draft skipped leaves a sequence stale).
  std::vector<uint8_t> draft_block_whole_;

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  std::atomic<bool> profiling_{false};
  std::mutex trace_mu_;
  std::vector<TraceEvent> trace_;
  std::chrono::steady_clock::time_point trace_t0_;
};

double now_seconds();  // steady clock

}  // namespace sieve::engine
