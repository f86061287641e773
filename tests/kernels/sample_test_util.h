// Cases of the sample op (kernels/ops.h) for the CPU and CUDA tests: random logits rows in the
// plain or the tensor-parallel shard layout with ties, -inf entries and rows without mass, the
// rows' modes and parameters, and an independent check of a draw against the rule's sums.
#pragma once

#include <gtest/gtest.h>

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
