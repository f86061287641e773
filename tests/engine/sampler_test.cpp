#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <map>
#include <numeric>
#include <set>

#include "kernels/cpu/cpu_ops.h"

namespace sieve::engine {
namespace {

SampleResult draw(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng,
                  std::vector<int32_t> history = {0}, int64_t num_prompt = 1,
                  std::vector<int32_t> stops = {}) {
  return sample_token(logits, p, history, num_prompt, stops, rng);
}

TEST(Sampler, GreedyTakesArgmaxWithLowerIdOnTies) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(draw({0.1f, 2.0f, -1.0f, 2.0f}, p, rng).token, 1);
  EXPECT_EQ(draw({5.0f, 2.0f}, p, rng).token, 0);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  p.repetition_penalty = 3.0;  // changes the choice, not the reported logprobs
  std::vector<float> logits = {1.0f, 2.0f, 0.5f};
  auto r = draw(logits, p, rng, {1}, 1);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5));
  EXPECT_EQ(r.token, 0);  // token 1 was in the prompt: 2.0 / 3 < 1.0
  EXPECT_NEAR(r.logprob, 1.0 - lse, 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_NEAR(r.top[0].logprob, 2.0 - lse, 1e-6);
  EXPECT_EQ(r.top[1].token, 0);
}

TEST(Sampler, LogitBiasShiftsTheChoiceNotTheLogprobs) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  p.logit_bias = {{1, -1.5f}};  // 3 - 1.5 < 2: token 2 wins
  auto r = draw(logits, p, rng);
  EXPECT_EQ(r.token, 2);
  const double lse = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(r.logprob, 2.0 - lse, 1e-6);  // raw, as vLLM reports
  p.logit_bias = {{0, 100.0f}, {2, -100.0f}};
  EXPECT_EQ(draw(logits, p, rng).token, 0);
  // Sampling: a +100 bias makes its token (nearly) certain; -100 removes one.
  SamplingParams s;
  s.logit_bias = {{2, 100.0f}};
  std::mt19937_64 a(7);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(draw(logits, s, a).token, 2);
  s.logit_bias = {{1, -100.0f}};
  int ones = 0;
  for (int i = 0; i < 2000; ++i) ones += draw(logits, s, a).token == 1;
  EXPECT_EQ(ones, 0);
  // Applied before the penalties (vLLM's order): token 1 is biased to 3 + 1 = 4, then the
  // repetition penalty of a seen token divides it: 4 / 2 = 2 < 2.5 (token 2 biased by +0.5).
  SamplingParams q;
  q.temperature = 0;
  q.repetition_penalty = 2.0;
  q.logit_bias = {{1, 1.0f}, {2, 0.5f}};
  EXPECT_EQ(draw(logits, q, rng, {1}, 1).token, 2);
}

TEST(Sampler, SeededDrawsReproduceAndFollowTheDistribution) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p;
  std::map<int, int> counts;
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 20000; ++i) {
    int ta = draw(logits, p, a).token;
    EXPECT_EQ(ta, draw(logits, p, b).token);
    ++counts[ta];
  }
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
}

TEST(Sampler, TemperatureSharpens) {
  std::vector<float> logits = {std::log(0.6f), std::log(0.4f)};
  SamplingParams p;
  p.temperature = 0.25;  // 0.6^4 : 0.4^4 = 0.835 : 0.165
  std::mt19937_64 rng(3);
  int zeros = 0;
  for (int i = 0; i < 10000; ++i) zeros += draw(logits, p, rng).token == 0;
  EXPECT_NEAR(zeros / 10000.0, 0.835, 0.02);
}

TEST(Sampler, TopKTopPMinPRestrictTheCandidates) {
  std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  std::mt19937_64 rng(5);
  SamplingParams k;
  k.top_k = 2;
  SamplingParams tp;
  tp.top_p = 0.65;  // {0.4, 0.3} reach 0.7
  SamplingParams mp;
  mp.min_p = 0.6;  // keeps p >= 0.24
  std::map<int, int> ck, cp, cm;
  for (int i = 0; i < 5000; ++i) {
    ++ck[draw(logits, k, rng).token];
    ++cp[draw(logits, tp, rng).token];
    ++cm[draw(logits, mp, rng).token];
  }
  EXPECT_EQ(ck.count(2) + ck.count(3), 0u);
  EXPECT_NEAR(ck[0] / 5000.0, 0.4 / 0.7, 0.03);
  EXPECT_EQ(cp.count(2) + cp.count(3), 0u);
  EXPECT_GT(cp[1], 1000);
  EXPECT_EQ(cm.count(2) + cm.count(3), 0u);
  EXPECT_GT(cm[1], 1000);
}

TEST(Sampler, PenaltiesFollowTheOpenAIDefinitions) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  // Output so far: token 0 twice. Frequency 0.6 * 2 + presence 0.5 = 1.7 off token 0.
  std::vector<float> logits = {3.0f, 1.5f};
  p.frequency_penalty = 0.6;
  p.presence_penalty = 0.5;
  EXPECT_EQ(draw(logits, p, rng, {1, 0, 0}, 1).token, 1);
  p.frequency_penalty = 0.2;  // 0.4 + 0.5 = 0.9 off: 2.1 > 1.5
  EXPECT_EQ(draw(logits, p, rng, {1, 0, 0}, 1).token, 0);
  // Prompt tokens count for the repetition penalty but not for frequency/presence.
  SamplingParams q;
  q.temperature = 0;
  q.frequency_penalty = 2.0;
  EXPECT_EQ(draw(logits, q, rng, {0, 0, 0}, 3).token, 0);
  q.repetition_penalty = 2.5;  // 3.0 / 2.5 = 1.2 < 1.5
  EXPECT_EQ(draw(logits, q, rng, {0, 0, 0}, 3).token, 1);
  // Negative logits are multiplied.
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 2.0;
  EXPECT_EQ(draw({-1.0f, -1.5f}, r, rng, {0}, 1).token, 1);
}

TEST(Sampler, MinTokensMasksStopIds) {
  std::mt19937_64 rng(1);
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  std::vector<float> logits = {0.0f, 5.0f, 1.0f};
  EXPECT_EQ(draw(logits, p, rng, {0, 9}, 1, {1}).token, 2);     // 1 output so far
  EXPECT_EQ(draw(logits, p, rng, {0, 9, 9}, 1, {1}).token, 1);  // 2 outputs: allowed
}

}  // namespace
}  // namespace sieve::engine

namespace sieve::engine {
namespace {

// Head-only sorting for top-p / min-p over a large vocabulary must pick what a full sort picks.
// Trials 2-5 are flat enough that the cut lies past the sorted head (the threshold path).
TEST(Sampler, LargeVocabularyTopPMatchesTheDefinition) {
  std::mt19937_64 gen(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 6; ++trial) {
    const int V = trial < 4 ? 5000 : 60000;
    std::vector<float> logits(V);
    const float scale = trial < 2 ? 6.0f : trial < 4 ? 0.3f : 3.0f;  // peaked, flat, a 200k-like spread
    for (auto& l : logits) l = nd(gen) * scale;
    SamplingParams p;
    p.top_p = trial == 5 ? 0.95 : 0.8;
    if (trial % 2) p.min_p = trial == 5 ? 1e-4 : 0.01;
    // The definition: sort everything, keep the smallest prefix with mass >= top_p.
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    double z = 0;
    for (float l : logits) z += std::exp(double(l - logits[order[0]]));
    std::vector<double> pr(V);
    for (int i = 0; i < V; ++i) pr[i] = std::exp(double(logits[order[i]] - logits[order[0]])) / z;
    size_t kept = 0;
    if (p.min_p > 0) {
      while (kept < size_t(V) && pr[kept] >= p.min_p * pr[0]) ++kept;
      double m = 0;
      for (size_t i = 0; i < kept; ++i) m += pr[i];
      for (size_t i = 0; i < kept; ++i) pr[i] /= m;
    } else {
      kept = V;
    }
    double acc = 0;
    size_t cut = 0;
    while (cut < kept) {
      acc += pr[cut++];
      if (acc >= p.top_p) break;
    }
    std::set<int> allowed(order.begin(), order.begin() + long(cut));
    std::mt19937_64 rng(trial);
    std::set<int> seen;
    for (int i = 0; i < (V > 10000 ? 200 : 3000); ++i) {
      int t = sample_token(logits, p, std::vector<int32_t>{0}, 1, {}, rng).token;
      EXPECT_TRUE(allowed.count(t)) << "trial " << trial << " token " << t;
      seen.insert(t);
    }
    if (cut > 1) {
      EXPECT_GT(seen.size(), 1u);
    }
  }
}

// The same draws as a full sort gives: the sampler's walk (one uniform draw per token over the
// kept prefix in logit order) replayed on the definition, with the same random stream, picks the
// same tokens, so the threshold path keeps exactly the definition's prefix.
TEST(Sampler, FlatLargeVocabularyDrawsMatchAFullSort) {
  std::mt19937_64 gen(21);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 4; ++trial) {
    const int V = 40000;
    std::vector<float> logits(V);
    for (auto& l : logits) l = nd(gen);
    SamplingParams p;
    p.top_p = trial % 2 ? 0.5 : 0.95;
    if (trial >= 2) p.min_p = 1e-3;
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    std::vector<double> w(V);
    for (int i = 0; i < V; ++i) w[i] = std::exp(double(logits[order[i]]) - double(logits[order[0]]));
    size_t kept = V;
    if (p.min_p > 0) {
      kept = 0;
      while (kept < size_t(V) && w[kept] >= p.min_p * w[0]) ++kept;
    }
    double norm = 0;
    for (size_t i = 0; i < kept; ++i) norm += w[i];
    double acc = 0;
    size_t cut = 0;
    while (cut < kept) {
      acc += w[cut++] / norm;
      if (acc >= p.top_p) break;
    }
    double total = 0;
    for (size_t i = 0; i < cut; ++i) total += w[i];
    std::mt19937_64 a(trial), b(trial);
    int same = 0;
    const int draws = 200;
    for (int d = 0; d < draws; ++d) {
      const int got = sample_token(logits, p, std::vector<int32_t>{0}, 1, {}, a).token;
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(b) * total;
      double run = 0;
      int want = order[0];
      for (size_t i = 0; i < cut; ++i) {
        run += w[i];
        want = order[i];
        if (u < run) break;
      }
      same += got == want;
    }
    EXPECT_GE(same, draws - 2) << "trial " << trial << ": prefix of " << cut;
  }
}

// A row nothing modifies takes a path without copies (sampler.cpp: plain_row); it must draw the
// very token the general path draws from the same RNG state, greedy and sampled, on a large
// vocabulary with masked (-inf) entries and ties.
TEST(Sampler, PlainRowsDrawWhatTheGeneralPathDraws) {
  std::mt19937_64 gen(std::random_device{}());
  const int V = 50000;
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<float> logits(static_cast<size_t>(V));
    std::normal_distribution<float> nd(0.0f, 2.0f + float(trial));
    for (auto& x : logits) x = nd(gen);
    for (int i = 0; i < 200; ++i) logits[size_t(gen() % V)] = -std::numeric_limits<float>::infinity();
    logits[size_t(gen() % V)] = 30.0f;
    logits[size_t(gen() % V)] = 30.0f;
    for (double t : {0.0, 0.3, 1.0, 1.7}) {
      SamplingParams p;
      p.temperature = t;
      p.min_tokens = 4;  // past: the stop ids are not masked, the row stays plain
      const std::vector<int32_t> history = {0, 1, 2, 3, 4, 5};
      const std::vector<int32_t> stops = {7};
      for (int d = 0; d < 40; ++d) {
        const uint64_t seed = gen();
        std::mt19937_64 a(seed), b(seed);
        const int32_t got = sample_token(logits, p, history, 1, stops, a).token;
        const int32_t want = sampling_distribution(logits, p, history, 1, stops).draw(b);
        ASSERT_EQ(got, want) << "trial " << trial << " temperature " << t;
        EXPECT_EQ(a(), b()) << "the same RNG draws";
      }
    }
  }
}

// A filtered row (filtered_row: top-k with top-p and min-p, nothing else) drawn by the sample op's
// rule (cpu::filtered_draw, what the device runs) with the uniform the host's draw takes from the
// same RNG state gives the host's token: many random rows with ties and -inf entries, k = 1 and
// k = vocab - 1, tiny top_p, min_p, temperatures far from 1.
TEST(Sampler, FilteredRowsDrawWhatTheHostDraws) {
  std::mt19937_64 gen(std::random_device{}());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int V = trial % 3 == 0 ? 200 : (trial % 3 == 1 ? 3001 : 40000);
    std::vector<float> logits(static_cast<size_t>(V));
    std::normal_distribution<float> nd(0.0f, 1.0f + float(trial % 5));
    const bool ties = trial % 4 == 1;
    for (auto& x : logits) x = ties ? float(int(gen() % 9) - 4) * 0.5f : nd(gen);
    for (int i = 0; i < V / 20; ++i) logits[size_t(gen() % uint64_t(V))] = neg_inf;
    SamplingParams p;
    const double temps[] = {1.0, 0.7, 1e-3, 30.0};
    p.temperature = temps[trial % 4];
    const int ks[] = {1, 2, 40, ops::kMaxDeviceTopK, V - 1};
    p.top_k = std::min(ks[(trial / 4) % 5], V - 1);
    const double top_ps[] = {1.0, 0.95, 1e-9, 0.6};
    p.top_p = top_ps[(trial / 3) % 4];
    p.min_p = trial % 5 == 2 ? 0.05 : (trial % 7 == 3 ? 0.9 : 0.0);
    if (!filtered_row(p, V, 0, false, false)) continue;  // (k = V - 1 above the op's limit)
    const uint64_t seed = gen();
    std::mt19937_64 host(seed), dev(seed);
    const int32_t want = sampling_distribution(logits, p, {}, 0, {}).draw(host);
    ops::SampleRow row;
    row.mode = int32_t(ops::SampleMode::Filtered);
    row.inv_t = 1.0 / p.temperature;
    row.u = std::uniform_real_distribution<double>(0.0, 1.0)(dev);
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    ASSERT_EQ(cpu::filtered_draw(logits.data(), V, row), want)
        << "trial " << trial << " V " << V << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
    // sample_token (the engine's host path) draws the same.
    std::mt19937_64 again(seed);
    EXPECT_EQ(sample_token(logits, p, {}, 0, {}, again).token, want);
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

// Greedy rows are plain whatever their filters (the argmax ignores them); sampled rows with top-k
// are filtered up to the op's limit; anything that transforms the logits is neither.
TEST(Sampler, PlainAndFilteredRows) {
  SamplingParams p;
  p.temperature = 0;
  p.top_k = 40;
  p.top_p = 0.95;
  EXPECT_TRUE(plain_row(p, 1000, 0, false, false));
  EXPECT_FALSE(filtered_row(p, 1000, 0, false, false));
  p.temperature = 1.0;
  EXPECT_FALSE(plain_row(p, 1000, 0, false, false));
  EXPECT_TRUE(filtered_row(p, 1000, 0, false, false));
  EXPECT_FALSE(filtered_row(p, 1000, 0, false, true));  // guided
  p.top_k = ops::kMaxDeviceTopK + 1;
  EXPECT_FALSE(filtered_row(p, 100000, 0, false, false));
  p.top_k = 0;  // top-p alone: the host's head path
  EXPECT_FALSE(filtered_row(p, 1000, 0, false, false));
  p.top_k = 40;
  p.min_tokens = 3;
  EXPECT_FALSE(filtered_row(p, 1000, 1, true, false));
  EXPECT_TRUE(filtered_row(p, 1000, 3, true, false));
  p.presence_penalty = 0.5;
  EXPECT_FALSE(filtered_row(p, 1000, 3, true, false));
}

// A row without mass still draws a token (and does not recurse).
TEST(Sampler, RowWithoutMassDrawsAToken) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits(10, neg_inf);
  SamplingParams p;
  p.top_k = 3;
  std::mt19937_64 rng(5);
  const int32_t t = sampling_distribution(logits, p, {}, 0, {}).draw(rng);
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 10);
}

}  // namespace
}  // namespace sieve::engine
