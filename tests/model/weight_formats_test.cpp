// The weight format conversions of model/weight_formats.h: MXFP8's 1x32 scales regrouped to
// 1x128 (exact but for fp8's subnormal range), 128x128 quantization, stacking of fused rows.
#include "model/weight_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace sieve::model::detail {
namespace {

// MXFP8 as published: per 1x32 block the smallest power of two that fits amax in e4m3.
HostWeight mxfp8_of(const std::vector<float>& v, int64_t rows, int64_t cols) {
  HostWeight w;
  w.dtype = DType::FP8_E4M3;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = 1;
  w.block_cols = 32;
  const int64_t kb = (cols + 31) / 32;
  w.data.resize(size_t(rows * cols));
  w.scale.resize(size_t(rows * kb));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      float amax = 0;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) amax = std::max(amax, std::fabs(v[size_t(r * cols + c)]));
      const int e = amax > 0 ? int(std::ceil(std::log2(double(amax) / 448.0))) : -127;
      const float s = std::ldexp(1.0f, e);
      w.scale[size_t(r * kb + b)] = s;
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c)
        w.data[size_t(r * cols + c)] = f32_to_fp8e4m3(v[size_t(r * cols + c)] / s);
    }
  return w;
}

float value(const HostWeight& w, int64_t r, int64_t c) {
  const int64_t kb = (w.cols + w.block_cols - 1) / w.block_cols;
  return fp8e4m3_to_f32(w.data[size_t(r * w.cols + c)]) *
         w.scale[size_t((r / w.block_rows) * kb + c / w.block_cols)];
}

// Normal values whose 32-column blocks are scaled by 2^-m, m uniform in 0..12.
std::vector<float> spread_blocks(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> mag(0, 12);
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < (cols + 31) / 32; ++b) {
      const float m = std::ldexp(1.0f, -mag(rng));
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) v[size_t(r * cols + c)] = nd(rng) * m;
    }
  return v;
}

// Rows whose 32-column blocks differ in magnitude by up to 2^12: values stay exact unless the
// smaller block's value falls below e4m3's smallest normal (2^-6) after rescaling, and then they
// are off by at most half a subnormal step (2^-10) of the new scale.
TEST(WeightFormats, RegroupIsExactAboveTheSubnormalRange) {
  const int64_t rows = 64, cols = 300;  // a partial last group of 44 columns
  const HostWeight mx = mxfp8_of(spread_blocks(rows, cols, 11), rows, cols);
  int64_t inexact = 0;
  const HostWeight g = regroup_1x128(mx, &inexact);
  ASSERT_EQ(g.block_cols, 128);
  ASSERT_EQ(g.scale.size(), size_t(rows * 3));
  int64_t changed = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float a = value(mx, r, c), b = value(g, r, c);
      const float s = g.scale[size_t(r * 3 + c / 128)];
      if (a != b) {
        ++changed;
        EXPECT_LT(std::fabs(a), 0.016f * s) << r << ", " << c;  // below 2^-6 of the new scale
        EXPECT_LE(std::fabs(a - b), std::ldexp(s, -10) * 1.0001f) << r << ", " << c;
      }
    }
  EXPECT_EQ(changed, inexact);
  EXPECT_GT(changed, 0);  // the magnitudes above do reach the subnormal range
  std::printf("[ regroup ] random blocks spread over 2^12: %lld of %lld values rounded\n", (long long)changed,
              (long long)(rows * cols));
}

// The same rows regrouped to 128 x 128 blocks (--fp8-scale-blocks 128x128; 200 rows: a partial
// last block of rows too): exact but where a value falls below 2^-6 of its block's new scale.
TEST(WeightFormats, RegroupToBlocksIsExactAboveTheSubnormalRange) {
  const int64_t rows = 200, cols = 300;
  const HostWeight mx = mxfp8_of(spread_blocks(rows, cols, 12), rows, cols);
  int64_t inexact = 0;
  const HostWeight g = regroup_block128(mx, &inexact);
  ASSERT_EQ(g.block_rows, 128);
  ASSERT_EQ(g.block_cols, 128);
  ASSERT_EQ(g.scale.size(), size_t(2 * 3));
  int64_t changed = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float a = value(mx, r, c), b = value(g, r, c);
      const float s = g.scale[size_t((r / 128) * 3 + c / 128)];
      // The block's scale is the largest of its 1 x 32 scales: a power of two, never below one.
      ASSERT_GE(s, mx.scale[size_t(r * 10 + c / 32)]);
      if (a != b) {
        ++changed;
        EXPECT_LT(std::fabs(a), 0.016f * s) << r << ", " << c;
        EXPECT_LE(std::fabs(a - b), std::ldexp(s, -10) * 1.0001f) << r << ", " << c;
      }
    }
  EXPECT_EQ(changed, inexact);
  EXPECT_GT(changed, 0);
  std::printf("[ regroup ] random blocks spread over 2^12, to 128x128: %lld of %lld values rounded\n",
              (long long)changed, (long long)(rows * cols));
}

// The regrouping's cost on trained weights: the bundled model's projections as MXFP8, then
// regrouped as for the GPU (1 x 128, and 128 x 128 blocks). docs/quality.md quotes the printed
// lines.
TEST(WeightFormats, RegroupCostOnTheBundledModel) {
  const Checkpoint ck = Checkpoint::open(std::string(SIEVE_SOURCE_DIR) + "/models/minimax-m3-tiny");
  int64_t values = 0, inexact = 0, inexact_b = 0;
  double err2 = 0, err2_b = 0, ref2 = 0;
  for (const auto& [name, t] : ck.tensors()) {
    if (t.shape.size() != 2 || (name.find("proj") == std::string::npos && name.find("experts") == std::string::npos))
      continue;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> v(size_t(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.data, t.dtype, i);
    const HostWeight mx = mxfp8_of(v, rows, cols);
    const HostWeight g = regroup_1x128(mx, &inexact), gb = regroup_block128(mx, &inexact_b);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double a = value(mx, r, c), b = value(g, r, c), bb = value(gb, r, c);
        err2 += (a - b) * (a - b);
        err2_b += (a - bb) * (a - bb);
        ref2 += a * a;
      }
    values += rows * cols;
  }
  ASSERT_GT(values, 1000000);
  std::printf("[ regroup ] bundled model as MXFP8: %lld of %lld projection values rounded by the 1x128 regrouping "
              "(%.4f %%), relative RMS change %.3g\n",
              (long long)inexact, (long long)values, 100.0 * double(inexact) / double(values), std::sqrt(err2 / ref2));
  std::printf("[ regroup ] bundled model as MXFP8: %lld of %lld projection values rounded by the 128x128 regrouping "
              "(%.4f %%), relative RMS change %.3g\n",
              (long long)inexact_b, (long long)values, 100.0 * double(inexact_b) / double(values),
              std::sqrt(err2_b / ref2));
  EXPECT_LT(double(inexact) / double(values), 0.05);
  EXPECT_LT(double(inexact_b) / double(values), 0.2);
}

TEST(WeightFormats, Block128QuantizationAndStacking) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  HostWeight a, b;
  for (HostWeight* w : {&a, &b}) {
    w->dtype = DType::BF16;
    w->cols = 200;
  }
  a.rows = 192;  // not whole 128-row blocks: stacking goes per row
  b.rows = 64;
  for (HostWeight* w : {&a, &b}) {
    w->data.resize(size_t(w->rows * w->cols) * 2);
    for (size_t i = 0; i < size_t(w->rows * w->cols); ++i) store_from_f32(w->data.data(), DType::BF16, i, nd(rng));
  }
  const HostWeight qa = quantize_block128(a), qb = quantize_block128(b);
  EXPECT_EQ(qa.scale.size(), 4u);  // 2 x 2 blocks
  const HostWeight s = stack({qa, qb});
  EXPECT_EQ(s.rows, 256);
  EXPECT_EQ(s.block_rows, 1);
  EXPECT_EQ(s.block_cols, 128);
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < 200; ++c) {
      const float want = r < 192 ? value(qa, r, c) : value(qb, r - 192, c);
      ASSERT_EQ(value(s, r, c), want) << r << ", " << c;
      const HostWeight& src = r < 192 ? a : b;
      const float orig = load_as_f32(src.data.data(), DType::BF16, size_t((r < 192 ? r : r - 192) * 200 + c));
      ASSERT_NEAR(want, orig, std::fabs(orig) / 16 + 1e-6f);
    }
  // Whole blocks keep their 128x128 scales.
  HostWeight c = a;
  c.rows = 128;
  c.data.resize(size_t(128 * 200) * 2);
  const HostWeight kept = stack({quantize_block128(c), qb});
  EXPECT_EQ(kept.block_rows, 128);
  EXPECT_EQ(kept.scale.size(), 4u);
}

}  // namespace
}  // namespace sieve::model::detail
