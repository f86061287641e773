// The FP8 GEMM kernel's bookkeeping run on the host (no GPU): its launch plans, the CTA -> (tile,
// split) raster, each split's k blocks, the stage scales the producer copies, where each
// accumulator of a consumer thread sits, the per-128-k promotion, the staged partial tiles and
// each cluster rank's slice of the reduction, all through the functions of
// kernels/cuda/linear_fp8_plan.h that the kernel itself calls. A wgmma is emulated by the exact
// sum of its fp8 products over the block (rounded once to fp32, as the tensor cores' fp32 result
// of 128 products is exact to well under that rounding), the tensor copies by reads of the
// matrices with zeros out of bounds. The result must match a double-precision product of the
// same FP8 rows to fp32 rounding, every output must be written exactly once and padding never.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/linear_fp8_plan.h"
#include "linear_test_util.h"

namespace sieve {
namespace {

using namespace sieve::test;
using namespace sieve::cuda;

constexpr int kSms = 132;
constexpr int kMaxSmem = 227 * 1024;

template <int BN>
void emulate_cta(const fp8::Plan& p, const LinearCase& c, int tile_n, int tile_m, int split,
                 std::vector<float>& staged) {
  const int bm = p.bm(), P = fp8::stage_pitch(bm);
  const int n0 = tile_n * bm, t0 = tile_m * BN;
  const int kb0 = fp8::split_kb(p, split), kb1 = fp8::split_kb(p, split + 1);
  ASSERT_GT(kb1, kb0) << "empty split";
  const uint8_t* wq = static_cast<const uint8_t*>(c.w.data());
  const uint8_t* xq = static_cast<const uint8_t*>(c.x.data());
  staged.assign(size_t(BN) * P, kNaN);
  std::vector<float> xs(static_cast<size_t>(BN)), ws(static_cast<size_t>(bm));
  for (int wg = 0; wg < p.wgs; ++wg) {
    for (int warp = 0; warp < 4; ++warp) {
      for (int lane = 0; lane < 32; ++lane) {
        float acc[BN / 2] = {};
        const int row0 = fp8::acc_row(wg, warp, lane, 0), row1 = fp8::acc_row(wg, warp, lane, 2);
        for (int kb = kb0; kb < kb1; ++kb) {
          // The producer's stage scales (rows past m / n read the last row's).
          for (int j = 0; j < BN; ++j)
            xs[size_t(j)] =
                c.xscale[size_t(int64_t(std::min<int64_t>(t0 + j, c.m - 1)) * p.kb_total + kb)];
          for (int r = 0; r < bm; ++r)
            ws[size_t(r)] = c.wscale[size_t(
                fp8::w_scale_index(std::min<int64_t>(n0 + r, c.n - 1), c.br, p.kb_total, kb))];
          float blk[BN / 2];
          for (int i = 0; i < BN / 2; ++i) {
            const int64_t row = n0 + fp8::acc_row(wg, warp, lane, i),
                          tok = t0 + fp8::acc_col(lane, i);
            double s = 0;
            if (row < c.n && tok < c.m) {
              for (int64_t kk = int64_t(kb) * fp8::kBK;
                   kk < std::min<int64_t>(c.k, int64_t(kb + 1) * fp8::kBK); ++kk)
                s += double(fp8e4m3_to_f32(wq[row * c.k + kk])) *
                     double(fp8e4m3_to_f32(xq[tok * c.ldx + kk]));
            }
            blk[i] = float(s);
          }
          std::vector<float> stage(static_cast<size_t>(BN + bm));
          std::copy(xs.begin(), xs.end(), stage.begin());
          std::copy(ws.begin(), ws.end(), stage.begin() + BN);
          fp8::promote_block<BN>(acc, blk, stage.data(), stage[size_t(BN + row0)],
                                 stage[size_t(BN + row1)], lane);
        }
        for (int i = 0; i < BN / 2; ++i) {
          float& dst = staged[size_t(fp8::acc_col(lane, i) * P + fp8::acc_row(wg, warp, lane, i))];
          EXPECT_TRUE(std::isnan(dst)) << "two accumulators staged at one place";
          dst = acc[i];
        }
      }
    }
  }
}

// Runs the plan over the whole grid and returns y (as the kernel's stores leave it) and how many
// times each element of y was stored.
void emulate(const fp8::Plan& p, const LinearCase& c, TypedBuffer& y, std::vector<int>& writes) {
  const int bm = p.bm(), P = fp8::stage_pitch(bm);
  writes.assign(size_t(c.m * c.ldy), 0);
  std::vector<int> seen(size_t(p.tiles_n) * p.tiles_m * p.splits, 0);
  // Every tile's cluster: the partial tiles of its splits, then each rank's slice.
  for (int by = 0; by < p.tiles_m; ++by) {
    for (int bx0 = 0; bx0 < p.grid_x(); bx0 += p.splits) {
      std::vector<std::vector<float>> staged(size_t(p.splits));
      int tile_n = -1, tile_m = -1;
      for (int q = 0; q < p.splits; ++q) {
        int tn, tm, split;
        fp8::cta_tile(p, bx0 + q, by, tn, tm, split);
        ASSERT_TRUE(tn >= 0 && tn < p.tiles_n && tm >= 0 && tm < p.tiles_m && split == q);
        if (q == 0) tile_n = tn, tile_m = tm;
        ASSERT_TRUE(tn == tile_n && tm == tile_m) << "a cluster spans two tiles";
        ++seen[size_t((tm * p.tiles_n + tn) * p.splits + split)];
        switch (p.bn) {
          case 8:
            emulate_cta<8>(p, c, tn, tm, split, staged[size_t(q)]);
            break;
          case 16:
            emulate_cta<16>(p, c, tn, tm, split, staged[size_t(q)]);
            break;
          case 32:
            emulate_cta<32>(p, c, tn, tm, split, staged[size_t(q)]);
            break;
          case 64:
            emulate_cta<64>(p, c, tn, tm, split, staged[size_t(q)]);
            break;
          default:
            emulate_cta<128>(p, c, tn, tm, split, staged[size_t(q)]);
            break;
        }
      }
      const int n0 = tile_n * bm, t0 = tile_m * p.bn;
      int covered = 0;
      for (int rank = 0; rank < p.splits; ++rank) {
        int e0, e1;
        fp8::reduce_slice(bm, p.bn, p.splits, rank, e0, e1);
        covered += e1 - e0;
        for (int t = 0; t < 128 * p.wgs; ++t) {
          for (int e = e0 + 4 * t; e < e1; e += 4 * 128 * p.wgs) {
            const int token = e / bm, row = e % bm;
            float v[4];
            for (int k = 0; k < 4; ++k) {
              v[k] = staged[0][size_t(token * P + row + k)];
              for (int q = 1; q < p.splits; ++q)
                v[k] += staged[size_t(q)][size_t(token * P + row + k)];
            }
            const int64_t tok = t0 + token;
            if (tok >= c.m) continue;
            for (int k = 0; k < 4; ++k) {
              const int64_t col = n0 + row + k;
              if (col >= c.n) break;
              const size_t o = size_t(tok * c.ldy + col);
              ++writes[o];
              y.set(o, c.acc ? y.get(o) + v[k] : v[k]);
            }
          }
        }
      }
      EXPECT_EQ(covered, bm * p.bn) << "the ranks' slices do not cover the tile";
    }
  }
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_EQ(seen[i], 1) << "tile/split " << i << " run " << seen[i] << " times";
}

void run_case(int64_t m, int64_t n, int64_t k, int br, DType yt, bool acc, const LinearTuning& t,
              uint64_t seed) {
  LinearCase c(m, n, k, DType::FP8_E4M3, DType::FP8_E4M3, br, 128, yt, acc, seed, 16);
  const fp8::Plan p = fp8::make_plan(m, n, k, kSms, kMaxSmem, t);
  SCOPED_TRACE(c.describe() + " plan wgs " + std::to_string(p.wgs) + " bn " + std::to_string(p.bn) +
               " splits " + std::to_string(p.splits) + " stages " + std::to_string(p.stages));
  ASSERT_LE(fp8::smem_request(p), kMaxSmem);
  ASSERT_TRUE(fp8::staging_fits(p));
  ASSERT_GE(p.stages, 2);
  ASSERT_LE(p.splits, std::min(fp8::kMaxSplits, p.kb_total));
  TypedBuffer y = c.y;
  std::vector<int> writes;
  emulate(p, c, y, writes);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < c.ldy; ++j)
      ASSERT_EQ(writes[size_t(i * c.ldy + j)], j < n ? 1 : 0)
          << "y[" << i << "," << j << "] stores";
  // Against the double-precision reference on the same quantized rows: the fp32 roundings of
  // each block's sum, its scale product and its promotion, and the splits' partial sums.
  EXPECT_EQ(c.mismatches(y, double(p.kb_total + p.splits + 4) * 0x1p-23, 0.0), "");
}

TEST(LinearEmulation, DecodePlansAtOddShapes) {
  uint64_t seed = 1;
  for (int64_t m : {1, 7, 33, 64})
    for (int br : {1, 128})
      run_case(m, 200, 400, br, DType::F32, m % 2 == 1, LinearTuning{}, seed++);
  run_case(5, 96, 1040, 128, DType::BF16, true, LinearTuning{}, seed++);
}

TEST(LinearEmulation, PrefillAndForcedPlans) {
  uint64_t seed = 100;
  run_case(65, 136, 256, 128, DType::F32, false, LinearTuning{}, seed++);
  run_case(300, 130, 272, 1, DType::BF16, true, LinearTuning{}, seed++);
  for (int wgs : {1, 2})
    for (int bn : {8, 16, 32, 64, 128})
      for (int splits : {1, 3, 8}) {
        LinearTuning t;
        t.wgs = wgs, t.bn = bn, t.splits = splits;
        run_case(bn == 8 ? 7 : 70, wgs == 2 ? 144 : 80, 528, (bn + splits) % 2 ? 1 : 128,
                 DType::F32, splits == 3, t, seed++);
      }
}

// Where the GEMM's own quantizer writes a token row's codes: the 128-byte swizzle of the tensor
// copies (16-byte chunk c of row r at chunk c ^ (r % 8)), every byte of a 1024-byte atom once.
TEST(LinearEmulation, TokenTileSwizzle) {
  std::vector<int> seen(size_t(16 * 128), 0);
  for (int r = 0; r < 16; ++r)
    for (int b = 0; b < 128; ++b) {
      const int o = fp8::x_tile_offset(r, b);
      ASSERT_EQ(o / 128, r);
      EXPECT_EQ((o % 128) / 16, ((b / 16) ^ (r % 8)));
      EXPECT_EQ(o % 16, b % 16);
      ++seen[size_t(o)];
    }
  for (int v : seen) EXPECT_EQ(v, 1);
}

// cuBLASLt's copies of the weight scales (ops::lt_weight_scales): (1, 128) k-block-major,
// (128, 128) rows of blocks padded to 4, nothing where the scales serve as they are.
TEST(LinearEmulation, CublasLtScaleCopies) {
  ops::WeightView w;
  w.dtype = DType::FP8_E4M3, w.rows = 300, w.cols = 700, w.scale_block_cols = 128;
  const int64_t kb = 6;
  std::vector<float> s(size_t(300 * kb));
  for (size_t i = 0; i < s.size(); ++i) s[i] = float(i);
  w.scale_block_rows = 1;
  std::vector<float> t = ops::lt_weight_scales(w, s.data());
  ASSERT_EQ(t.size(), size_t(300 * kb));
  for (int64_t r = 0; r < 300; ++r)
    for (int64_t b = 0; b < kb; ++b) ASSERT_EQ(t[size_t(b * 300 + r)], s[size_t(r * kb + b)]);
  w.scale_block_rows = 128;  // 3 rows of 6 blocks -> 3 x 8
  t = ops::lt_weight_scales(w, s.data());
  ASSERT_EQ(t.size(), size_t(3 * 8));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t b = 0; b < 8; ++b)
      EXPECT_EQ(t[size_t(r * 8 + b)], b < kb ? s[size_t(r * kb + b)] : 1.0f);
  w.cols = 512;  // 4 blocks a row: cuBLASLt reads `scale` itself
  EXPECT_TRUE(ops::lt_weight_scales(w, s.data()).empty());
  w.scale_block_rows = 1, w.scale_block_cols = 32;  // MXFP8 as published: the CPU's
  EXPECT_TRUE(ops::lt_weight_scales(w, s.data()).empty());
}

// Hopper's FP8 tensor-core arithmetic (fp8_mma_model.h) against outputs an H100 computed: the
// three of run r1 (CudaLinearFp8.OddShapesEveryLayout, BF16 rows quantized first) that a 2^-12
// bound rejected. The kernel's plan for these shapes runs 4 splits of one 128-k block each, so an
// output is ((b0 + b1) + b2) + b3 in fp32 with b = fma(block sum, w_scale * x_scale, 0), plus the
// old y under accumulate. The model, not an exact sum, gives the H100's values to the printed
// digit (the exact products sit 0.058-0.069 away, farther than that bound).
TEST(TensorCoreModel, ReproducesTheH100) {
  struct Seen {
    int64_t m;
    int br;
    bool acc;
    uint64_t seed;
    int64_t i, j;
    double gpu;
  };
  const Seen seen[] = {{64, 128, false, 1022, 47, 148, 69.243683},
                       {300, 1, true, 1031, 193, 202, -52.682110},
                       {300, 1, true, 1031, 209, 81, -73.855774}};
  for (const Seen& s : seen) {
    const LinearCase c = quantized_twin(LinearCase(s.m, 208, 400, DType::BF16, DType::FP8_E4M3,
                                                   s.br, 128, DType::F32, s.acc, s.seed, 3));
    const fp8::Plan p = fp8::make_plan(c.m, c.n, c.k, kSms, kMaxSmem, LinearTuning{});
    ASSERT_EQ(p.splits, p.kb_total) << "one block a split assumed";
    const uint8_t* wq = static_cast<const uint8_t*>(c.w.data());
    const uint8_t* xq = static_cast<const uint8_t*>(c.x.data());
    float v = 0, exact_v = 0;
    for (int kb = 0; kb < p.kb_total; ++kb) {
      float a[128] = {}, b[128] = {};
      double exact = 0;
      for (int t = 0; t < 128 && kb * 128 + t < c.k; ++t) {
        a[t] = fp8e4m3_to_f32(wq[s.j * c.k + kb * 128 + t]);
        b[t] = fp8e4m3_to_f32(xq[s.i * c.ldx + kb * 128 + t]);
        exact += double(a[t]) * b[t];
      }
      const float sc = c.wscale[size_t((s.j / s.br) * p.kb_total + kb)] *
                       c.xscale[size_t(s.i * p.kb_total + kb)];
      const float blk = float(hopper_fp8_block(a, b, 128).value);
      v = kb == 0 ? std::fmaf(blk, sc, 0.0f) : v + std::fmaf(blk, sc, 0.0f);
      exact_v += std::fmaf(float(exact), sc, 0.0f);
    }
    if (s.acc) {
      v += c.y.get(size_t(s.i * c.ldy + s.j));
      exact_v += c.y.get(size_t(s.i * c.ldy + s.j));
    }
    EXPECT_NEAR(v, s.gpu, 1e-6) << "seed " << s.seed << " y[" << s.i << "," << s.j << "]";
    EXPECT_GT(std::fabs(exact_v - s.gpu), 0.05) << "the exact sum would have passed";
  }
}

// The default plans at the shapes of one TP4 / TP8 rank of MiniMax-M3 and an 8192-token prefill:
// valid, the decode ones splitting k across the SMs (as far as 8-CTA clusters go), the prefill
// one not; the decode split counts the H100 measured fastest (docs/performance.md): the fewest
// that give every SM a CTA where a CTA's k range then fits in about one ring (o_proj, the down
// projections), else about 2 CTAs an SM (qkv, gate_up).
TEST(LinearEmulation, PlansAtModelShapes) {
  const int64_t shapes[][3] = {{2560, 6144, 7}, {6144, 2048, 2}, {6144, 6144, 3}, {6144, 3072, 3},
                               {1536, 6144, 6}, {6144, 768, 2},  {1536, 6144, 6}, {6144, 1024, 2},
                               {3072, 6144, 6}, {6144, 1536, 2}, {768, 6144, 8},  {6144, 384, 2}};
  for (auto& s : shapes) {
    for (int64_t m : {1, 32, 64, 8192}) {
      const fp8::Plan p = fp8::make_plan(m, s[0], s[1], kSms, kMaxSmem, LinearTuning{});
      SCOPED_TRACE("n " + std::to_string(s[0]) + " k " + std::to_string(s[1]) + " m " +
                   std::to_string(m));
      EXPECT_LE(fp8::smem_request(p), kMaxSmem);
      EXPECT_TRUE(fp8::staging_fits(p));
      EXPECT_LE(p.splits, std::min(fp8::kMaxSplits, p.kb_total));
      if (m == 8192) {
        EXPECT_EQ(p.splits, 1);
        EXPECT_EQ(p.bn, 128);
        EXPECT_EQ(p.wgs, 2);
      } else {
        const int64_t tiles = int64_t(p.tiles_n) * p.tiles_m;
        EXPECT_GE(tiles * p.splits,
                  std::min<int64_t>(kSms, tiles * std::min(fp8::kMaxSplits, p.kb_total)))
            << "decode grid leaves SMs idle";
        EXPECT_EQ(p.splits, s[2]);
      }
    }
  }
}

}  // namespace
}  // namespace sieve
