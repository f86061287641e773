// Speculative decoding through the engine on the fake model (whose logits hash the whole sequence
// as read back through the block tables, so a wrong rollback or cache slot changes them): greedy
// output equals plain decoding for many prompts and K, sampled output keeps the distribution of
// plain sampling (chi-square on exact probabilities), and rejected drafts leave block tables and
// the prefix cache as if they had never been proposed.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/fake_model.h"
#include "engine/single_sequence.h"

namespace sieve::engine {
namespace {

using testing::FakeModel;
using namespace std::chrono_literals;

struct Out {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::None;
};

Out collect(RequestStream& s) {
  Out r;
  std::vector<TokenOutput> out;
  while ((r.finish = s.next(out, 100ms)) == FinishReason::None) {
  }
  for (auto& t : out) {
    r.tokens.push_back(t.token);
    r.logprobs.push_back(t.logprob);
  }
  return r;
}

struct Rig {
  int64_t num_blocks = 64;
  int block_size = 16;
  int64_t vocab = 11;
  SchedulerConfig sched{.max_num_batched_tokens = 256, .max_num_seqs = 64, .max_model_len = 256};
  bool caching = false;
  std::vector<int32_t> eos;
  spec::SpeculativeConfig spec;
  bool device_sampling = true;  // RunnerOptions::device_sampling
};

std::vector<Out> run(const Rig& rig,
                     const std::vector<std::pair<std::vector<int32_t>, SamplingParams>>& jobs,
                     EngineStats* stats = nullptr) {
  FakeModel model(rig.vocab, rig.block_size);
  model.allocate_caches({.num_blocks = rig.num_blocks});
  EngineConfig ec;
  ec.scheduler = rig.sched;
  ec.num_blocks = rig.num_blocks;
  ec.enable_prefix_caching = rig.caching;
  ec.eos_ids = rig.eos;
  ec.speculative = rig.spec;
  ec.runner.device_sampling = rig.device_sampling;
  Engine engine(model, ec);
  // Every request in the inbox before the loop starts: the steps (and so which drafts a token
  // budget cuts) do not depend on how submissions interleave with the loop's first steps.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& [p, sp] : jobs) streams.push_back(engine.submit(p, sp));
  engine.start();
  std::vector<Out> out;
  for (auto& s : streams) out.push_back(collect(*s));
  EXPECT_TRUE(engine.wait_idle(5s));
  EXPECT_EQ(engine.stats().num_free_blocks, rig.num_blocks)
      << "every block back after the requests";
  if (stats) *stats = engine.stats();
  engine.stop();
  return out;
}

spec::SpeculativeConfig ngram(int k, bool adaptive = false) {
  spec::SpeculativeConfig c;
  c.method = spec::Method::Ngram;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = 1;
  c.prompt_lookup_max = 3;
  c.adaptive = adaptive;
  return c;
}

// Prompts made of repeated snippets, so that n-gram lookup finds drafts and some are right.
std::vector<std::pair<std::vector<int32_t>, SamplingParams>> repetitive_jobs(int n, int64_t vocab,
                                                                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::vector<int32_t>, SamplingParams>> jobs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> snippet(size_t(2 + rng() % 4));
    for (auto& t : snippet) t = int32_t(rng() % uint64_t(vocab));
    std::vector<int32_t> p;
    const int reps = 1 + int(rng() % 6);
    for (int r = 0; r < reps; ++r) p.insert(p.end(), snippet.begin(), snippet.end());
    p.push_back(int32_t(rng() % uint64_t(vocab)));
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 1 + int64_t(rng() % 40);
    sp.logprobs = true;
    if (i % 5 == 1) sp.min_tokens = 3;
    if (i % 7 == 2) sp.stop_token_ids = {int32_t(rng() % uint64_t(vocab))};
    if (i % 4 == 3) sp.repetition_penalty = 1.2;
    jobs.push_back({p, sp});
  }
  return jobs;
}

TEST(SpecEngine, GreedyNgramEqualsPlainDecoding) {
  const auto jobs = repetitive_jobs(40, 11, 7);
  Rig plain;
  plain.eos = {3};
  const auto want = run(plain, jobs);
  for (int k : {1, 2, 4, 7}) {
    for (bool caching : {false, true}) {
      Rig r = plain;
      r.spec = ngram(k);
      r.caching = caching;
      EngineStats st;
      const auto got = run(r, jobs, &st);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << " K=" << k;
        EXPECT_EQ(got[i].logprobs, want[i].logprobs) << "request " << i << " K=" << k;
        EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i << " K=" << k;
      }
      EXPECT_GT(st.spec_num_drafts, 0u);
      EXPECT_GT(st.spec_num_accepted_tokens, 0u) << "K=" << k;
      EXPECT_LT(st.spec_num_accepted_tokens, st.spec_num_draft_tokens) << "K=" << k;
      EXPECT_EQ(st.spec_accepted_per_pos.size(), size_t(k));
      EXPECT_EQ(st.spec_accepted_per_pos[0] >= (k > 1 ? st.spec_accepted_per_pos[1] : 0), true);
    }
  }
}

// Greedy requests without log-probs verify their drafts with the sample op's argmax rows; with
// the op off (every row on the host) and without speculation the tokens are the same.
TEST(SpecEngine, GreedyDraftsVerifiedOnTheDeviceEqualPlainDecoding) {
  auto jobs = repetitive_jobs(30, 11, 9);
  for (auto& [p, sp] : jobs) sp.logprobs = false;
  Rig plain;
  plain.eos = {3};
  plain.device_sampling = false;
  const auto want = run(plain, jobs);
  for (bool device : {true, false}) {
    Rig r = plain;
    r.spec = ngram(3);
    r.device_sampling = device;
    EngineStats st;
    const auto got = run(r, jobs, &st);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << (device ? " (device)" : "");
      EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
    }
    EXPECT_GT(st.spec_num_accepted_tokens, 0u);
  }
}

// Seeded sampled requests (plain, and filtered by top-k / top-p / min-p) whose drafts are
// verified with the sample op's draws give the tokens of the host's own draws (every row on the
// host), request by request; some requests take the host's path (penalties) in the same steps.
TEST(SpecEngine, SampledDraftsVerifiedOnTheDeviceEqualTheHostsDraws) {
  auto jobs = repetitive_jobs(48, 11, 13);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SamplingParams& sp = jobs[i].second;
    sp.logprobs = false;
    sp.temperature = i % 3 == 0 ? 1.0 : 0.7;
    sp.has_seed = true;
    sp.seed = 500 + i;
    sp.max_tokens = 8 + int64_t(i % 24);
    if (i % 3 == 1) sp.top_k = 4, sp.top_p = 0.9;
    if (i % 6 == 2) sp.top_k = 6, sp.min_p = 0.05;
  }
  Rig host;
  host.eos = {3};
  host.spec = ngram(3);
  host.device_sampling = false;
  EngineStats hs;
  const auto want = run(host, jobs, &hs);
  Rig dev = host;
  dev.device_sampling = true;
  EngineStats ds;
  const auto got = run(dev, jobs, &ds);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << "request " << i;
  }
  EXPECT_GT(ds.spec_num_accepted_tokens, 0u);
  EXPECT_LT(ds.spec_num_accepted_tokens, ds.spec_num_draft_tokens);
  EXPECT_EQ(ds.spec_num_accepted_tokens, hs.spec_num_accepted_tokens);
}

TEST(SpecEngine, GreedyEqualityUnderPreemptionAndSmallBudgets) {
  const auto jobs = repetitive_jobs(24, 11, 11);
  Rig plain;
  plain.num_blocks = 12;                   // preemptions
  plain.sched.max_num_batched_tokens = 9;  // drafts cut by the budget
  plain.sched.max_model_len = 96;
  EngineStats st;
  const auto want = run(plain, jobs, &st);
  EXPECT_GT(st.preemptions, 0u);
  for (bool adaptive : {false, true}) {
    Rig r = plain;
    r.spec = ngram(3, adaptive);
    const auto got = run(r, jobs, &st);
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    std::printf("adaptive %d: %llu preemptions, %llu of %llu drafts kept\n", int(adaptive),
                (unsigned long long)st.preemptions, (unsigned long long)st.spec_num_accepted_tokens,
                (unsigned long long)st.spec_num_draft_tokens);
  }
}

// Rejected draft tokens leave no trace: the prefix cache registers the same blocks as plain
// decoding, so a follow-up request that repeats prompt + output hits the same number of tokens.
TEST(SpecEngine, RollbackLeavesThePrefixCacheAsPlainDecoding) {
  auto jobs = repetitive_jobs(6, 11, 3);
  for (auto& j : jobs)
    j.second.max_tokens = 40, j.second.stop_token_ids.clear(), j.second.min_tokens = 0;
  Rig plain;
  plain.caching = true;
  plain.block_size = 4;
  auto follow = [&](const Rig& rig) {
    FakeModel model(rig.vocab, rig.block_size);
    model.allocate_caches({.num_blocks = rig.num_blocks});
    EngineConfig ec;
    ec.scheduler = rig.sched;
    ec.num_blocks = rig.num_blocks;
    ec.enable_prefix_caching = rig.caching;
    ec.eos_ids = rig.eos;
    ec.speculative = rig.spec;
    Engine engine(model, ec);
    engine.start();
    std::vector<uint64_t> hits;
    for (const auto& [p, sp] : jobs) {
      const Out a = collect(*engine.submit(p, sp));
      std::vector<int32_t> again = p;
      again.insert(again.end(), a.tokens.begin(), a.tokens.end());
      const uint64_t before = engine.stats().prefix_hit_tokens;
      SamplingParams one = sp;
      one.max_tokens = 1;
      collect(*engine.submit(again, one));
      EXPECT_TRUE(engine.wait_idle(5s));
      hits.push_back(engine.stats().prefix_hit_tokens - before);
    }
    EXPECT_EQ(engine.stats().num_free_blocks, rig.num_blocks);
    engine.stop();
    return hits;
  };
  const auto want = follow(plain);
  Rig r = plain;
  r.spec = ngram(5);
  EXPECT_EQ(follow(r), want);
}

TEST(SpecEngine, SchedulerGivesRejectedBlocksBack) {
  cache::KvCacheManager kv(32, 4, true);
  Scheduler sched({.max_num_batched_tokens = 64, .max_num_seqs = 4, .max_model_len = 64}, kv);
  Request r;
  r.id = 1;
  r.tokens = {1, 2, 3, 4, 5, 6, 7};
  r.num_prompt_tokens = 7;
  r.max_total_tokens = 64;
  sched.add(&r);
  StepPlan p = sched.schedule();
  r.tokens.push_back(9);
  sched.step_done(p);
  ASSERT_EQ(r.num_computed_tokens, 7);
  const int64_t free_plain = kv.num_free_blocks();
  const std::vector<int32_t> table_plain = kv.block_table(1);
  r.draft = {1, 2, 3, 4, 5, 6};  // reaches into blocks 3 and 4
  p = sched.schedule();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].num_draft, 6);
  EXPECT_EQ(p.seqs[0].token_ids.size(), 7u);
  EXPECT_EQ(kv.block_table(1).size(), 4u);  // 14 tokens
  // The target kept one draft token: 9 and draft 1 are computed, the next token is 5.
  p.seqs[0].num_rejected = 5;
  r.tokens.push_back(1);
  r.tokens.push_back(5);
  sched.step_done(p);
  EXPECT_EQ(r.num_computed_tokens, 9);
  EXPECT_EQ(kv.block_table(1).size(), 3u);  // as plain decoding would have it
  EXPECT_EQ(std::vector<int32_t>(kv.block_table(1).begin(), kv.block_table(1).begin() + 2),
            table_plain);
  EXPECT_EQ(kv.num_free_blocks(), free_plain - 1);
}

// Exact probabilities of each 3-token continuation under the request's sampling transforms,
// from the fake model's logits one prefix at a time.
std::map<std::vector<int32_t>, double> exact_continuations(FakeModel& m,
                                                           const std::vector<int32_t>& prompt,
                                                           const SamplingParams& sp, int len) {
  Runner runner(m);
  SingleSequence seq(runner, {}, 64);
  std::map<std::vector<int32_t>, double> out{{{}, 1.0}};
  for (int step = 0; step < len; ++step) {
    std::map<std::vector<int32_t>, double> next;
    for (const auto& [cont, p] : out) {
      std::vector<int32_t> ids = prompt;
      ids.insert(ids.end(), cont.begin(), cont.end());
      seq.reset();
      const std::vector<float> logits = seq.append(ids, false, 64);
      const SamplingDist d = sampling_distribution(logits, sp, ids, int64_t(prompt.size()), {});
      for (size_t i = 0; i < d.ids.size(); ++i) {
        std::vector<int32_t> c = cont;
        c.push_back(d.ids[i]);
        next[c] = p * d.weights[i] / d.total;
      }
    }
    out = std::move(next);
  }
  return out;
}

// Chi-square critical value at p = 0.001 (Wilson-Hilferty).
double chi2_critical(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

TEST(SpecEngine, SampledOutputKeepsTheTargetDistribution) {
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2, 3, 1, 2};
  for (int variant = 0; variant < 2; ++variant) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.max_tokens = 3;
    sp.ignore_eos = true;
    sp.has_seed = true;
    if (variant == 1) sp.top_k = 4, sp.presence_penalty = 0.7, sp.temperature = 0.8;
    Rig r;
    r.vocab = 6;
    r.block_size = 4;
    r.num_blocks = 256;
    r.spec = ngram(3);
    std::vector<std::pair<std::vector<int32_t>, SamplingParams>> jobs;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
      sp.seed = uint64_t(1000 * variant + i);
      jobs.push_back({prompt, sp});
    }
    EngineStats st;
    const auto got = run(r, jobs, &st);
    // Drafts were checked, and kept as well as rejected.
    EXPECT_GT(st.spec_num_accepted_tokens, 200u);
    EXPECT_LT(st.spec_num_accepted_tokens + 200, st.spec_num_draft_tokens);
    std::map<std::vector<int32_t>, int64_t> seen;
    for (const auto& o : got) ++seen[o.tokens];
    FakeModel m(r.vocab, r.block_size);
    const auto want = exact_continuations(m, prompt, sp, 3);
    double x2 = 0, rest_e = 0, rest_o = 0;
    int df = -1;
    for (const auto& [c, p] : want) {
      const double e = p * n;
      const double o = seen.count(c) ? double(seen[c]) : 0.0;
      if (e < 5) {
        rest_e += e, rest_o += o;
        continue;
      }
      x2 += (o - e) * (o - e) / e, ++df;
    }
    if (rest_e > 0) x2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e, ++df;
    for (const auto& [c, o] : seen)
      EXPECT_TRUE(want.count(c)) << "a continuation the target cannot produce";
    EXPECT_LT(x2, chi2_critical(df))
        << "variant " << variant << ": chi-square " << x2 << " with " << df << " df";
  }
}

}  // namespace
}  // namespace sieve::engine
