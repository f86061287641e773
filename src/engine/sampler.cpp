#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <unordered_map>

#include "kernels/cpu/cpu_ops.h"

namespace sieve::engine {

namespace {

bool greedy(const SamplingParams& p) { return p.temperature < 1e-5; }

// The rule of the sample op (kernels/ops.h), which the runner may run on the device instead.
int32_t first_argmax(std::span<const float> x) { return cpu::first_argmax(x.data(), int64_t(x.size())); }
double token_weight(float logit, double inv_t, double mx) { return cpu::token_weight(logit, inv_t, mx); }

}  // namespace

std::vector<float> log_softmax(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, double(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(double(logits[i]) - lse);
  return out;
}

SamplingDist sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                                   std::span<const int32_t> history, int64_t num_prompt_tokens,
                                   std::span<const int32_t> stop_ids,
                                   const guided::OutputConstraint::State* constraint) {
  const int64_t V = int64_t(logits.size());
  SamplingDist dist;

  std::vector<float> x(logits.begin(), logits.end());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t num_out = int64_t(history.size()) - num_prompt_tokens;
  if (num_out < p.min_tokens)
    for (int32_t t : stop_ids)
      if (t >= 0 && t < V) x[size_t(t)] = neg_inf;
  for (auto [t, b] : p.logit_bias)
    if (t >= 0 && t < V) x[size_t(t)] += b;
  if (constraint) {
    std::vector<float> before = x;
    constraint->mask(x, stop_ids);
    if (std::none_of(x.begin(), x.end(), [&](float v) { return v > neg_inf; })) x = std::move(before);
  }

  if (p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    std::unordered_map<int32_t, int> out_counts;
    std::vector<int32_t> seen;
    for (int64_t i = 0; i < int64_t(history.size()); ++i) {
      int32_t t = history[size_t(i)];
      if (t < 0 || t >= V) continue;
      if (i >= num_prompt_tokens) ++out_counts[t];
      seen.push_back(t);
    }
    if (p.repetition_penalty != 1.0) {
      std::sort(seen.begin(), seen.end());
      seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
      const float rp = float(p.repetition_penalty);
      for (int32_t t : seen) {
        float& v = x[size_t(t)];
        v = v > 0 ? v / rp : v * rp;
      }
    }
    for (auto [t, c] : out_counts)
      x[size_t(t)] -= float(p.frequency_penalty * c + p.presence_penalty);
  }

  int32_t chosen = 0;
  if (greedy(p)) {
    chosen = first_argmax(x);
  } else {
    // Candidates sorted by logit (descending, ties to the lower id) so the filters are prefixes.
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    const double inv_t = 1.0 / p.temperature;
    auto by_logit = [&](int32_t a, int32_t b) {
      return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
    };
    auto weight = [&](int32_t t, double mx) { return token_weight(x[size_t(t)], inv_t, mx); };
    size_t keep = idx.size();
    double tail_mass = 0;  // unnormalized mass of candidates past `keep` (head-only sorting)
    double mx = -std::numeric_limits<double>::infinity();
    if (p.top_k > 0 && p.top_k < V) {
      keep = size_t(p.top_k);
      cpu::sort_candidates(x.data(), idx.data(), V, int64_t(keep));
      mx = double(x[size_t(idx[0])]) * inv_t;
    } else if (p.top_p < 1.0 || p.min_p > 0) {
      // Sorting a 200k vocabulary per token is slow. The head almost always holds the top-p mass
      // and every min-p survivor; sort only the head when it provably does.
      const size_t head = std::min<size_t>(idx.size(), 1024);
      cpu::sort_candidates(x.data(), idx.data(), V, int64_t(head));
      mx = double(x[size_t(idx[0])]) * inv_t;
      if (head < idx.size()) {
        double head_mass = 0;
        // (The tail's mass counts the min-p survivors only: top-p applies to those. The tail is
        // unordered, so min-p cuts in the head when the tail's largest weight is below min_p.)
        double tail_max = 0;
        for (size_t i = 0; i < idx.size(); ++i) {
          const double w = weight(idx[i], mx);
          if (i < head) {
            head_mass += w;
          } else {
            tail_max = std::max(tail_max, w);
            if (w >= p.min_p) tail_mass += w;
          }
        }
        const bool min_p_cuts_in_head = p.min_p > 0 && tail_max < p.min_p;
        const bool top_p_cuts_in_head =
            p.top_p < 1.0 && head_mass >= p.top_p * (head_mass + tail_mass);
        if (min_p_cuts_in_head || top_p_cuts_in_head) {
          keep = head;
          if (min_p_cuts_in_head) tail_mass = 0;
        } else {
          // The cut lies past the head (a flat distribution), and sorting all of a 200k
          // vocabulary takes ~25 ms. Keep instead the tokens whose weight reaches a threshold
          // that surely holds the cut, and sort those: every other token comes after them in
          // the full order, so the prefixes below are the same. Weights below min_p never
          // survive; the top-p threshold is read off a histogram of the log-weights (buckets of
          // 1/32 from the most likely token down), one bucket lower than where the mass reaches
          // top_p, so rounding cannot move the cut past it.
          const double lo = p.min_p > 0 ? p.min_p : 0.0;
          constexpr int kBuckets = 2048;
          constexpr double kWidth = 1.0 / 32;
          std::vector<double> bucket(kBuckets, 0.0), wt(static_cast<size_t>(V));
          double survivors = 0;
          for (int32_t t : idx) {
            const double w = wt[size_t(t)] = weight(t, mx);
            if (w <= 0 || w < lo) continue;
            survivors += w;
            const double depth = (mx - double(x[size_t(t)]) * inv_t) / kWidth;
            bucket[size_t(std::min<double>(kBuckets - 1, std::max(0.0, depth)))] += w;
          }
          double thr = lo;
          if (p.top_p < 1.0) {
            double acc = 0;
            for (int b = 0; b < kBuckets - 2; ++b) {
              acc += bucket[size_t(b)];
              if (acc >= p.top_p * survivors) {
                thr = std::max(lo, std::exp(-double(b + 2) * kWidth));
                break;
              }
            }
          }
          auto mid = std::partition(idx.begin(), idx.end(),
                                    [&](int32_t t) { return wt[size_t(t)] > 0 && wt[size_t(t)] >= thr; });
          std::sort(idx.begin(), mid, by_logit);
          keep = size_t(mid - idx.begin());
          tail_mass = 0;
          for (auto it = mid; it != idx.end(); ++it)
            if (wt[size_t(*it)] >= lo) tail_mass += wt[size_t(*it)];
        }
      }
    } else {
      for (int32_t t : idx) mx = std::max(mx, double(x[size_t(t)]) * inv_t);
    }
    // The filters (min-p, then top-p) as the sample op applies them (kernels/ops.h, Filtered).
    std::vector<double> prob(keep);
    double total = 0;
    keep = size_t(cpu::filter_candidates(x.data(), idx.data(), int64_t(keep), inv_t, mx, p.min_p, p.top_p, tail_mass,
                                         prob.data(), &total));
    idx.resize(keep);
    prob.resize(keep);
    dist.ids = std::move(idx);
    dist.weights = std::move(prob);
    dist.total = total;
    return dist;
  }
  dist.greedy = true;
  dist.ids = {chosen};
  dist.weights = {1.0};
  dist.total = 1.0;
  return dist;
}

int32_t SamplingDist::draw(std::mt19937_64& rng) const {
  if (greedy) return ids[0];
  // One uniform draw per token keeps the RNG stream independent of the vocabulary filters. (A
  // row without mass, every logit -inf or a NaN, still gives a token: draw_candidates' fallback.)
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  return cpu::draw_candidates(ids.data(), weights.data(), int64_t(ids.size()), uni(rng) * total);
}

namespace {

// No guided constraint, logit_bias, penalties or active min_tokens (num_out output tokens so far,
// stop ids to mask): the row's logits are what the model gave.
bool untransformed(const SamplingParams& p, int64_t vocab, int64_t num_out, bool has_stop_ids, bool constrained) {
  return !constrained && p.logit_bias.empty() && p.repetition_penalty == 1.0 && p.frequency_penalty == 0.0 &&
         p.presence_penalty == 0.0 && (num_out >= p.min_tokens || !has_stop_ids) && vocab > 0;
}

}  // namespace

bool plain_row(const SamplingParams& p, int64_t vocab, int64_t num_out, bool has_stop_ids, bool constrained) {
  // (A greedy row takes the argmax whatever its top-k, top-p or min-p.)
  return untransformed(p, vocab, num_out, has_stop_ids, constrained) &&
         (greedy(p) || (!(p.top_k > 0 && p.top_k < vocab) && !(p.top_p < 1.0) && !(p.min_p > 0)));
}

bool filtered_row(const SamplingParams& p, int64_t vocab, int64_t num_out, bool has_stop_ids, bool constrained) {
  return untransformed(p, vocab, num_out, has_stop_ids, constrained) && !greedy(p) && p.top_k > 0 &&
         p.top_k < vocab && p.top_k <= ops::kMaxDeviceTopK;
}

bool greedy_row(const SamplingParams& p) { return greedy(p); }

namespace {

// The same token as sampling_distribution(...).draw(rng) for a plain row, with the same
// arithmetic in the same order (so the same draw for the same RNG state), straight from the
// logits (cpu::draw_row). -1 when the row has no mass (the general path decides then); the RNG
// is then left as it was.
int32_t draw_plain(std::span<const float> logits, const SamplingParams& p, std::mt19937_64& rng) {
  if (greedy(p)) return first_argmax(logits);
  std::mt19937_64 next = rng;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(next);
  const int32_t t = cpu::draw_row(logits.data(), int64_t(logits.size()), 1.0 / p.temperature, u);
  if (t >= 0) rng = next;
  return t;
}

}  // namespace

SampleResult sample_token(std::span<const float> logits, const SamplingParams& p,
                          std::span<const int32_t> history, int64_t num_prompt_tokens,
                          std::span<const int32_t> stop_ids, std::mt19937_64& rng,
                          const guided::OutputConstraint::State* constraint) {
  if (plain_row(p, int64_t(logits.size()), int64_t(history.size()) - num_prompt_tokens, !stop_ids.empty(),
                constraint != nullptr)) {
    // (A row without mass draws nothing from the RNG here, so the general path sees it unchanged.)
    if (const int32_t t = draw_plain(logits, p, rng); t >= 0) return with_logprobs(logits, p, t);
  }
  const SamplingDist dist = sampling_distribution(logits, p, history, num_prompt_tokens, stop_ids, constraint);
  return with_logprobs(logits, p, dist.draw(rng));
}

SampleResult with_logprobs(std::span<const float> logits, const SamplingParams& p, int32_t token) {
  SampleResult res;
  res.token = token;
  if (p.logprobs || p.top_logprobs > 0) {
    const std::vector<float> raw_lp = log_softmax(logits);
    res.logprob = raw_lp[size_t(token)];
    if (p.top_logprobs > 0) res.top = top_logprobs(raw_lp, p.top_logprobs);
  }
  return res;
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> lp, int k_in) {
  const size_t k = std::min<size_t>(size_t(std::max(k_in, 0)), lp.size());
  std::vector<int32_t> idx(lp.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(), [&](int32_t a, int32_t b) {
    return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
  });
  std::vector<TokenLogprob> top;
  for (size_t i = 0; i < k; ++i) top.push_back({idx[i], lp[size_t(idx[i])]});
  return top;
}

PromptTokenLogprob prompt_token_logprob(std::span<const float> logits, int32_t token, int k) {
  const std::vector<float> lp = log_softmax(logits);
  PromptTokenLogprob e;
  e.token = token;
  e.logprob = token >= 0 && size_t(token) < lp.size() ? lp[size_t(token)] : 0.0f;
  if (k > 0) e.top = top_logprobs(lp, k);
  return e;
}

}  // namespace sieve::engine
