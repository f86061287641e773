// The engine loop on the fake model: batching, chunking, preemption and prefix caching must not
// change any request's output; aborts free blocks.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <optional>
#include <random>

#include "core/error.h"
#include "fake_model.h"

namespace sieve::engine {
namespace {

using testing::engine_config;
using testing::FakeModel;
using namespace std::chrono_literals;

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  std::vector<PromptTokenLogprob> prompt_lp;  // from the first output
  FinishReason finish = FinishReason::None;
};

Result collect(RequestStream& s) {
  Result r;
  std::vector<TokenOutput> out;
  while (true) {
    FinishReason f = s.next(out, 100ms);
    if (f != FinishReason::None) {
      r.finish = f;
      break;
    }
  }
  for (auto& t : out) {
    r.tokens.push_back(t.token);
    r.logprobs.push_back(t.logprob);
    r.top.push_back(t.top);
    if (&t == &out.front()) r.prompt_lp = t.prompt;
  }
  return r;
}

struct Rig {
  int64_t num_blocks = 64;
  int block_size = 16;
  int64_t vocab = 97;
  SchedulerConfig sched{.max_num_batched_tokens = 256, .max_num_seqs = 64, .max_model_len = 256};
  bool caching = false;
  std::vector<int32_t> eos;
  std::optional<uint64_t> seed;  // EngineConfig::seed (--seed)
  bool device_sampling = true;   // RunnerOptions::device_sampling
};

std::vector<Result> run(const Rig& st, const std::vector<Job>& jobs, EngineStats* stats = nullptr) {
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  EngineConfig ec = engine_config(st.sched, st.num_blocks, st.caching, st.eos, st.seed);
  ec.runner.device_sampling = st.device_sampling;
  Engine engine(model, ec);
  engine.start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& j : jobs) streams.push_back(engine.submit(j.prompt, j.params));
  std::vector<Result> results;
  for (auto& s : streams) results.push_back(collect(*s));
  EXPECT_TRUE(engine.wait_idle(5s));
  if (stats) *stats = engine.stats();
  EXPECT_EQ(engine.stats().num_free_blocks, st.num_blocks);
  engine.stop();
  return results;
}

std::vector<Job> random_jobs(int n, int min_len, int max_len, int64_t vocab, uint64_t seed,
                             int max_tokens) {
  std::mt19937_64 rng(seed);
  std::vector<Job> jobs;
  for (int i = 0; i < n; ++i) {
    Job j;
    int len = min_len + int(rng() % uint64_t(max_len - min_len + 1));
    for (int k = 0; k < len; ++k) j.prompt.push_back(int32_t(rng() % uint64_t(vocab)));
    j.params.max_tokens = max_tokens;
    if (i % 2) {
      j.params.temperature = 0;
    } else {
      j.params.temperature = 0.8;
      j.params.top_p = 0.9;
      j.params.has_seed = true;
      j.params.seed = 1000 + uint64_t(i);
    }
    j.params.logprobs = true;
    jobs.push_back(j);
  }
  return jobs;
}

std::vector<Result> run_alone(const Rig& st, const std::vector<Job>& jobs) {
  std::vector<Result> out;
  for (const auto& j : jobs) out.push_back(run(st, {j})[0]);
  return out;
}

TEST(Engine, BatchedAndChunkedOutputsEqualSoloRuns) {
  Rig solo;
  auto jobs = random_jobs(12, 1, 70, solo.vocab, 7, 20);
  auto alone = run_alone(solo, jobs);
  Rig batched = solo;
  batched.sched.max_num_batched_tokens = 24;  // forces chunked prefill mixed with decodes
  EngineStats stats;
  auto together = run(batched, jobs, &stats);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].logprobs, alone[i].logprobs) << "request " << i;
    EXPECT_EQ(together[i].finish, FinishReason::Length);
    EXPECT_EQ(together[i].tokens.size(), 20u);
  }
  EXPECT_EQ(stats.generation_tokens, 12u * 20u);
  EXPECT_EQ(stats.finished_length, 12u);
  EXPECT_EQ(stats.ttft.count, 12u);
  EXPECT_EQ(stats.itl.count, 12u * 19u);
  // Outputs depend on the prompt: not all the same.
  EXPECT_NE(alone[0].tokens, alone[2].tokens);
}

// Over a vocabulary large enough for the draws to go to the worker threads, seeded sampled
// requests give together what they give alone.
TEST(Engine, ParallelDrawsEqualSoloRuns) {
  Rig solo;
  solo.vocab = 6000;
  auto jobs = random_jobs(10, 5, 40, solo.vocab, 5, 12);
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].params.temperature = 1.0;
    jobs[i].params.top_p = 0.9;
    jobs[i].params.has_seed = true;
    jobs[i].params.seed = 100 + i;
  }
  auto alone = run_alone(solo, jobs);
  auto together = run(solo, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].logprobs, alone[i].logprobs) << "request " << i;
  }
  EXPECT_NE(alone[0].tokens, alone[1].tokens);
}

// Runs jobs with device sampling on and off: the sample op runs only when on, and every request
// gets the same tokens, log-probs and finish either way. Returns the results with it on.
std::vector<Result> expect_device_sampling_changes_nothing(const Rig& rig, const std::vector<Job>& jobs) {
  std::atomic<int> ops_run{0};
  ops::set_op_observer([&](const char* op, double, double) { ops_run += std::string(op) == "sample"; });
  auto on = run(rig, jobs);
  const int with = ops_run.exchange(0);
  Rig off = rig;
  off.device_sampling = false;
  auto host = run(off, jobs);
  const int without = ops_run.load();
  ops::set_op_observer({});
  EXPECT_GT(with, 0);
  EXPECT_EQ(without, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(on[i].tokens, host[i].tokens) << "request " << i;
    EXPECT_EQ(on[i].logprobs, host[i].logprobs) << "request " << i;
    EXPECT_EQ(on[i].finish, host[i].finish) << "request " << i;
  }
  return on;
}

// Plain rows (greedy, or seeded draws without top-k/top-p/min-p, penalties or log-probs) and
// filtered ones (top-k with top-p, min-p) take their tokens from the sample op; the rest come to
// the host. Either way every request gets the tokens the host sampler gives it, in batches and
// chunked prefills.
TEST(Engine, DeviceSamplingGivesTheHostSamplersTokens) {
  Rig rig;
  rig.vocab = 5000;
  rig.sched.max_num_batched_tokens = 40;
  rig.eos = {7};
  auto jobs = random_jobs(14, 1, 60, rig.vocab, 11, 16);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SamplingParams& p = jobs[i].params;
    p.logprobs = i % 5 == 4;  // host rows among device rows
    p.top_p = i % 6 == 5 ? 0.8 : 1.0;
    p.temperature = i % 3 == 0 ? 0.0 : (i % 3 == 1 ? 0.7 : 1.3);
    // Filtered rows (top-k with top-p and min-p), greedy ones among them.
    if (i % 4 == 2 || i % 9 == 0) p.top_k = i % 8 == 2 ? 1 : 40;
    if (i % 8 == 6) p.min_p = 0.1;
    if (i == 13) p.top_k = ops::kMaxDeviceTopK + 1;  // above the op's limit: the host draws
    if (i % 7 == 3) p.min_tokens = 4;
    p.has_seed = true;
    p.seed = 40 + i;
  }
  const std::vector<Result> on = expect_device_sampling_changes_nothing(rig, jobs);
  EXPECT_NE(on[1].tokens, on[4].tokens);
}

// The models' generation_config defaults (temperature 1, top_p 0.95, top_k 40): every row is
// filtered, the sample op draws them all, and seeded requests get the host sampler's tokens.
TEST(Engine, DefaultConfigRequestsSampleOnTheDeviceWithTheHostsTokens) {
  Rig rig;
  rig.vocab = 7001;
  rig.sched.max_num_batched_tokens = 48;
  auto jobs = random_jobs(9, 3, 50, rig.vocab, 23, 14);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SamplingParams& p = jobs[i].params;
    p.logprobs = false;
    p.temperature = 1.0;
    p.top_p = 0.95;
    p.top_k = 40;
    p.has_seed = true;
    p.seed = 900 + i;
  }
  const std::vector<Result> on = expect_device_sampling_changes_nothing(rig, jobs);
  EXPECT_NE(on[0].tokens, on[1].tokens);
}

TEST(Engine, CacheExhaustionPreemptsAndResumesWithTheSameOutput) {
  Rig solo;
  solo.num_blocks = 12;  // 192 token slots
  solo.sched.max_model_len = 160;
  auto jobs = random_jobs(8, 60, 100, solo.vocab, 11, 40);
  auto alone = run_alone(solo, jobs);
  EngineStats stats;
  auto together = run(solo, jobs, &stats);
  EXPECT_GT(stats.preemptions, 0u);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
}

bool same_prompt_lp(const std::vector<PromptTokenLogprob>& a, const std::vector<PromptTokenLogprob>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].token != b[i].token || a[i].logprob != b[i].logprob || a[i].top.size() != b[i].top.size()) return false;
    for (size_t j = 0; j < a[i].top.size(); ++j)
      if (a[i].top[j].token != b[i].top[j].token || a[i].top[j].logprob != b[i].top[j].logprob) return false;
  }
  return true;
}

TEST(Engine, PromptLogprobsAreEachPositionsDistributionInEveryBatchShape) {
  Rig solo;
  auto jobs = random_jobs(6, 30, 70, solo.vocab, 21, 3);
  for (auto& j : jobs) j.params.prompt_logprobs = 3;
  jobs[1].params.prompt_logprobs = 0;
  auto alone = run_alone(solo, jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& lp = alone[i].prompt_lp;
    ASSERT_EQ(lp.size(), jobs[i].prompt.size() - 1) << "request " << i;
    for (size_t q = 1; q < jobs[i].prompt.size(); ++q) {
      EXPECT_EQ(lp[q - 1].token, jobs[i].prompt[q]);
      EXPECT_EQ(lp[q - 1].top.size(), size_t(jobs[i].params.prompt_logprobs));
    }
  }
  // Against the distribution the model gives a request that ends before position q: its first
  // token's alternatives over the whole vocabulary.
  for (size_t q : {size_t(1), size_t(17), jobs[0].prompt.size() - 1}) {
    Job prefix;
    prefix.prompt.assign(jobs[0].prompt.begin(), jobs[0].prompt.begin() + long(q));
    prefix.params.temperature = 0;
    prefix.params.max_tokens = 1;
    prefix.params.logprobs = true;
    prefix.params.top_logprobs = int(solo.vocab);
    Result r = run(solo, {prefix})[0];
    ASSERT_EQ(r.top.size(), 1u);
    float want = 0;
    for (const TokenLogprob& t : r.top[0])
      if (t.token == jobs[0].prompt[q]) want = t.logprob;
    EXPECT_EQ(alone[0].prompt_lp[q - 1].logprob, want) << "position " << q;
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(alone[0].prompt_lp[q - 1].top[size_t(k)].token, r.top[0][size_t(k)].token);
      EXPECT_EQ(alone[0].prompt_lp[q - 1].top[size_t(k)].logprob, r.top[0][size_t(k)].logprob);
    }
  }
  // Chunked prefill mixed with other requests, preemption by recompute, and prefix caching
  // (not used for these requests) give the same entries.
  Rig chunked = solo;
  chunked.sched.max_num_batched_tokens = 24;
  Rig tight = solo;
  tight.num_blocks = 12;
  tight.sched.max_model_len = 160;
  Rig caching = solo;
  caching.caching = true;
  for (const Rig* rig : {&chunked, &tight, &caching}) {
    std::vector<Job> all = jobs;
    all.insert(all.end(), jobs.begin(), jobs.end());  // each twice: a cached prefix is there
    auto together = run(*rig, all);
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_TRUE(same_prompt_lp(together[i].prompt_lp, alone[i % jobs.size()].prompt_lp)) << "request " << i;
      EXPECT_EQ(together[i].tokens, alone[i % jobs.size()].tokens) << "request " << i;
    }
  }
}

TEST(Engine, PrefixCachingReusesBlocksWithoutChangingOutputs) {
  Rig st;
  st.caching = true;
  auto jobs = random_jobs(1, 70, 70, st.vocab, 3, 10);
  jobs.push_back(jobs[0]);
  jobs[1].params = jobs[0].params;
  // Same prompt, run one after the other in the same engine.
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  Engine engine(model, engine_config(st.sched, st.num_blocks, true));
  engine.start();
  auto a = collect(*engine.submit(jobs[0].prompt, jobs[0].params));
  auto b = collect(*engine.submit(jobs[1].prompt, jobs[1].params));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 64u);  // 4 full blocks of the 70-token prompt
  Rig plain;
  EXPECT_EQ(run(plain, {jobs[0]})[0].tokens, a.tokens);
}

TEST(Engine, AbortFreesBlocksAtOnce) {
  Rig st;
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  model.delay_us = 2000;
  Engine engine(model, engine_config(st.sched, st.num_blocks));
  engine.start();
  SamplingParams p;
  p.max_tokens = 200;
  auto s = engine.submit(std::vector<int32_t>(40, 5), p);
  std::vector<TokenOutput> out;
  while (out.size() < 3) s->next(out, 100ms);
  EXPECT_LT(engine.stats().num_free_blocks, st.num_blocks);
  engine.abort(s->id());
  FinishReason f = FinishReason::None;
  while (f == FinishReason::None) f = s->next(out, 100ms);
  EXPECT_EQ(f, FinishReason::Abort);
  EXPECT_TRUE(engine.wait_idle(2s));
  auto stats = engine.stats();
  EXPECT_EQ(stats.num_free_blocks, st.num_blocks);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.finished_abort, 1u);
}

TEST(Engine, StopsOnEosAndStopIdsHonouringMinTokensAndIgnoreEos) {
  Rig st;
  st.vocab = 4;  // small vocabulary: stop ids come up quickly
  st.eos = {2};
  auto jobs = random_jobs(1, 5, 5, st.vocab, 5, 50);
  jobs[0].params.temperature = 1.0;
  jobs[0].params.has_seed = true;
  auto r = run(st, jobs)[0];
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.tokens.back(), 2);
  for (size_t i = 0; i + 1 < r.tokens.size(); ++i) EXPECT_NE(r.tokens[i], 2);

  jobs[0].params.min_tokens = 10;
  r = run(st, jobs)[0];
  EXPECT_GE(r.tokens.size(), 11u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NE(r.tokens[i], 2);

  jobs[0].params.min_tokens = 0;
  jobs[0].params.ignore_eos = true;
  r = run(st, jobs)[0];
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.tokens.size(), 50u);

  jobs[0].params.ignore_eos = false;
  jobs[0].params.stop_token_ids = {3};
  r = run(st, jobs)[0];
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_TRUE(r.tokens.back() == 2 || r.tokens.back() == 3);
}

// --seed: requests without a seed of their own sample the same tokens from a server started with
// the same seed and sent the same requests in the same order; each request draws its own stream.
TEST(Engine, ServerSeedMakesUnseededRequestsReproducible) {
  Rig st;
  std::vector<Job> jobs(4);
  for (auto& j : jobs) {
    j.prompt = {5, 6, 7};
    j.params.temperature = 1.0;
    j.params.max_tokens = 24;
  }
  auto tokens = [&](std::optional<uint64_t> seed) {
    st.seed = seed;
    std::vector<std::vector<int32_t>> out;
    for (const auto& r : run(st, jobs)) out.push_back(r.tokens);
    return out;
  };
  const auto a = tokens(7), b = tokens(7), c = tokens(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);  // same prompt, different arrival: different draws
}

// The periodic log line: throughput over the interval, current queues and cache, quiet when idle.
TEST(Engine, StatsLogLine) {
  EngineStats a, b;
  EXPECT_EQ(stats_log_line(a, b, 10.0), "");
  b.prompt_tokens = 500;
  b.generation_tokens = 120;
  b.num_running = 3;
  b.num_waiting = 1;
  b.kv_usage = 0.25;
  b.prefix_query_tokens = 400;
  b.prefix_hit_tokens = 100;
  EXPECT_EQ(stats_log_line(a, b, 10.0),
            "Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 12.0 tokens/s, Running: 3 reqs, "
            "Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 25.0%");
  a = b;
  b.num_running = 0;
  b.num_waiting = 0;
  EXPECT_EQ(stats_log_line(a, b, 10.0), "");
}

TEST(Engine, RejectsInvalidRequests) {
  Rig st;
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  Engine engine(model, engine_config(st.sched, st.num_blocks));
  SamplingParams p;
  EXPECT_THROW(engine.submit({}, p), Error);
  EXPECT_THROW(engine.submit({1, 97}, p), Error);
  EXPECT_THROW(engine.submit({-1}, p), Error);
  EXPECT_THROW(engine.submit(std::vector<int32_t>(256, 1), p), Error);
  p.max_tokens = 250;
  EXPECT_THROW(engine.submit(std::vector<int32_t>(10, 1), p), Error);
  p.max_tokens = 0;
  EXPECT_THROW(engine.submit({1}, p), Error);
  // A max_model_len beyond the cache is refused at construction.
  EXPECT_THROW(Engine(model, engine_config({.max_num_batched_tokens = 8, .max_num_seqs = 1, .max_model_len = 64 * 16 + 1},
                                     st.num_blocks)),
               Error);
}

TEST(Engine, AFailingStepFailsItsRequestsAndTheEngineGoesOn) {
  Rig st;
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  model.fail_on_token = 13;
  Engine engine(model, engine_config(st.sched, st.num_blocks));
  engine.start();
  SamplingParams p;
  p.max_tokens = 4;
  auto bad = engine.submit({1, 13, 2}, p);
  auto r = collect(*bad);
  EXPECT_EQ(r.finish, FinishReason::Error);
  EXPECT_NE(bad->error().find("injected failure"), std::string::npos);
  EXPECT_TRUE(engine.wait_idle(2s));
  EXPECT_EQ(engine.stats().num_free_blocks, st.num_blocks);
  p.temperature = 0;
  auto good = collect(*engine.submit({1, 2, 3}, p));
  EXPECT_EQ(good.finish, FinishReason::Length);
  EXPECT_EQ(good.tokens.size(), 4u);
  EXPECT_EQ(engine.stats().finished_error, 1u);
}

TEST(Engine, ProfilerWritesAChromeTrace) {
  Rig st;
  FakeModel model(st.vocab, st.block_size);
  model.allocate_caches({.num_blocks = st.num_blocks});
  Engine engine(model, engine_config(st.sched, st.num_blocks));
  engine.start();
  engine.start_profile();
  SamplingParams p;
  p.max_tokens = 3;
  collect(*engine.submit({1, 2, 3}, p));
  auto trace = nlohmann::json::parse(engine.stop_profile());
  int steps = 0, forwards = 0;
  for (auto& e : trace["traceEvents"]) {
    if (e["name"] == "step") {
      ++steps;
      EXPECT_EQ(e["ph"], "X");
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
    forwards += e["name"] == "forward";
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(forwards, 3);
}

}  // namespace
}  // namespace sieve::engine
