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
