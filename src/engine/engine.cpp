#include "engine/engine.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "spec/ngram.h"

namespace sieve::engine {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// RequestStream

FinishReason RequestStream::next(std::vector<TokenOutput>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || finish_ != FinishReason::None; });
  for (auto& t : pending_) out.push_back(std::move(t));
  pending_.clear();
  return finish_;
}

void RequestStream::set_waker(std::function<void()> waker) {
  std::function<void()> now;
  {
    std::lock_guard lk(mu_);
    waker_ = std::move(waker);
    if (!pending_.empty() || finish_ != FinishReason::None) now = waker_;
  }
  if (now) now();
}

void RequestStream::push(TokenOutput t) {
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    pending_.push_back(std::move(t));
    wake = waker_;
  }
  cv_.notify_all();
  if (wake) wake();
}

void RequestStream::finish(FinishReason r, std::string error) {
  std::function<void()> wake;
  {
    std::lock_guard lk(mu_);
    if (finish_ != FinishReason::None) return;
    finish_ = r;
    error_ = std::move(error);
    wake = waker_;
  }
  cv_.notify_all();
  if (wake) wake();
}

// ---------------------------------------------------------------------------------------------
// Engine

Engine::Engine(model::Model& model, EngineConfig cfg)
    : Engine(std::make_unique<Runner>(model, cfg.runner), nullptr, cfg) {}

Engine::Engine(Runner& runner, EngineConfig cfg) : Engine(nullptr, &runner, std::move(cfg)) {}

Engine::Engine(std::unique_ptr<Runner> own, Runner* runner, EngineConfig cfg)
    : own_runner_(std::move(own)),
      runner_(runner ? *runner : *own_runner_),
      model_(runner_.model()),
      cfg_(std::move(cfg)),
      kv_(cfg_.num_blocks, model_.block_size(), cfg_.enable_prefix_caching),
      scheduler_(cfg_.scheduler, kv_),
      spec_ctl_(cfg_.speculative) {
  if (cfg_.speculative.method == spec::Method::Eagle3 && !runner_.draft())
    throw Error("--speculative-config: method eagle3 needs its draft loaded (Runner::set_draft)");
  stats_.spec_enabled = cfg_.speculative.method != spec::Method::None;
  const int64_t capacity = cfg_.num_blocks * model_.block_size();
  if (cfg_.scheduler.max_model_len > capacity)
    throw Error("--max-model-len " + std::to_string(cfg_.scheduler.max_model_len) +
                " is more than the KV cache holds (" + std::to_string(cfg_.num_blocks) +
                " blocks of " + std::to_string(model_.block_size()) + " = " +
                std::to_string(capacity) +
                " tokens); lower --max-model-len or give the cache more memory");
  stats_.num_blocks = cfg_.num_blocks;
  stats_.num_free_blocks = cfg_.num_blocks;
  stats_.block_size = model_.block_size();
}

Engine::~Engine() {
  stop();
  if (profiling_.load()) ops::set_op_observer({});  // the observer refers to this engine
}

void Engine::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lk(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Anything submitted after the loop ended still gets an answer.
  std::lock_guard lk(inbox_mu_);
  for (auto& p : inbox_) p.stream->finish(FinishReason::Abort, "the server is shutting down");
  inbox_.clear();
}

std::shared_ptr<RequestStream> Engine::submit(std::vector<int32_t> prompt,
                                              const SamplingParams& params) {
  const int64_t V = model_.vocab_size();
  const int64_t max_len = cfg_.scheduler.max_model_len;
  if (prompt.empty()) throw Error("the prompt is empty; give at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= V)
      throw Error("token id " + std::to_string(prompt[i]) + " at prompt position " +
                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  // The one place prompt limits are checked (the server maps these errors to 400): a prompt that
  // leaves no room is named as such before any max_tokens a caller derived from the room left.
  const int64_t n = int64_t(prompt.size());
  if (n >= max_len)
    throw Error("This model's maximum context length is " + std::to_string(max_len) +
                " tokens. However, your request has " + std::to_string(n) +
                " input tokens. Please reduce the length of the input.");
  if (params.max_tokens < 1)
    throw Error("max_tokens must be at least 1, got " + std::to_string(params.max_tokens));
  if (n + params.max_tokens > max_len)
    throw Error("This model's maximum context length is " + std::to_string(max_len) +
                " tokens. However, you requested " + std::to_string(n + params.max_tokens) +
                " tokens (" + std::to_string(n) + " in the messages, " +
                std::to_string(params.max_tokens) +
                " in the completion). Please reduce the length of the messages or completion.");
  for (int32_t t : params.stop_token_ids)
    if (t < 0 || t >= V)
      throw Error("stop_token_ids: " + std::to_string(t) + " is outside the vocabulary");
  for (auto [t, b] : params.logit_bias)
    if (t < 0 || t >= V)
      throw Error("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                  std::to_string(V) + ")");

  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->num_prompt_tokens = n;
  r->tokens = std::move(prompt);
  r->params = params;
  r->max_total_tokens = std::min<int64_t>(n + params.max_tokens, max_len);
  r->eos_ids = cfg_.eos_ids;
  if (params.constraint) r->constraint_state = params.constraint->start();
  if (params.has_seed) {
    r->rng.seed(params.seed);
  } else if (cfg_.seed) {
    // splitmix64 of (seed, arrival order): well-spread seeds for consecutive requests.
    uint64_t z = *cfg_.seed + 0x9e3779b97f4a7c15ull * (uint64_t(r->id) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->rng.seed(z ^ (z >> 31));
  } else {
    std::random_device rd;
    r->rng.seed((uint64_t(rd()) << 32) ^ rd() ^ r->id);
  }
  r->arrival_s = now_seconds();
  auto stream = std::make_shared<RequestStream>(r->id, n);
  if (const std::string why = runner_.broken(); !why.empty()) throw Error("the engine stopped: " + why);
  {
    std::lock_guard lk(inbox_mu_);
    if (stop_) throw Error("the server is shutting down");
    idle_ = false;
    inbox_.push_back(Pending{std::move(r), stream});
  }
  inbox_cv_.notify_all();
  return stream;
}

void Engine::abort(RequestId id, FinishReason reason) {
  {
    std::lock_guard lk(inbox_mu_);
    aborts_.push_back({id, reason});
  }
  inbox_cv_.notify_all();
}

void Engine::abort_all() {
  {
    std::lock_guard lk(inbox_mu_);
    abort_all_ = true;
  }
  inbox_cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(stats_mu_);
  return stats_;
}

bool Engine::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lk(inbox_mu_);
  return idle_cv_.wait_for(lk, timeout, [&] { return idle_; });
}

void Engine::drain_inbox() {
  std::vector<Pending> fresh;
  std::vector<std::pair<RequestId, FinishReason>> aborts;
  bool all = false;
  {
    std::lock_guard lk(inbox_mu_);
    fresh.swap(inbox_);
    aborts.swap(aborts_);
    all = abort_all_;
    abort_all_ = false;
  }
  for (auto& p : fresh) {
    Request* r = p.req.get();
    scheduler_.add(r);
    live_.emplace(r->id, std::move(p));
  }
  if (all)
    for (auto& [id, p] : live_) aborts.push_back({id, FinishReason::Abort});
  for (auto [id, reason] : aborts) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    scheduler_.abort(id);
    finish_request(it->second.req.get(), reason);
  }
  update_gauges();
}

void Engine::finish_request(Request* r, FinishReason reason, const std::string& error) {
  auto it = live_.find(r->id);
  if (it == live_.end()) return;
  if (r->status != RequestStatus::Finished) scheduler_.finish(r);
  r->finish = reason;
  const double t = now_seconds();
  {
    std::lock_guard lk(stats_mu_);
    switch (reason) {
      case FinishReason::Stop:
        ++stats_.finished_stop;
        break;
      case FinishReason::Length:
        ++stats_.finished_length;
        break;
      case FinishReason::Abort:
        ++stats_.finished_abort;
        break;
      default:
        ++stats_.finished_error;
        break;
    }
    if (reason == FinishReason::Stop || reason == FinishReason::Length)
      stats_.e2e.observe(t - r->arrival_s);
  }
  it->second.stream->finish(reason, error);
  live_.erase(it);
}

void Engine::update_gauges() {
  std::lock_guard lk(stats_mu_);
  stats_.num_running = int64_t(scheduler_.num_running());
  stats_.num_waiting = int64_t(scheduler_.num_waiting());
  stats_.num_free_blocks = kv_.num_free_blocks();
  stats_.kv_usage = kv_.usage();
  stats_.prefix_query_tokens = uint64_t(kv_.prefix_query_tokens());
  stats_.prefix_hit_tokens = uint64_t(kv_.prefix_hit_tokens());
}

void Engine::trace(const std::string& name, double t0, double t1, const std::string& args) {
  if (!profiling_.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(trace_mu_);
  // A profile nobody stops must not grow without bound: keep the first million events.
  if (trace_.size() >= 1000000) return;
  const double base = std::chrono::duration<double>(trace_t0_.time_since_epoch()).count();
  trace_.push_back(TraceEvent{name, "engine", (t0 - base) * 1e6, (t1 - t0) * 1e6, 0, args});
}

void Engine::start_profile() {
  {
    std::lock_guard lk(trace_mu_);
    trace_.clear();
    trace_t0_ = std::chrono::steady_clock::now();
    profiling_ = true;
  }
  // Op timings come from the model thread, on their own row of the trace.
  ops::set_op_observer([this](const char* op, double t0, double t1) {
    if (!profiling_.load(std::memory_order_relaxed)) return;
    std::lock_guard lk(trace_mu_);
    if (trace_.size() >= 1000000) return;
    const double base = std::chrono::duration<double>(trace_t0_.time_since_epoch()).count();
    trace_.push_back(TraceEvent{op, "op", (t0 - base) * 1e6, (t1 - t0) * 1e6, 1, {}});
  });
}

std::string Engine::stop_profile() {
  profiling_ = false;
  ops::set_op_observer({});
  std::lock_guard lk(trace_mu_);
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  os << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"sieve "
        "engine\"}}";
  for (const auto& e : trace_) {
    os << ",{\"name\":\"" << e.name << "\",\"cat\":\"" << e.cat
       << "\",\"ph\":\"X\",\"pid\":1,\"tid\":" << e.tid << ",\"ts\":" << e.ts_us
       << ",\"dur\":" << e.dur_us;
    if (!e.args_json.empty()) os << ",\"args\":" << e.args_json;
    os << "}";
  }
  os << "]}";
  trace_.clear();
  return os.str();
}

void Engine::loop() {
  while (true) {
    {
      std::unique_lock lk(inbox_mu_);
      if (!scheduler_.has_work()) {
        if (inbox_.empty() && aborts_.empty() && !abort_all_) {
          idle_ = true;
          idle_cv_.notify_all();
        }
        inbox_cv_.wait(lk,
                       [&] { return stop_ || !inbox_.empty() || !aborts_.empty() || abort_all_; });
      }
      if (stop_) break;
    }
    try {
      drain_inbox();
      if (scheduler_.has_work()) step();
    } catch (const std::exception& e) {
      // A bug must not take the server down with every request hanging: fail what is in flight.
      SIEVE_LOG(Error, "engine step failed: " << e.what());
      std::vector<Request*> left;
      for (auto& [id, p] : live_) left.push_back(p.req.get());
      for (Request* r : left) {
        scheduler_.abort(r->id);
        finish_request(r, FinishReason::Error, e.what());
      }
      update_gauges();
    }
  }
  // Shutdown: everything still in flight ends as aborted, and its blocks go back.
  drain_inbox();
  std::vector<Request*> left;
  for (auto& [id, p] : live_) left.push_back(p.req.get());
  for (Request* r : left) {
    scheduler_.abort(r->id);
    finish_request(r, FinishReason::Abort, "the server is shutting down");
  }
  update_gauges();
  std::lock_guard lk(inbox_mu_);
  idle_ = true;
  idle_cv_.notify_all();
}

void Engine::prepare_drafts(int k) {
  const spec::SpeculativeConfig& sc = cfg_.speculative;
  bool any = false;
  std::vector<Request*> decoding;
  for (Request* r : scheduler_.running()) {
    // Only a sequence whose next step is one decode token takes drafts (not one still
    // collecting prompt log-probs, whose rows are all needed).
    const bool decode = r->num_computed_tokens + 1 == int64_t(r->tokens.size()) &&
                        !(r->params.prompt_logprobs >= 0 && int64_t(r->prompt_lp.size()) + 1 < r->num_prompt_tokens);
    const int room = int(std::max<int64_t>(0, r->max_total_tokens - int64_t(r->tokens.size())));
    const int kr = decode ? std::min(k, room) : 0;
    if (kr == 0) {
      r->draft.clear();
      continue;
    }
    if (sc.method == spec::Method::Ngram) {
      spec::NgramConfig nc{kr, sc.prompt_lookup_min, sc.prompt_lookup_max};
      r->draft = spec::propose_ngram(r->tokens, nc, kr);
    } else if (int(r->draft.size()) > kr) {
      r->draft.resize(size_t(kr));
    }
    any = any || !r->draft.empty();
    decoding.push_back(r);
  }
  // n-gram: when some sequences have drafts, the others guess (the last token again) so that the
  // step keeps one shape (K + 1 rows per sequence), which CUDA graphs capture.
  if (sc.method == spec::Method::Ngram && any)
    for (Request* r : decoding) {
      const int room = int(r->max_total_tokens - int64_t(r->tokens.size()));
      while (int(r->draft.size()) < std::min(k, room)) r->draft.push_back(r->tokens.back());
    }
}

bool Engine::draft_whole(const Request& r, int64_t start_pos) const {
  if (!r.draft_whole_at(start_pos)) return false;
  if (start_pos == 0 || (r.draft_covered >= 0 && start_pos >= r.draft_covered)) return true;
  // A (re)start after a prefix-cache hit reuses the draft's K/V of the cached blocks, written by
  // whichever sequence computed them: only blocks whose every position the draft followed count.
  const std::vector<int32_t>& table = kv_.block_table(r.id);
  const int64_t bs = model_.block_size();
  for (int64_t b = 0; b * bs < start_pos; ++b)
    if (b >= int64_t(table.size()) || !draft_block_whole_[size_t(table[size_t(b)])]) return false;
  return true;
}

uint64_t Engine::propose_eagle3(const StepPlan& plan, const StepInputs& in, const std::vector<bool>& finished,
                                int K, bool follow, bool cover_prompts) {
  DraftPlan dp;
  dp.num_tokens = K;
  dp.next_tokens.assign(in.token_ids.size(), 0);
  dp.slots.assign(in.token_ids.size(), -1);
  if (draft_block_whole_.empty()) draft_block_whole_.assign(size_t(cfg_.num_blocks), 0);
  const int64_t bs = model_.block_size();
  std::vector<Request*> who;
  bool any_rows = false;
  uint64_t prompt_rows = 0;
  for (size_t si = 0; si < plan.seqs.size(); ++si) {
    const ScheduledSeq& s = plan.seqs[si];
    auto it = live_.find(s.request_id);
    if (it == live_.end()) continue;
    Request* r = it->second.req.get();
    r->draft.clear();
    // A first chunk after a prefix-cache hit counts the cached positions as followed (when the
    // draft followed them as they were computed); a recompute or a rollback rewrites from start_pos.
    int64_t& covered = r->draft_covered;
    const bool whole = draft_whole(*r, s.start_pos);
    if (whole) covered = s.start_pos;
    // Decode rows go through the draft only when asked to follow; prompt chunks also while the
    // controller wants new sequences able to draft. Rows after a gap would not make the draft's
    // K/V whole again.
    const bool decode = s.sample && int64_t(s.token_ids.size()) == 1 + s.num_draft;
    const bool rows = whole && (follow || (!decode && cover_prompts));
    const int64_t row0 = in.query_start_loc[si];
    for (int64_t t = 0; t < int64_t(s.token_ids.size()); ++t) {
      const int64_t pos = s.start_pos + t;
      if (pos >= r->num_computed_tokens) break;  // rejected drafts: rewritten before they count
      const int64_t slot = in.slot_mapping[size_t(row0 + t)];
      uint8_t& block_whole = draft_block_whole_[size_t(slot / bs)];
      // Rows of positions the target kept: the draft's K/V there; the token after each is known.
      if (rows && covered == pos && pos + 1 < int64_t(r->tokens.size())) {
        dp.next_tokens[size_t(row0 + t)] = r->tokens[size_t(pos + 1)];
        dp.slots[size_t(row0 + t)] = slot;
        covered = pos + 1;
        any_rows = true;
        prompt_rows += !decode;
        if (slot % bs == 0) block_whole = 1;  // a block's positions are written in order
      } else {
        block_whole = 0;
      }
    }
    if (K == 0 || !s.sample || finished[si] || r->status != RequestStatus::Running) continue;
    const int64_t c = r->num_computed_tokens;
    if (covered != c) continue;  // stale: the draft missed some of its positions
    // K drafts need K - 1 draft positions now and K + 1 target positions next step.
    if (c + 1 + K > r->max_total_tokens || !kv_.allocate(r->id, c + 1 + K)) continue;
    DraftPlan::Seq q;
    q.step_seq = int(si);
    q.last_row = int32_t(row0 + (c - 1 - s.start_pos));
    q.first_pos = c;
    q.block_table = kv_.block_table(r->id);
    dp.seqs.push_back(std::move(q));
    who.push_back(r);
  }
  if (!any_rows && who.empty()) return 0;  // plain decoding: the draft costs nothing
  std::vector<std::vector<int32_t>> drafts;
  runner_.propose(dp, drafts);
  for (size_t i = 0; i < who.size(); ++i) who[i]->draft = std::move(drafts[i]);
  return prompt_rows;
}

std::vector<ops::SampleRow> Engine::device_rows(const StepPlan& plan, const std::vector<int>& row_seq) {
  std::vector<ops::SampleRow> rows(row_seq.size());  // Skip: the row comes to the host
  if (!runner_.options().device_sampling) return rows;
  const int64_t V = model_.vocab_size();
  next_rng_.resize(plan.seqs.size());
  for (size_t first = 0, row = 0; first < row_seq.size(); first = row) {
    const size_t si = size_t(row_seq[first]);
    while (row < row_seq.size() && row_seq[row] == row_seq[first]) ++row;
    const ScheduledSeq& s = plan.seqs[si];
    auto it = live_.find(s.request_id);
    // Prompt log-probs need every row; log-probs and the general path need the sampled rows.
    if (!s.sample || s.all_logits || it == live_.end()) continue;
    Request& r = *it->second.req;
    const SamplingParams& p = r.params;
    const bool stops = !p.stop_token_ids.empty() || (!p.ignore_eos && !r.eos_ids.empty());
    const int64_t num_out = int64_t(r.tokens.size()) - r.num_prompt_tokens;
    const bool constrained = r.constraint_state != nullptr;
    if (p.logprobs || p.top_logprobs > 0) continue;
    const bool plain = plain_row(p, V, num_out, stops, constrained);
    if (!plain && !filtered_row(p, V, num_out, stops, constrained)) continue;
    if (greedy_row(p)) {
      // Greedy verification needs only the target's argmax of each row (spec/acceptance.h).
      for (size_t i = first; i < row; ++i) rows[i].mode = int32_t(ops::SampleMode::Greedy);
    } else {
      // The draws the host would make, one a sampled row (the last token's and each draft's, in
      // order; spec/acceptance.h: a draft is kept when the draw is it): their uniforms from the
      // request's own generator, by a copy. The generator moves on once the tokens are in, by the
      // rows they used; a row the op leaves to the host draws the same uniform there.
      next_rng_[si] = r.rng;
      std::mt19937_64 g = r.rng;
      std::uniform_real_distribution<double> uni(0.0, 1.0);
      for (size_t i = row - 1 - size_t(s.num_draft); i < row; ++i) {
        ops::SampleRow& d = rows[i];
        d.mode = int32_t(plain ? ops::SampleMode::Draw : ops::SampleMode::Filtered);
        d.inv_t = 1.0 / p.temperature;
        d.u = uni(g);
        if (!plain) {
          d.top_k = p.top_k;
          d.top_p = p.top_p;
          d.min_p = p.min_p;
        }
      }
    }
  }
  return rows;
}

void Engine::step() {
  const double t0 = now_seconds();
  const int64_t captures0 = runner_.graph_stats().captured;
  const spec::SpeculativeConfig& sc = cfg_.speculative;
  const bool eagle3 = sc.method == spec::Method::Eagle3 && runner_.draft();
  // (EAGLE3 drafts for this step were made, in the number chosen then, after the last step.)
  const int k = !sc.enabled() ? 0 : eagle3 && eagle_next_k_ >= 0 ? eagle_next_k_ : spec_ctl_.choose(int(scheduler_.num_running()));
  if (sc.enabled()) prepare_drafts(k);
  StepPlan plan = scheduler_.schedule();
  const double t1 = now_seconds();
  if (!plan.preempted.empty()) {
    std::lock_guard lk(stats_mu_);
    stats_.preemptions += plan.preempted.size();
    SIEVE_LOG(Debug,
              "preempted " << plan.preempted.size() << " request(s): out of KV cache blocks");
  }
  if (plan.empty()) {
    // Nothing fits right now (cannot happen with the admission checks); do not spin.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  std::vector<int> row_seq;
  const StepInputs in = build_step_inputs(plan, model_.block_size(), &row_seq);
  const std::vector<ops::SampleRow> sample = device_rows(plan, row_seq);
  const double t2 = now_seconds();
  try {
    runner_.run(in, sample, out_);
  } catch (const std::exception& e) {
    SIEVE_LOG(Error, "forward failed: " << e.what());
    // A broken tensor-parallel group runs no step again: every request ends now.
    const std::string fatal = runner_.broken();
    {
      std::lock_guard lk(stats_mu_);
      ++stats_.consecutive_failed_steps;
      stats_.last_step_error = e.what();
      if (!fatal.empty()) stats_.fatal_error = fatal;
    }
    if (!fatal.empty()) {
      std::vector<Request*> all;
      for (auto& [id, p] : live_) all.push_back(p.req.get());
      for (Request* r : all) finish_request(r, FinishReason::Error, e.what());
      return;
    }
    for (const auto& s : plan.seqs) {
      auto it = live_.find(s.request_id);
      if (it != live_.end()) finish_request(it->second.req.get(), FinishReason::Error, e.what());
    }
    return;
  }
  {
    std::lock_guard lk(stats_mu_);
    stats_.consecutive_failed_steps = 0;
  }
  const double t3 = now_seconds();
  const int64_t V = model_.vocab_size();
  SIEVE_CHECK(out_.tokens.size() == row_seq.size(), "model returned too few logits rows");

  std::vector<std::pair<Request*, FinishReason>> done;
  std::vector<bool> finished(plan.seqs.size(), false);
  uint64_t prompt_tokens = 0, gen_tokens = 0;
  std::vector<double> ttfts, itls;
  const double now = now_seconds();
  // 1. Prompt log-probs and what each sampled sequence needs; 2. the draws (and the checks of
  // draft tokens), one request at a time on the workers (each request has its own random stream
  // and guided state, so the result does not depend on the threads); 3. the tokens, in the
  // batch's order.
  struct Draw {
    Request* r;
    RequestStream* stream;
    size_t seq;
    size_t row;  // first sampled row: 1 + num_draft rows from here
    std::vector<int32_t> stop_ids;
    Verified res;
  };
  std::vector<Draw> draws;
  for (size_t first = 0, row = 0; first < row_seq.size(); first = row) {
    // This sequence's rows: [first, row); its sampled rows (if any) are the last.
    const size_t si = size_t(row_seq[first]);
    const ScheduledSeq& s = plan.seqs[si];
    while (row < row_seq.size() && row_seq[row] == row_seq[first]) ++row;
    auto it = live_.find(s.request_id);
    if (it == live_.end()) continue;
    Request* r = it->second.req.get();
    const SamplingParams& p = r->params;
    if (s.all_logits) {
      // Row j holds the distribution of the token after position start_pos + j.
      for (size_t j = 0; first + j < row; ++j) {
        const int64_t q = s.start_pos + int64_t(j) + 1;
        if (q >= r->num_prompt_tokens || q != int64_t(r->prompt_lp.size()) + 1) continue;
        r->prompt_lp.push_back(prompt_token_logprob(std::span<const float>(out_.row(first + j), size_t(V)),
                                                    r->tokens[size_t(q)], p.prompt_logprobs));
      }
    }
    if (!s.sample) continue;
    std::vector<int32_t> stop_ids = p.stop_token_ids;
    if (!p.ignore_eos) stop_ids.insert(stop_ids.end(), r->eos_ids.begin(), r->eos_ids.end());
    draws.push_back({r, it->second.stream.get(), si, row - 1 - size_t(s.num_draft), std::move(stop_ids), {}});
  }
  auto draw = [&](int64_t i) {
    Draw& d = draws[size_t(i)];
    const ScheduledSeq& s = plan.seqs[d.seq];
    const size_t rows = 1 + size_t(s.num_draft);
    std::span<const int32_t> drafts(s.token_ids.data() + s.token_ids.size() - size_t(s.num_draft), size_t(s.num_draft));
    // The sample op's tokens where it chose them (-1: the row's logits are on the host); a
    // sampled row's uniform came from the request's generator before the step (device_rows).
    const int32_t mode = sample[d.row].mode;
    const bool drawn = mode == int32_t(ops::SampleMode::Draw) || mode == int32_t(ops::SampleMode::Filtered);
    const auto row_of = [&](int i) { return std::span<const float>(out_.row(d.row + size_t(i)), size_t(V)); };
    d.res = verify_and_sample(*d.r, row_of, V, drafts, d.stop_ids,
                              std::span<const int32_t>(out_.tokens.data() + d.row, rows),
                              drawn ? &next_rng_[d.seq] : nullptr);
  };
  // (A draw over a small vocabulary costs less than handing it to another thread.)
  if (V >= 4096)
    workers_.run(int64_t(draws.size()), draw);
  else
    for (size_t i = 0; i < draws.size(); ++i) draw(int64_t(i));
  uint64_t n_drafts = 0, n_draft_tokens = 0, n_accepted = 0;
  std::vector<uint64_t> accepted_per_pos(size_t(std::max(sc.num_speculative_tokens, 0)), 0);
  int64_t decode_seqs = 0, decode_tokens = 0;
  for (Draw& d : draws) {
    Request* r = d.r;
    const SamplingParams& p = r->params;
    ScheduledSeq& s = plan.seqs[d.seq];
    if (s.num_draft > 0) {
      s.num_rejected = s.num_draft - d.res.accepted;
      ++n_drafts;
      n_draft_tokens += uint64_t(s.num_draft);
      n_accepted += uint64_t(d.res.accepted);
      for (int i = 0; i < d.res.accepted && i < int(accepted_per_pos.size()); ++i) ++accepted_per_pos[size_t(i)];
      spec_ctl_.record_draft(s.num_draft, d.res.accepted);
    }
    ++decode_seqs;
    decode_tokens += int64_t(d.res.tokens.size());
    // A step's tokens share its interval: each gets an equal part of the time since the last.
    const double gap = r->first_token_s == 0 ? 0 : (now - r->last_token_s) / double(d.res.tokens.size());
    for (SampleResult& res : d.res.tokens) {
      r->tokens.push_back(res.token);
      ++gen_tokens;
      if (r->first_token_s == 0) {
        r->first_token_s = now;
        ttfts.push_back(now - r->arrival_s);
        prompt_tokens += uint64_t(r->num_prompt_tokens);
      } else {
        itls.push_back(gap);
      }
      r->last_token_s = now;
      TokenOutput out{res.token, res.logprob, std::move(res.top), {}};
      // (A copy: after a preemption the recompute must still see what was collected.)
      if (p.prompt_logprobs >= 0 && r->num_output_tokens() == 1) out.prompt = r->prompt_lp;
      d.stream->push(std::move(out));
      const int64_t n_out = r->num_output_tokens();
      const FinishReason why = ending(*r, res.token, n_out, int64_t(r->tokens.size()));
      if (why == FinishReason::None) continue;
      done.push_back({r, why});
      finished[d.seq] = true;
      break;
    }
  }
  scheduler_.step_done(plan);
  const double t_own = now_seconds();
  // A step that captured a CUDA graph (a new shape) says nothing about the mode's cost.
  const bool captured = runner_.graph_stats().captured != captures0 || eagle_draft_captured_;
  if (sc.enabled()) {
    // Only steps of decodes alone measure what speculation costs (prefill chunks dwarf them).
    bool decode_only = true;
    for (const auto& s : plan.seqs) decode_only = decode_only && s.sample && int(s.token_ids.size()) == 1 + s.num_draft;
    // A step with drafts is charged the draft's passes that made them (after the step before);
    // a plain step is not charged the passes after it, which plain mode does not run.
    // (A step meant to speculate in which no sequence had drafts measured nothing about them.)
    // Recorded before the next choice, so that a probe's sample is known as the probe's.
    int step_k = 0;
    for (const auto& s : plan.seqs) step_k = std::max(step_k, s.num_draft);
    if (decode_only && !captured && (k == 0 || step_k > 0)) {
      const bool was = spec_ctl_.speculating();
      const double seconds = cfg_.spec_step_seconds
                                 ? cfg_.spec_step_seconds(k, int(decode_seqs), decode_tokens)
                                 : t_own - t0 + (k > 0 ? eagle_draft_s_ : 0.0);
      spec_ctl_.record_step(k, seconds, int(decode_seqs), decode_tokens);
      if (spec_ctl_.speculating() != was)
        SIEVE_LOG(Info, "speculation " << (was ? "off" : "on") << " at " << decode_seqs << " sequences: "
                                       << spec_ctl_.cost_spec() * 1e3 << " ms a token with drafts, "
                                       << spec_ctl_.cost_plain() * 1e3 << " without");
    }
  }
  uint64_t draft_prompt_rows = 0, probes = 0;
  if (eagle3) {
    // The draft follows the step while speculation is the mode (its K/V must cover every
    // position of a sequence that drafts). In plain mode decode steps skip its passes, and so do
    // prompt chunks except while a probe of speculation waits for a sequence that can draft:
    // plain steps then cost what they cost without a draft.
    const double t_draft = now_seconds();
    const int64_t captures1 = runner_.graph_stats().captured;
    bool fresh = false;  // some sequence could draft for the next step
    for (const auto& s : plan.seqs) {
      auto it = live_.find(s.request_id);
      if (it == live_.end()) continue;
      const Request* r = it->second.req.get();
      fresh = fresh || (r->status == RequestStatus::Running && draft_whole(*r, s.start_pos) &&
                        r->num_computed_tokens + 1 == int64_t(r->tokens.size()));
    }
    eagle_next_k_ = spec_ctl_.choose(int(scheduler_.num_running()), fresh);
    probes += spec_ctl_.probing() && eagle_next_k_ > 0;
    draft_prompt_rows = propose_eagle3(plan, in, finished, eagle_next_k_, eagle_next_k_ > 0 || spec_ctl_.speculating(),
                                       spec_ctl_.covers_prompts());
    eagle_draft_s_ = now_seconds() - t_draft;
    eagle_draft_captured_ = runner_.graph_stats().captured != captures1;
  }
  const double t4 = now_seconds();
  // Trace before finishing: a finished request's reader may stop the profile right away.
  if (profiling_.load(std::memory_order_relaxed)) {
    int64_t decodes = 0, drafts = 0;
    for (const auto& s : plan.seqs) {
      decodes += s.token_ids.size() == size_t(1 + s.num_draft) && s.sample;
      drafts += s.num_draft;
    }
    std::ostringstream args;
    args << "{\"num_seqs\":" << plan.seqs.size() << ",\"num_tokens\":" << plan.num_tokens
         << ",\"num_decodes\":" << decodes << ",\"num_draft_tokens\":" << drafts
         << ",\"num_preempted\":" << plan.preempted.size() << ",\"kv_usage\":" << kv_.usage()
         << ",\"draft_prompt_rows\":" << draft_prompt_rows;
    // EAGLE3: the drafts made after this step for the next one, and whether they are a probe.
    if (eagle3) args << ",\"next_k\":" << eagle_next_k_ << ",\"probe\":" << probes;
    args << "}";
    trace("step", t0, t4, args.str());
    trace("schedule", t0, t1);
    trace("prepare_inputs", t1, t2);
    trace("forward", t2, t3);
    trace("sample_and_update", t3, t4);
  }
  {
    std::lock_guard lk(stats_mu_);
    stats_.prompt_tokens += prompt_tokens;
    stats_.generation_tokens += gen_tokens;
    for (double v : ttfts) stats_.ttft.observe(v);
    for (double v : itls) stats_.itl.observe(v);
    ++stats_.steps;
    // The prefix-cache counters too, before any request of this step is seen to finish.
    stats_.prefix_query_tokens = uint64_t(kv_.prefix_query_tokens());
    stats_.prefix_hit_tokens = uint64_t(kv_.prefix_hit_tokens());
    stats_.spec_num_drafts += n_drafts;
    stats_.spec_draft_prompt_rows += draft_prompt_rows;
    stats_.spec_probes += probes;
    stats_.spec_num_draft_tokens += n_draft_tokens;
    stats_.spec_num_accepted_tokens += n_accepted;
    if (stats_.spec_accepted_per_pos.size() < accepted_per_pos.size())
      stats_.spec_accepted_per_pos.resize(accepted_per_pos.size(), 0);
    for (size_t i = 0; i < accepted_per_pos.size(); ++i) stats_.spec_accepted_per_pos[i] += accepted_per_pos[i];
  }
  for (auto& [r, reason] : done) finish_request(r, reason);

  update_gauges();
}

}  // namespace sieve::engine
