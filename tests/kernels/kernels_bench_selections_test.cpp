// The benchmark's trained-like selection generator (kernels/bench/selections.h): every row valid
// for the attention op (sorted, unique, causal, forced local blocks present, padding last), the
// same rows for the same seed, and the measured model's locality reproduced at the bench's shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/bench/selections.h"

namespace sieve::test {
namespace {

using namespace sieve::kernels_bench;

TEST(BenchSelections, RowsAreValidForTheAttentionOp) {
  struct Shape {
    int topk, block_size, local, first_pos, rows;
  };
  for (const Shape sh : {Shape{16, 128, 1, 0, 1500}, Shape{16, 128, 1, 57344, 700}, Shape{5, 7, 2, 3, 333},
                         Shape{3, 32, 1, 100, 901}}) {
    SCOPED_TRACE("topk " + std::to_string(sh.topk) + " block " + std::to_string(sh.block_size) + " first " +
                 std::to_string(sh.first_pos));
    std::vector<int32_t> ids(size_t(sh.rows) * sh.topk, 12345);  // poison
    generate_selections(trained_like(), sh.topk, sh.block_size, sh.local, sh.first_pos, sh.rows, 7, ids.data());
    for (int r = 0; r < sh.rows; ++r) {
      const int n_blk = (sh.first_pos + r) / sh.block_size + 1;
      const int want = std::min(sh.topk, n_blk);
      const int32_t* row = ids.data() + size_t(r) * sh.topk;
      for (int i = 0; i < sh.topk; ++i) {
        if (i >= want) {
          ASSERT_EQ(row[i], -1) << "row " << r;
          continue;
        }
        ASSERT_GE(row[i], 0) << "row " << r;
        ASSERT_LT(row[i], n_blk) << "row " << r;  // causal
        if (i > 0) {
          ASSERT_LT(row[i - 1], row[i]) << "row " << r;  // sorted, unique
        }
      }
      for (int b = std::max(0, n_blk - sh.local); b < n_blk; ++b)
        ASSERT_TRUE(std::find(row, row + want, b) != row + want) << "row " << r << " lacks local block " << b;
    }
  }
}

TEST(BenchSelections, DeterministicInTheSeed) {
  std::vector<int32_t> a(size_t(900) * 16), b(a.size()), c(a.size());
  generate_selections(trained_like(), 16, 128, 1, 4000, 900, 3, a.data());
  generate_selections(trained_like(), 16, 128, 1, 4000, 900, 3, b.data());
  generate_selections(trained_like(), 16, 128, 1, 4000, 900, 4, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(BenchSelections, ReproducesTheMeasuredLocality) {
  // The bench's shape: 8192 new tokens, blocks of 128, topk 16.
  const int rows = 8192, topk = 16;
  std::vector<int32_t> ids(size_t(rows) * topk);
  generate_selections(trained_like(), topk, 128, 1, 0, rows, 1, ids.data());
  const LocalityStats got = locality(ids.data(), rows, topk, 0, 128, 1);
  const LocalityStats want = trained_target();
  for (int t = 0; t < 3; ++t)
    EXPECT_NEAR(got.tile_union[t], want.tile_union[t], 0.1 * want.tile_union[t]) << "tile " << kLocalityTiles[t];
  EXPECT_NEAR(got.shared_prev, want.shared_prev, 0.08);
  // After a long prefix (512 candidate blocks) new picks coincide less often, as the model's do
  // with more blocks (u16 2.23 over 256 blocks), but the chain keeps the union far below
  // independent selections' (~12 of 16 blocks new per token).
  generate_selections(trained_like(), topk, 128, 1, 57344, rows, 1, ids.data());
  const LocalityStats late = locality(ids.data(), rows, topk, 57344, 128, 1);
  EXPECT_GT(late.tile_union[1], want.tile_union[1]);
  EXPECT_LT(late.tile_union[1], 3.0);
}

TEST(BenchSelections, StatisticsOfKnownSelections) {
  // 16 tokens of block 9 (blocks of 16): all select {0, 1, 2, 9} (unions of 1, all shared), or
  // each its own three blocks besides the local one (unions of 1 + 3 x tile / 4, none shared).
  const int rows = 16, topk = 4, pos0 = 9 * 16;
  std::vector<int32_t> same(size_t(rows) * topk), own(size_t(rows) * topk, 0);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < topk; ++k) same[size_t(r) * topk + k] = k == 3 ? 9 : k;
  const LocalityStats s = locality(same.data(), rows, topk, pos0, 16, 1);
  EXPECT_EQ(s.tokens, rows);
  EXPECT_DOUBLE_EQ(s.tile_union[0], 1.0);
  EXPECT_DOUBLE_EQ(s.tile_union[1], 1.0);
  EXPECT_DOUBLE_EQ(s.shared_prev, 1.0);
  EXPECT_DOUBLE_EQ(s.local_share, 0.25);
  EXPECT_DOUBLE_EQ(s.block0_share, 1.0 / 3);
  std::vector<int32_t> big(size_t(rows) * topk);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < topk; ++k) big[size_t(r) * topk + k] = k == 3 ? 9 + 64 : 3 * r + k;  // block 73
  const LocalityStats o = locality(big.data(), rows, topk, (9 + 64) * 16, 16, 1);
  EXPECT_DOUBLE_EQ(o.tile_union[0], (1 + 3 * 8) / 4.0);
  EXPECT_DOUBLE_EQ(o.tile_union[1], (1 + 3 * 16) / 4.0);
  EXPECT_DOUBLE_EQ(o.shared_prev, 0.25);  // the local block only
}

TEST(BenchSelections, TilePassesOfKnownSelections) {
  // 64 tokens cycling over four disjoint sets of 4 blocks (blocks of 1, far past topk): a tile of
  // 8 holds two tokens of each set, so its best split still needs 2 sets a half (passes 2.0);
  // regrouped within windows of 32 (8 tokens of each set) every tile is one set (1.0).
  const int rows = 64, topk = 4, pos0 = 128;  // tiles and windows align to positions
  std::vector<int32_t> ids(size_t(rows) * topk);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < topk; ++k) ids[size_t(r) * topk + k] = 4 * (r % 4) + k;
  TilePassAccum acc;
  acc.add_rows(ids.data(), rows, topk, pos0, 1, 32);
  EXPECT_EQ(acc.tiles(), rows / kPassTile);
  EXPECT_DOUBLE_EQ(acc.passes(), 2.0);
  EXPECT_EQ(acc.regrouped_tiles(), rows / kPassTile);
  EXPECT_DOUBLE_EQ(acc.regrouped_passes(), 1.0);
  // Two interleaved sets: the kernel's split already separates them (1.0 either way).
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < topk; ++k) ids[size_t(r) * topk + k] = 4 * (r % 2) + k;
  TilePassAccum two;
  two.add_rows(ids.data(), rows, topk, pos0, 1, 32);
  EXPECT_DOUBLE_EQ(two.passes(), 1.0);
  EXPECT_DOUBLE_EQ(two.regrouped_passes(), 1.0);
  // Merged: the tiles of both, their mean passes.
  acc.merge(two);
  EXPECT_EQ(acc.tiles(), 2 * (rows / kPassTile));
  EXPECT_DOUBLE_EQ(acc.passes(), 1.5);
  EXPECT_DOUBLE_EQ(acc.regrouped_passes(), 1.0);
  // Tokens that do not choose (at most topk candidate blocks) are left out: positions 0..63 in
  // blocks of 16 have 1..4 blocks and select them all.
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < topk; ++k) ids[size_t(r) * topk + k] = k <= r / 16 ? k : -1;
  TilePassAccum early;
  early.add_rows(ids.data(), rows, topk, 0, 16, 32);
  EXPECT_EQ(early.tiles(), 0);
  EXPECT_EQ(early.regrouped_tiles(), 0);
  // A row that selects a block past its own is refused.
  ids[0] = 1;
  EXPECT_THROW(early.add_rows(ids.data(), rows, topk, 0, 16, 32), std::exception);
}

TEST(BenchSelections, TilePassesOfTheBenchSelections) {
  // The bench's trained-like rows at 8192 new tokens: a tile's halves pay ~1.25 x topk each, and
  // regrouping within 512 tokens does not lower it (docs/kernels.md); independent selections
  // (keep 0) pay far more, and regrouping recovers part of it.
  const int rows = 8192, topk = 16;
  std::vector<int32_t> ids(size_t(rows) * topk);
  generate_selections(trained_like(), topk, 128, 1, 0, rows, 1, ids.data());
  TilePassAccum trained;
  trained.add_rows(ids.data(), rows, topk, 0, 128, 512);
  EXPECT_GT(trained.passes(), 1.1);
  EXPECT_LT(trained.passes(), 1.4);
  EXPECT_GT(trained.regrouped_passes(), trained.passes() - 0.05);
  generate_selections(TrainedLike{}, topk, 128, 1, 0, rows, 1, ids.data());
  TilePassAccum independent;
  independent.add_rows(ids.data(), rows, topk, 0, 128, 512);
  EXPECT_GT(independent.passes(), 1.7);
  EXPECT_LT(independent.regrouped_passes(), independent.passes() - 0.1);
}

}  // namespace
}  // namespace sieve::test
