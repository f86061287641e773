// Cases of the sample op (kernels/ops.h) for the CPU and CUDA tests: random logits rows in the
// plain or the tensor-parallel shard layout with ties, -inf entries and rows without mass, the
// rows' modes and parameters, and an independent check of a draw against the rule's sums.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace sieve::test {

struct SampleCase {
  int64_t rows = 0, vocab = 0;
  int shards = 1;
  std::vector<float> rows_plain;    // [rows, vocab]
  std::vector<float> logits;        // in the op's layout
  std::vector<ops::SampleRow> row;  // [rows]
  std::vector<int32_t> id_map;      // [vocab] or empty
};

// The shard layout [shards, rows, vocab / shards] of rows [rows, vocab].
inline std::vector<float> to_shards(const std::vector<float>& x, int64_t rows, int64_t vocab, int shards) {
  const int64_t vs = vocab / shards;
  std::vector<float> out(x.size());
  for (int s = 0; s < shards; ++s)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < vs; ++k) out[size_t((s * rows + r) * vs + k)] = x[size_t(r * vocab + s * vs + k)];
  return out;
}

// Row r's kind cycles through: draw over normal logits; greedy; draw with many exact ties and -inf
// entries; greedy with ties; skip; a row of -inf only (draw, then greedy); a draw with a NaN.
// Temperatures span 1e-4 .. 1e4 (inv_t 1e4 .. 1e-4).
inline SampleCase make_sample_case(int64_t rows, int64_t vocab, int shards, bool map, uint64_t seed) {
  Rng rng(seed);
  SampleCase c;
  c.rows = rows;
  c.vocab = vocab;
  c.shards = shards;
  c.rows_plain.resize(size_t(rows * vocab));
  c.row.resize(size_t(rows));
  const double inv_ts[] = {1.0, 1.0 / 0.7, 1e4, 1e-4, 1.0 / 50, 2.5};
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* x = c.rows_plain.data() + r * vocab;
    const int kind = int(r % 9);
    ops::SampleRow& sr = c.row[size_t(r)];
    sr.inv_t = inv_ts[size_t(r) % 6];
    sr.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng.gen);
    for (int64_t i = 0; i < vocab; ++i) x[i] = rng.normal(3.0f);
    switch (kind) {
      case 0: case 6: sr.mode = int32_t(ops::SampleMode::Draw); break;
      case 1: sr.mode = int32_t(ops::SampleMode::Greedy); break;
      case 2: case 3:
        sr.mode = int32_t(kind == 2 ? ops::SampleMode::Draw : ops::SampleMode::Greedy);
        for (int64_t i = 0; i < vocab; ++i) x[i] = rng.uniform_int(0, 9) == 0 ? neg_inf : rng.grid(4, 1);
        break;
      case 4: sr.mode = int32_t(ops::SampleMode::Skip); break;
      case 5: case 7:
        sr.mode = int32_t(kind == 5 ? ops::SampleMode::Draw : ops::SampleMode::Greedy);
        for (int64_t i = 0; i < vocab; ++i) x[i] = neg_inf;
        break;
      case 8:
        sr.mode = int32_t(ops::SampleMode::Draw);
        x[rng.uniform_int(0, int(vocab - 1))] = kNaN;
        break;
    }
  }
  c.logits = shards == 1 ? c.rows_plain : to_shards(c.rows_plain, rows, vocab, shards);
  if (map) {
    c.id_map.resize(size_t(vocab));
    for (int64_t i = 0; i < vocab; ++i) c.id_map[size_t(i)] = int32_t((i * 7919 + 11) % 1000003);
  }
  return c;
}

// Checks `got` for a Draw row x (plain layout) against the rule's sums, written out here in double
// in id order: the id must hold mass and u * total must lie in its interval of the running sum
// [acc before it, acc with it], within tol * total (0 for the CPU, whose rule these sums are;
// a tight tolerance for CUDA, which sums in another order). Returns a failure description or "".
inline std::string check_draw(const float* x, int64_t vocab, double inv_t, double u, int32_t got, double tol) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, double(x[i]) * inv_t);
  std::vector<double> w(static_cast<size_t>(vocab));
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) total += w[size_t(i)] = x[i] == -INFINITY ? 0.0 : std::exp(double(x[i]) * inv_t - mx);
  if (!(total > 0)) return got == -1 ? "" : "expected -1 (no mass), got " + std::to_string(got);
  if (got < 0 || got >= vocab) return "id out of range: " + std::to_string(got);
  if (!(w[size_t(got)] > 0)) return "id without mass: " + std::to_string(got);
  double before = 0;
  for (int64_t i = 0; i < got; ++i) before += w[size_t(i)];
  const double target = u * total, slack = tol * total;
  // (The rule picks the first id whose running sum exceeds the target: before <= target < after.)
  if (target < before - slack || target >= before + w[size_t(got)] + slack) {
    // The last id with mass also takes a target at or past the total.
    bool last = true;
    for (int64_t i = got + 1; i < vocab; ++i) last = last && !(w[size_t(i)] > 0);
    if (!(last && target >= before - slack))
      return "u " + std::to_string(u) + " outside [" + std::to_string(before / total) + ", " +
             std::to_string((before + w[size_t(got)]) / total) + ") of id " + std::to_string(got);
  }
  return "";
}

// Filtered rows (ops.h, SampleMode::Filtered) among the other modes. Row r's kind cycles through:
// normal logits; many exact ties and -inf entries; fewer finite values than top_k; every value
// -inf; a NaN; +inf; a greedy row; a draw; a skipped row. top_k spans 1, 2, 40, the largest the op
// takes, vocab - 1 and more than the op takes (clamped); top_p 1, 0.95, 0.5 and tiny; min_p 0,
// 0.05 and 0.5; temperatures as make_sample_case.
inline SampleCase make_filtered_case(int64_t rows, int64_t vocab, int shards, bool map, uint64_t seed) {
  SampleCase c = make_sample_case(rows, vocab, shards, map, seed);
  Rng rng(seed * 7 + 3);
  const int32_t ks[] = {1, 2, 40, ops::kMaxDeviceTopK, int32_t(vocab - 1), 5000};
  const double top_ps[] = {1.0, 0.95, 0.5, 1e-9};
  const double min_ps[] = {0.0, 0.05, 0.0, 0.5, 0.0};
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* x = c.rows_plain.data() + r * vocab;
    ops::SampleRow& sr = c.row[size_t(r)];
    const int kind = int(r % 9);
    if (kind >= 6) continue;  // make_sample_case's greedy, draw and skipped rows stay
    sr.mode = int32_t(ops::SampleMode::Filtered);
    sr.top_k = std::max(1, ks[size_t(r / 9 + kind) % 6]);
    sr.top_p = top_ps[size_t(r) % 4];
    sr.min_p = min_ps[size_t(r) % 5];
    for (int64_t i = 0; i < vocab; ++i) x[i] = rng.normal(3.0f);
    switch (kind) {
      case 1:
        for (int64_t i = 0; i < vocab; ++i) x[i] = rng.uniform_int(0, 9) == 0 ? neg_inf : rng.grid(4, 1);
        break;
      case 2:
        for (int64_t i = 0; i < vocab; ++i) x[i] = neg_inf;
        for (int i = 0; i < 3; ++i) x[rng.uniform_int(0, int(vocab - 1))] = rng.normal(1.0f);
        sr.top_k = std::max<int32_t>(sr.top_k, 8);
        break;
      case 3:
        for (int64_t i = 0; i < vocab; ++i) x[i] = neg_inf;
        break;
      case 4: x[rng.uniform_int(0, int(vocab - 1))] = kNaN; break;
      case 5: x[rng.uniform_int(0, int(vocab - 1))] = std::numeric_limits<float>::infinity(); break;
    }
  }
  c.logits = shards == 1 ? c.rows_plain : to_shards(c.rows_plain, rows, vocab, shards);
  return c;
}

// The Filtered rule written out on its own (a full stable sort): the candidates, their weights and
// running sums; odd when the row holds a NaN or +inf.
struct FilteredRef {
  bool odd = false;
  std::vector<int32_t> ids;
  std::vector<double> w, s;
};
inline FilteredRef filtered_ref(const float* x, int64_t vocab, const ops::SampleRow& sr) {
  FilteredRef f;
  for (int64_t i = 0; i < vocab; ++i) f.odd = f.odd || std::isnan(x[i]) || x[i] == INFINITY;
  if (f.odd) return f;
  std::vector<int32_t> all(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) all[size_t(i)] = int32_t(i);
  std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  const int64_t k = std::clamp<int64_t>(sr.top_k, 1, std::min<int64_t>(ops::kMaxDeviceTopK, vocab));
  f.ids.assign(all.begin(), all.begin() + k);
  const double mx = double(x[f.ids[0]]) * sr.inv_t;
  double acc = 0;
  for (int32_t id : f.ids) {
    const double w = x[id] == -INFINITY ? 0.0 : std::exp(double(x[id]) * sr.inv_t - mx);
    f.w.push_back(w);
    f.s.push_back(acc += w);
  }
  return f;
}
// The kept count, with the min-p floor scaled by floor_scale and top_p moved by top_p_shift.
inline int64_t filtered_keep(const FilteredRef& f, const ops::SampleRow& sr, double floor_scale, double top_p_shift) {
  int64_t keep = int64_t(f.ids.size());
  if (sr.min_p > 0) {
    const double floor = sr.min_p * f.w[0] * floor_scale;
    int64_t j = 0;
    while (j < keep && f.w[size_t(j)] >= floor) ++j;
    keep = std::max<int64_t>(j, 1);
  }
  if (sr.top_p < 1.0) {
    const double norm = f.s[size_t(keep - 1)];
    double acc = 0;
    int64_t n = 0;
    while (n < keep) {
      acc += f.w[size_t(n)] / norm;
      ++n;
      if (acc >= sr.top_p + top_p_shift) break;
    }
    keep = std::max<int64_t>(n, 1);
  }
  return keep;
}
// Checks `got` (an unmapped id) for a Filtered row x (plain layout) against the rule: exactly with
// tol 0 (the CPU's arithmetic is the rule's); with tol > 0 (CUDA, whose exp may differ in the last
// bit) each boundary (min-p's floor, top-p's mass, the draw's running sums) may move by tol
// relative. Returns a failure description or "".
inline std::string check_filtered(const float* x, int64_t vocab, const ops::SampleRow& sr, int32_t got, double tol) {
  const FilteredRef f = filtered_ref(x, vocab, sr);
  if (f.odd) return got == -1 ? "" : "expected -1 (a NaN or +inf), got " + std::to_string(got);
  std::vector<int64_t> keeps = {filtered_keep(f, sr, 1.0, 0.0)};
  if (tol > 0)
    for (double fs : {1 - tol, 1 + tol})
      for (double ts : {-tol, tol}) keeps.push_back(filtered_keep(f, sr, fs, ts));
  std::string why;
  for (int64_t keep : keeps) {
    const double total = f.s[size_t(keep - 1)];
    if (!(total > 0)) {
      if (got == -1) return "";
      why = "expected -1 (no mass), got " + std::to_string(got);
      continue;
    }
    const double target = sr.u * total, slack = tol * total;
    int64_t j = 0;
    while (j < keep && f.ids[size_t(j)] != got) ++j;
    if (j == keep) {
      why = "id " + std::to_string(got) + " is not among the " + std::to_string(keep) + " kept candidates";
      continue;
    }
    if (!(f.w[size_t(j)] > 0)) {
      why = "id without mass: " + std::to_string(got);
      continue;
    }
    const double before = j > 0 ? f.s[size_t(j - 1)] : 0.0;
    bool last = true;
    for (int64_t i = j + 1; i < keep; ++i) last = last && !(f.w[size_t(i)] > 0);
    if (target >= before - slack && (target < f.s[size_t(j)] + slack || last)) return "";
    why = "u " + std::to_string(sr.u) + " outside [" + std::to_string(before / total) + ", " +
          std::to_string(f.s[size_t(j)] / total) + ") of candidate " + std::to_string(j) + " (id " +
          std::to_string(got) + ")";
  }
  return why;
}

// The op's ids on the CPU for case c (out poisoned first).
inline std::vector<int32_t> run_sample_cpu(const SampleCase& c) {
  std::vector<int32_t> out(size_t(c.rows), 0x5a5a5a5a);
  ops::SampleParams p;
  p.logits = c.logits.data();
  p.rows = c.rows;
  p.vocab = c.vocab;
  p.shards = c.shards;
  p.row = c.row.data();
  p.id_map = c.id_map.empty() ? nullptr : c.id_map.data();
  p.out = out.data();
  ops::sample(p, ops::Stream::cpu());
  return out;
}

// The vocabulary id that c's map sends to `id` (the map is injective); id itself without a map,
// -1 for -1 or an id the map does not give.
inline int32_t unmap(const SampleCase& c, int32_t id) {
  if (c.id_map.empty() || id < 0) return id;
  for (int64_t i = 0; i < c.vocab; ++i)
    if (c.id_map[size_t(i)] == id) return int32_t(i);
  return -1;
}

// The first index of the largest value, written independently of the op (NaN never wins).
inline int32_t naive_argmax(const float* x, int64_t n) {
  int32_t best = -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(x[i]) && x[i] != -INFINITY && (best < 0 || x[i] > x[best])) best = int32_t(i);
  return best < 0 ? 0 : best;
}

}  // namespace sieve::test
