// The sample op's reference (ops.h): the rules the host sampler also draws with, in double, in the
// same order, so that a seeded request picks the same token from either.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_parallel.h"

namespace sieve::cpu {

int32_t first_argmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int32_t chosen = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > best) {
      best = x[i];
      chosen = int32_t(i);
    }
  return chosen;
}

double token_weight(float logit, double inv_t, double mx) {
  const double v = double(logit);
  return std::isinf(v) && v < 0 ? 0.0 : std::exp(v * inv_t - mx);
}

int32_t draw_row(const float* x, int64_t n, double inv_t, double u) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]) * inv_t);
  // (Kept per thread: a 200k vocabulary's weights are 1.6 MB, and every draw needs them.)
  thread_local std::vector<double> w;
  if (int64_t(w.size()) < n) w.resize(size_t(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += w[size_t(i)] = token_weight(x[i], inv_t, mx);
  if (!(total > 0)) return -1;
  const double target = u * total;
  double acc = 0;
  int32_t chosen = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (w[size_t(i)] <= 0) continue;
    acc += w[size_t(i)];
    chosen = int32_t(i);
    if (target < acc) break;
  }
  return chosen;
}

void sort_candidates(const float* x, int32_t* ids, int64_t n, int64_t k) {
  std::partial_sort(ids, ids + k, ids + n,
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
}

int64_t filter_candidates(const float* x, const int32_t* ids, int64_t keep, double inv_t, double mx,
                          double min_p, double top_p, double tail_mass, double* w, double* total) {
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += w[i] = token_weight(x[ids[i]], inv_t, mx);
  // min-p: drop tokens below min_p times the most likely one's probability.
  if (min_p > 0) {
    const double floor = min_p * w[0];
    int64_t k = 0;
    while (k < keep && w[k] >= floor) ++k;
    keep = std::max<int64_t>(k, 1);
    sum = std::accumulate(w, w + keep, 0.0);
  }
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (top_p < 1.0) {
    const double norm = sum + tail_mass;
    double acc = 0;
    int64_t k = 0;
    while (k < keep) {
      acc += w[k] / norm;
      ++k;
      if (acc >= top_p) break;
    }
    keep = std::max<int64_t>(k, 1);
    sum = std::accumulate(w, w + keep, 0.0);
  }
  *total = sum;
  return keep;
}

int32_t draw_candidates(const int32_t* ids, const double* w, int64_t n, double target) {
  double acc = 0;
  int32_t chosen = ids[0];
  for (int64_t i = 0; i < n; ++i) {
    if (w[i] <= 0) continue;
    acc += w[i];
    chosen = ids[i];
    if (target < acc) break;
  }
  return chosen;
}

int32_t filtered_draw(const float* x, int64_t n, const ops::SampleRow& row) {
  // (With a NaN the candidate order is not defined, with +inf no weight is; the host decides.)
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity()) return -1;
  const int64_t k = std::clamp<int64_t>(row.top_k, 1, std::min<int64_t>(ops::kMaxDeviceTopK, n));
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<double> w;
  ids.resize(size_t(n));
  std::iota(ids.begin(), ids.end(), 0);
  sort_candidates(x, ids.data(), n, k);
  w.resize(size_t(k));
  double total = 0;
  const int64_t keep = filter_candidates(x, ids.data(), k, row.inv_t, double(x[ids[0]]) * row.inv_t, row.min_p,
                                         row.top_p, 0.0, w.data(), &total);
  if (!(total > 0)) return -1;
  return draw_candidates(ids.data(), w.data(), keep, row.u * total);
}

void validate_sample(const ops::SampleParams& p) {
  SIEVE_CHECK(p.rows >= 0 && p.vocab > 0, "sample: rows >= 0 and vocab > 0 expected");
  SIEVE_CHECK(p.shards >= 1 && p.vocab % p.shards == 0, "sample: vocab must be a multiple of shards");
  SIEVE_CHECK(p.shards == 1 || p.ld == 0 || p.ld == p.vocab / p.shards, "sample: ld is fixed by the shard layout");
  SIEVE_CHECK(p.ld == 0 || p.ld >= p.vocab || p.shards > 1, "sample: ld must be at least vocab");
  SIEVE_CHECK(p.rows == 0 || (p.logits && p.row && p.out), "sample: logits, row and out are required");
  SIEVE_CHECK(p.vocab <= std::numeric_limits<int32_t>::max(), "sample: vocab must fit int32 ids");
}

void run_sample(const ops::SampleParams& p) {
  validate_sample(p);
  const int64_t V = p.vocab, vs = V / p.shards, ld = p.ld > 0 ? p.ld : V;
  detail::parallel_for(p.rows, double(p.rows) * double(V) * 20, [&](int64_t r0, int64_t r1) {
    std::vector<float> gathered;
    for (int64_t r = r0; r < r1; ++r) {
      const ops::SampleRow& sr = p.row[r];
      const auto mode = ops::SampleMode(sr.mode);
      int32_t id = -1;
      if (mode == ops::SampleMode::Greedy || mode == ops::SampleMode::Draw || mode == ops::SampleMode::Filtered) {
        const float* x = p.logits + r * ld;
        if (p.shards > 1) {
          gathered.resize(size_t(V));
          for (int s = 0; s < p.shards; ++s)
            std::memcpy(gathered.data() + s * vs, p.logits + (s * p.rows + r) * vs, size_t(vs) * sizeof(float));
          x = gathered.data();
        }
        id = mode == ops::SampleMode::Greedy ? first_argmax(x, V)
             : mode == ops::SampleMode::Draw ? draw_row(x, V, sr.inv_t, sr.u)
                                             : filtered_draw(x, V, sr);
      }
      if (id >= 0 && p.id_map) id = p.id_map[id];
      p.out[r] = id;
    }
  });
}

}  // namespace sieve::cpu
