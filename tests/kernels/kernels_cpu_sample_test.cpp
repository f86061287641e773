// The sample op's CPU reference (kernels/ops.h): greedy ids, draws against the rule's sums, the
// shard layout, the id map, and rows without mass.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "sample_test_util.h"

namespace sieve::test {
namespace {

TEST(CpuSample, MatchesTheRuleInEveryLayout) {
  for (int64_t vocab : {int64_t(37), int64_t(1000), int64_t(200064)})
    for (int shards : {1, 8})
      for (bool map : {false, true}) {
        if (vocab % shards != 0) continue;
        const int64_t rows = vocab > 100000 ? 19 : 45;
        const SampleCase c = make_sample_case(rows, vocab, shards, map, uint64_t(vocab * 31 + shards * 7 + map));
        const std::vector<int32_t> got = run_sample_cpu(c);
        for (int64_t r = 0; r < rows; ++r) {
          SCOPED_TRACE("vocab " + std::to_string(vocab) + " shards " + std::to_string(shards) + " row " +
                       std::to_string(r));
          const float* x = c.rows_plain.data() + r * vocab;
          const auto mode = ops::SampleMode(c.row[size_t(r)].mode);
          int32_t id = got[size_t(r)];
          if (mode == ops::SampleMode::Skip) {
            EXPECT_EQ(id, -1);
            continue;
          }
          if (id >= 0) {
            id = unmap(c, id);
            ASSERT_GE(id, 0) << "not a mapped id: " << got[size_t(r)];
          }
          if (mode == ops::SampleMode::Greedy) {
            EXPECT_EQ(id, naive_argmax(x, vocab));
          } else {
            EXPECT_EQ(check_draw(x, vocab, c.row[size_t(r)].inv_t, c.row[size_t(r)].u, id, 0.0), "");
            // The layout does not change the draw.
            EXPECT_EQ(id, cpu::draw_row(x, vocab, c.row[size_t(r)].inv_t, c.row[size_t(r)].u));
          }
        }
      }
}

TEST(CpuSample, FilteredRowsFollowTheRuleInEveryLayout) {
  int drawn = 0;
  for (int64_t vocab : {int64_t(37), int64_t(1000), int64_t(200064)})
    for (int shards : {1, 8})
      for (bool map : {false, true}) {
        if (vocab % shards != 0) continue;
        const int64_t rows = vocab > 100000 ? 27 : 108;
        const SampleCase c = make_filtered_case(rows, vocab, shards, map, uint64_t(vocab * 17 + shards * 5 + map));
        const std::vector<int32_t> got = run_sample_cpu(c);
        for (int64_t r = 0; r < rows; ++r) {
          const ops::SampleRow& sr = c.row[size_t(r)];
          if (sr.mode != int32_t(ops::SampleMode::Filtered)) continue;
          SCOPED_TRACE("vocab " + std::to_string(vocab) + " shards " + std::to_string(shards) + " row " +
                       std::to_string(r) + " top_k " + std::to_string(sr.top_k));
          const float* x = c.rows_plain.data() + r * vocab;
          const int32_t id = unmap(c, got[size_t(r)]);
          ASSERT_TRUE(got[size_t(r)] < 0 || id >= 0) << "not a mapped id: " << got[size_t(r)];
          EXPECT_EQ(check_filtered(x, vocab, sr, id, 0.0), "");
          EXPECT_EQ(id, cpu::filtered_draw(x, vocab, sr));  // the layout does not change the draw
          drawn += id >= 0;
        }
      }
  EXPECT_GT(drawn, 100);
}

TEST(CpuSample, FilteredEdges) {
  const float ninf = -INFINITY;
  std::vector<float> x = {0.5f, 2.0f, ninf, 2.0f, 1.0f, ninf, -0.0f, 0.0f};
  const int64_t n = int64_t(x.size());
  auto row = [](int32_t k, double u, double top_p = 1.0, double min_p = 0.0) {
    ops::SampleRow r;
    r.mode = int32_t(ops::SampleMode::Filtered);
    r.top_k = k;
    r.u = u;
    r.top_p = top_p;
    r.min_p = min_p;
    return r;
  };
  // k = 1: the first of the tied largest values, whatever u.
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(1, 0.99)), 1);
  // Two tied candidates of equal weight: u below one half takes the lower id.
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(2, 0.49)), 1);
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(2, 0.51)), 3);
  // -0 and +0 tie (the lower id first); k past the vocabulary is the vocabulary; the -inf
  // candidates are never drawn.
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(100, std::nextafter(1.0, 0.0))), 7);
  // A tiny top_p keeps one candidate; min_p 1 keeps the tied largest ones.
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(5, 0.99, 1e-12)), 1);
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(5, 0.99, 1.0, 1.0)), 3);
  // No mass, a NaN or +inf: -1 (the host decides).
  std::vector<float> none(5, ninf);
  EXPECT_EQ(cpu::filtered_draw(none.data(), 5, row(3, 0.5)), -1);
  x[4] = NAN;
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(3, 0.5)), -1);
  x[4] = INFINITY;
  EXPECT_EQ(cpu::filtered_draw(x.data(), n, row(3, 0.5)), -1);
}

TEST(CpuSample, DrawCoversTheEnds) {
  // u = 0 takes the first id with mass; u just below 1 the last one.
  std::vector<float> x = {-INFINITY, 1.0f, 2.0f, -INFINITY, 0.5f, -INFINITY};
  EXPECT_EQ(cpu::draw_row(x.data(), int64_t(x.size()), 1.0, 0.0), 1);
  EXPECT_EQ(cpu::draw_row(x.data(), int64_t(x.size()), 1.0, std::nextafter(1.0, 0.0)), 4);
  // A tiny temperature puts all the mass on the largest value.
  EXPECT_EQ(cpu::draw_row(x.data(), int64_t(x.size()), 1e5, 0.999), 2);
  // +inf and NaN leave no mass the rule can use.
  x[0] = INFINITY;
  EXPECT_EQ(cpu::draw_row(x.data(), int64_t(x.size()), 1.0, 0.5), -1);
  EXPECT_EQ(cpu::first_argmax(x.data(), int64_t(x.size())), 0);
}

TEST(CpuSample, RefusesBadLayouts) {
  std::vector<float> x(10, 0.0f);
  std::vector<ops::SampleRow> row(1);
  std::vector<int32_t> out(1);
  ops::SampleParams p;
  p.logits = x.data();
  p.rows = 1;
  p.vocab = 10;
  p.shards = 3;
  p.row = row.data();
  p.out = out.data();
  EXPECT_THROW(ops::sample(p, ops::Stream::cpu()), Error);
  p.shards = 1;
  p.ld = 5;
  EXPECT_THROW(ops::sample(p, ops::Stream::cpu()), Error);
}

}  // namespace
}  // namespace sieve::test
