#include "spec/acceptance.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace sieve::spec {

namespace {
double uniform01(std::mt19937_64& rng) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }
}  // namespace

int32_t draw(std::span<const float> probs, std::mt19937_64& rng) {
  double total = 0;
  for (float p : probs) total += std::max(0.0f, p);
  SIEVE_CHECK(total > 0, "a sampling row without mass");
  const double u = uniform01(rng) * total;
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last = int32_t(i);
    if (u < acc) return last;
  }
  return last;  // rounding left u at the very top
}

Verdict verify_drafts(std::span<const int32_t> draft, const Row& target, const Row* draft_probs,
                      std::mt19937_64& rng) {
  Verdict v;
  const int k = int(draft.size());
  for (int i = 0; i < k; ++i) {
    const std::span<const float> p = target(i);
    const int32_t d = draft[size_t(i)];
    SIEVE_CHECK(d >= 0 && size_t(d) < p.size(), "draft token outside the vocabulary");
    const double pd = std::max(0.0f, p[size_t(d)]);
    const double qd = draft_probs ? std::max(0.0f, (*draft_probs)(i)[size_t(d)]) : 1.0;
    // Keep d with probability min(1, p/q); q(d) = 0 would mean the proposer could not have drawn
    // it: treat as p/q = infinity only when p(d) > 0.
    const bool keep = qd <= 0 ? pd > 0 : uniform01(rng) * qd < pd;
    if (keep) {
      ++v.accepted;
      continue;
    }
    // Residual distribution max(0, p - q), normalised by draw().
    std::vector<float> r(p.begin(), p.end());
    if (draft_probs) {
      const std::span<const float> q = (*draft_probs)(i);
      for (size_t t = 0; t < r.size(); ++t) r[t] = std::max(0.0f, r[t] - q[t]);
    } else {
      r[size_t(d)] = 0;
    }
    double mass = 0;
    for (float x : r) mass += x;
    // p <= q everywhere (p == q up to rounding): any draw from p is right; use p itself.
    v.next = mass > 0 ? draw(r, rng) : draw(p, rng);
    return v;
  }
  v.next = draw(target(k), rng);
  return v;
}

Verdict verify_greedy(std::span<const int32_t> draft, const std::function<int32_t(int i)>& target_argmax) {
  Verdict v;
  for (int i = 0; i < int(draft.size()); ++i) {
    const int32_t t = target_argmax(i);
    if (t != draft[size_t(i)]) {
      v.next = t;
      return v;
    }
    ++v.accepted;
  }
  v.next = target_argmax(int(draft.size()));
  return v;
}

}  // namespace sieve::spec
