// CPU reference of the FP8 pieces: the 1 x 128 activation quantizer (quantize_fp8), linear with
// F32 / BF16 / FP8 weights of every scale block shape against a double-precision reference
// written here, and the FP8 outputs of rms_norm and swiglu_oai (the fp32 op's values quantized).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "linear_test_util.h"

namespace sieve {
namespace {

using namespace sieve::test;

// ---------------------------------------------------------------------------------------------
// Quantizer

// Every group: the scale is max|x| / 448 (1 for an all-zero group), the largest element maps to
// +-448, and every value dequantizes to within half an fp8 step of x.
void check_quantized_row(const float* x, int64_t n, const uint8_t* q, const float* scale) {
  for (int64_t g0 = 0, g = 0; g0 < n; g0 += 128, ++g) {
    const int64_t len = std::min<int64_t>(128, n - g0);
    float amax = 0;
    for (int64_t i = 0; i < len; ++i)
      if (!std::isnan(x[g0 + i])) amax = std::max(amax, std::fabs(x[g0 + i]));
    const float want = amax == 0 ? 1.0f : amax / 448.0f;
    ASSERT_EQ(scale[g], want) << "group " << g;
    for (int64_t i = 0; i < len; ++i) {
      const float v = x[g0 + i], d = fp8e4m3_to_f32(q[g0 + i]);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(d));
        continue;
      }
      if (amax > 0 && std::fabs(v) == amax) {
        EXPECT_EQ(std::fabs(d), 448.0f) << "element " << g0 + i;
      }
      // e4m3: 3 mantissa bits (half step 2^-4 relative) for normals, steps of 2^-9 below 2^-6.
      const double err = std::fabs(double(d) * scale[g] - double(v));
      EXPECT_LE(err, std::max(std::fabs(double(v)) * 0x1p-4, 0x1p-10 * scale[g]) * (1 + 1e-6))
          << "element " << g0 + i << " x " << v;
    }
  }
}

TEST(CpuQuantizeFp8, GroupsOfEveryLength) {
  Rng rng(11);
  for (int64_t cols : {1, 5, 127, 128, 129, 300, 6144}) {
    for (DType xt : {DType::F32, DType::BF16}) {
      const int64_t rows = 3, ldx = cols + 5, ldy = cols + 3;
      std::vector<float> xv = random_vector(size_t(rows * ldx), rng, -3.0f, 3.0f);
      xv[0] = 0.0f;
      if (cols > 200)
        xv[size_t(ldx + 150)] = 1e-6f;  // a tiny value next to large ones: subnormal fp8
      TypedBuffer x = TypedBuffer::from(xt, xv);
      std::vector<uint8_t> y(size_t(rows * ldy), 0x7f);
      std::vector<float> sc(size_t(rows * ops::fp8_groups(cols)), kNaN);
      ops::QuantizeFp8Params p;
      p.x = x.data(), p.x_dtype = xt, p.ldx = ldx;
      p.y = y.data(), p.ldy = ldy;
      p.y_scale = sc.data();
      p.rows = rows, p.cols = cols;
      cpu::run_quantize_fp8(p);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = x.get(size_t(r * ldx + c));
        SCOPED_TRACE("cols " + std::to_string(cols) + " row " + std::to_string(r));
        check_quantized_row(row.data(), cols, &y[size_t(r * ldy)],
                            &sc[size_t(r * ops::fp8_groups(cols))]);
        for (int64_t c = cols; c < ldy && r + 1 < rows; ++c) {
          EXPECT_EQ(y[size_t(r * ldy + c)], 0x7f);  // padding
        }
      }
    }
  }
}

TEST(CpuQuantizeFp8, ZeroGroupsNaNAndSaturation) {
  std::vector<float> x(300, 0.0f);
  x[130] = kNaN;
  x[131] = -2.5f;
  x[140] = 1e-30f;  // far below the group's amax / 448 * 2^-10: quantizes to zero
  x[260] = 448.0f * 1024;
  std::vector<uint8_t> q(300);
  std::vector<float> s(3);
  cpu::quantize_row_fp8(x.data(), 300, q.data(), s.data());
  EXPECT_EQ(s[0], 1.0f);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(q[size_t(i)], 0);
  EXPECT_EQ(s[1], 2.5f / 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(q[131]), -448.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(q[130])));
  EXPECT_EQ(q[140], 0);
  EXPECT_EQ(s[2], 1024.0f);
  EXPECT_EQ(fp8e4m3_to_f32(q[260]), 448.0f);
  check_quantized_row(x.data(), 300, q.data(), s.data());
}

// ---------------------------------------------------------------------------------------------
// linear

TEST(CpuLinear, Fp8WeightsEveryBlockShape) {
  uint64_t seed = 500;
  const int64_t shapes[][3] = {
      {1, 5, 7}, {7, 48, 129}, {33, 130, 300}, {3, 257, 256}, {2, 129, 64}};
  const int blocks[][2] = {{1, 32}, {1, 128}, {128, 128}, {3, 5}, {64, 1000}};
  for (auto& s : shapes)
    for (auto& b : blocks)
      for (DType xt : {DType::F32, DType::BF16, DType::FP8_E4M3})
        for (DType yt : {DType::F32, DType::BF16})
          for (bool acc : {false, true}) {
            LinearCase c(s[0], s[1], s[2], xt, DType::FP8_E4M3, b[0], b[1], yt, acc, seed++);
            SCOPED_TRACE(c.describe());
            TypedBuffer y = c.y;
            cpu::run_linear(
                c.params(c.x.data(), c.w.data(), c.wscale.data(), c.xscale.data(), y.data()));
            EXPECT_EQ(c.mismatches(y, 1e-6, 1e-6), "");
          }
}

TEST(CpuLinear, PlainWeightsAsMatmul) {
  uint64_t seed = 900;
  for (DType wt : {DType::F32, DType::BF16})
    for (DType xt : {DType::F32, DType::BF16, DType::FP8_E4M3})
      for (bool acc : {false, true}) {
        LinearCase c(9, 70, 200, xt, wt, 0, 0, DType::F32, acc, seed++);
        SCOPED_TRACE(c.describe());
        TypedBuffer y = c.y;
        cpu::run_linear(c.params(c.x.data(), c.w.data(), nullptr, c.xscale.data(), y.data()));
        EXPECT_EQ(c.mismatches(y, 1e-6, 1e-6), "");
      }
}

TEST(CpuLinear, ThreadedAndTiledWeightsCoverEveryColumn) {
  // n past the 256-row dequantization tile and m * n * k past the threading threshold.
  LinearCase c(17, 600, 384, DType::FP8_E4M3, DType::FP8_E4M3, 128, 128, DType::F32, true, 77);
  TypedBuffer y = c.y;
  cpu::run_linear(c.params(c.x.data(), c.w.data(), c.wscale.data(), c.xscale.data(), y.data()));
  EXPECT_EQ(c.mismatches(y, 1e-6, 1e-6), "");
}

TEST(CpuLinear, BadArgumentsNameTheField) {
  LinearCase c(2, 16, 32, DType::FP8_E4M3, DType::FP8_E4M3, 1, 128, DType::F32, false, 3);
  auto p = c.params(c.x.data(), c.w.data(), c.wscale.data(), c.xscale.data(), c.y.data());
  auto expect_error = [](ops::LinearParams q, const std::string& what) {
    try {
      cpu::run_linear(q);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto q = p;
  q.w.scale = nullptr;
  expect_error(q, "needs its scales");
  q = p;
  q.w.scale_block_rows = 0;
  expect_error(q, "scale block shape");
  q = p;
  q.x_scale = nullptr;
  expect_error(q, "x_scale");
  q = p;
  q.y_dtype = DType::FP8_E4M3;
  expect_error(q, "y must be");
  q = p;
  q.ldy = 8;
  expect_error(q, "row strides");
}

// ---------------------------------------------------------------------------------------------
// FP8 outputs of rms_norm and swiglu_oai: exactly the fp32 op's values, quantized.

TEST(CpuFusedQuantize, RmsNormFp8IsTheF32NormQuantized) {
  Rng rng(21);
  for (int64_t dim : {64, 300, 6144})
    for (bool residual : {false, true})
      for (DType xt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + " residual " + std::to_string(residual));
        const int64_t rows = 5, ld = dim + 4;
        TypedBuffer x = TypedBuffer::from(xt, random_vector(size_t(rows * ld), rng, -2, 2));
        TypedBuffer res0 = TypedBuffer::from(xt, random_vector(size_t(rows * ld), rng, -2, 2));
        std::vector<float> w = random_vector(size_t(dim), rng, -0.5f, 0.5f);
        TypedBuffer res_a = res0, res_b = res0;
        std::vector<float> yf(size_t(rows * ld), kNaN);
        ops::RmsNormParams p;
        p.x = x.data(), p.x_dtype = xt, p.ldx = ld;
        p.residual = residual ? res_a.data() : nullptr, p.ldr = ld;
        p.y = yf.data(), p.y_dtype = DType::F32, p.ldy = ld;
        p.weight = w.data(), p.weight_dtype = DType::F32;
        p.rows = rows, p.dim = dim;
        cpu::run_rms_norm(p);
        std::vector<uint8_t> q(size_t(rows * ld), 0x7f);
        std::vector<float> sc(size_t(rows * ops::fp8_groups(dim)), kNaN);
        p.residual = residual ? res_b.data() : nullptr;
        p.y = q.data(), p.y_dtype = DType::FP8_E4M3, p.y_scale = sc.data();
        cpu::run_rms_norm(p);
        EXPECT_EQ(res_a.bytes, res_b.bytes);
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<uint8_t> wq(static_cast<size_t>(dim));
          std::vector<float> ws(static_cast<size_t>(ops::fp8_groups(dim)));
          cpu::quantize_row_fp8(&yf[size_t(r * ld)], dim, wq.data(), ws.data());
          EXPECT_TRUE(std::equal(wq.begin(), wq.end(), q.begin() + r * ld)) << "row " << r;
          EXPECT_TRUE(std::equal(ws.begin(), ws.end(), sc.begin() + r * ops::fp8_groups(dim)))
              << "row " << r;
        }
        // Both outputs at once (y_fp8 beside an F32 y): the same y and the same codes and scales.
        TypedBuffer res_c = res0;
        std::vector<float> yf2(size_t(rows * ld), kNaN);
        std::vector<uint8_t> q2(size_t(rows * ld), 0x7f);
        std::vector<float> sc2(sc.size(), kNaN);
        p.residual = residual ? res_c.data() : nullptr;
        p.y = yf2.data(), p.y_dtype = DType::F32, p.y_scale = nullptr;
        p.y_fp8 = q2.data(), p.ld_fp8 = ld, p.y_fp8_scale = sc2.data();
        cpu::run_rms_norm(p);
        EXPECT_EQ(res_c.bytes, res_a.bytes);
        EXPECT_EQ(0, std::memcmp(yf2.data(), yf.data(), yf.size() * 4));
        EXPECT_EQ(q2, q);
        EXPECT_EQ(0, std::memcmp(sc2.data(), sc.data(), sc.size() * 4));
        p.y = const_cast<void*>(p.x);  // y_fp8 with y aliasing x
        EXPECT_THROW(cpu::run_rms_norm(p), Error);
        p.y = q.data(), p.y_dtype = DType::FP8_E4M3, p.y_scale = nullptr, p.y_fp8 = nullptr;
        EXPECT_THROW(cpu::run_rms_norm(p), Error);
      }
}

TEST(CpuFusedQuantize, SwigluFp8IsTheF32ActivationQuantized) {
  Rng rng(31);
  for (int64_t inter : {16, 200, 3072}) {
    const int64_t rows = 4, ld_in = 2 * inter + 2, ld_out = inter + 6;
    std::vector<float> gu = random_vector(size_t(rows * ld_in), rng, -9, 9);
    std::vector<float> yf(size_t(rows * ld_out), kNaN);
    ops::SwigluOaiParams p;
    p.gate_up = gu.data(), p.out = yf.data(), p.dtype = DType::F32;
    p.rows = rows, p.inter = inter, p.ld_in = ld_in, p.ld_out = ld_out;
    cpu::run_swiglu_oai(p);
    std::vector<uint8_t> q(size_t(rows * ld_out), 0x7f);
    std::vector<float> sc(size_t(rows * ops::fp8_groups(inter)), kNaN);
    p.out = q.data(), p.out_scale = sc.data();
    cpu::run_swiglu_oai(p);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> wq(static_cast<size_t>(inter));
      std::vector<float> ws(static_cast<size_t>(ops::fp8_groups(inter)));
      cpu::quantize_row_fp8(&yf[size_t(r * ld_out)], inter, wq.data(), ws.data());
      EXPECT_TRUE(std::equal(wq.begin(), wq.end(), q.begin() + r * ld_out))
          << "inter " << inter << " row " << r;
      EXPECT_TRUE(std::equal(ws.begin(), ws.end(), sc.begin() + r * ops::fp8_groups(inter)));
      if (r + 1 < rows) {
        EXPECT_EQ(q[size_t(r * ld_out + inter)], 0x7f);  // padding untouched
      }
    }
  }
}

}  // namespace
}  // namespace sieve
