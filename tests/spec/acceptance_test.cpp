// The acceptance rule keeps the target's distribution: a chi-square test over many seeded trials
// fails a wrong rule (e.g. keeping a draft with probability p instead of p/q, or drawing the
// correction from p instead of max(0, p - q)).
#include "spec/acceptance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace sieve::spec {
namespace {

std::vector<float> random_row(std::mt19937_64& rng, int v, bool sparse) {
  std::vector<float> r(static_cast<size_t>(v));
  std::gamma_distribution<float> g(0.7f, 1.0f);
  double s = 0;
  for (int i = 0; i < v; ++i) {
    r[size_t(i)] = (sparse && i % 3 == 1) ? 0.0f : g(rng) + 1e-3f;
    s += r[size_t(i)];
  }
  for (auto& x : r) x = float(x / s);
  return r;
}

// Pearson chi-square of observed counts against expected probabilities (bins with tiny
// expectation merged away by skipping them is avoided: every expectation here is >= 5).
double chi_square(const std::map<int, int64_t>& seen, const std::map<int, double>& want, int64_t n) {
  double x2 = 0;
  for (const auto& [k, p] : want) {
    const double e = p * double(n);
    const double o = seen.count(k) ? double(seen.at(k)) : 0.0;
    x2 += (o - e) * (o - e) / e;
  }
  return x2;
}

// Critical value of chi-square at p = 0.001 by the Wilson-Hilferty approximation.
double chi_critical(int dof) {
  const double z = 3.090;
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - a + z * std::sqrt(a), 3);
}

void check_rule(bool deterministic_proposer, uint64_t seed) {
  const int V = 6, K = 2;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> p, q;
  for (int i = 0; i <= K; ++i) p.push_back(random_row(rng, V, i == 1));
  for (int i = 0; i < K; ++i) q.push_back(random_row(rng, V, false));
  const Row target = [&](int i) { return std::span<const float>(p[size_t(i)]); };
  const Row draft_q = [&](int i) { return std::span<const float>(q[size_t(i)]); };
  // Emitted pairs (first two tokens of the output), whose law must be p0(a) p1(b).
  std::map<int, int64_t> first, pair;
  const int64_t trials = 200000;
  for (int64_t t = 0; t < trials; ++t) {
    std::vector<int32_t> d(K);
    for (int i = 0; i < K; ++i) {
      if (deterministic_proposer)
        d[size_t(i)] = int32_t((t + 3 * i) % V);  // any fixed guess, unrelated to p
      else
        d[size_t(i)] = draw(q[size_t(i)], rng);
    }
    const Verdict v = verify_drafts(d, target, deterministic_proposer ? nullptr : &draft_q, rng);
    ASSERT_GE(v.accepted, 0);
    ASSERT_LE(v.accepted, K);
    std::vector<int32_t> out(d.begin(), d.begin() + v.accepted);
    out.push_back(v.next);
    if (out.size() < 2) {
      // Only the first token came out this step; the next would be drawn from p1 in the next
      // step (independent here), so complete the pair that way.
      out.push_back(draw(p[1], rng));
    }
    ++first[out[0]];
    ++pair[out[0] * V + out[1]];
  }
  std::map<int, double> want1, want2;
  for (int a = 0; a < V; ++a) {
    want1[a] = p[0][size_t(a)];
    for (int b = 0; b < V; ++b)
      if (p[0][size_t(a)] * p[1][size_t(b)] * double(trials) >= 5) want2[a * V + b] = p[0][size_t(a)] * p[1][size_t(b)];
  }
  double covered = 0;
  for (auto& [k, w] : want2) covered += w;
  int64_t n2 = 0;
  for (auto& [k, c] : pair)
    if (want2.count(k)) n2 += c;
  for (auto& [k, w] : want2) w /= covered;
  EXPECT_LT(chi_square(first, want1, trials), chi_critical(V - 1)) << "first token";
  EXPECT_LT(chi_square(pair, want2, n2), chi_critical(int(want2.size()) - 1)) << "token pairs";
  // Tokens the target gives no mass never come out.
  for (int b = 0; b < V; ++b) {
    if (p[1][size_t(b)] != 0) continue;
    for (int a = 0; a < V; ++a) EXPECT_EQ(pair.count(a * V + b), 0u);
  }
}

TEST(Acceptance, RejectionSamplingKeepsTheTargetDistribution) { check_rule(false, 11); }
TEST(Acceptance, DeterministicDraftsKeepTheTargetDistribution) { check_rule(true, 12); }

TEST(Acceptance, ADraftEqualToTheTargetIsAlwaysKept) {
  std::mt19937_64 rng(3);
  std::vector<float> p = random_row(rng, 5, false);
  const Row target = [&](int) { return std::span<const float>(p); };
  int kept = 0;
  for (int t = 0; t < 2000; ++t) {
    std::vector<int32_t> d = {draw(p, rng), draw(p, rng), draw(p, rng)};
    kept += verify_drafts(d, target, &target, rng).accepted;
  }
  EXPECT_EQ(kept, 3 * 2000);
}

TEST(Acceptance, GreedyKeepsTheMatchingPrefixAndCorrectsTheFirstMismatch) {
  const std::vector<int32_t> argmax = {4, 7, 1, 9};
  const auto t = [&](int i) { return argmax[size_t(i)]; };
  Verdict v = verify_greedy(std::vector<int32_t>{4, 7, 2}, t);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 1);
  v = verify_greedy(std::vector<int32_t>{4, 7, 1}, t);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 9);
  v = verify_greedy(std::vector<int32_t>{5}, t);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 4);
  v = verify_greedy(std::vector<int32_t>{}, t);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 4);
}

}  // namespace
}  // namespace sieve::spec
