#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"

namespace sieve {
namespace {

// Reference: the nearest representable value of a finite sorted code table, ties to the code
// whose mantissa is even. Slow and obvious on purpose.
template <class Decode>
uint32_t nearest_even(double x, int ncodes, Decode decode) {
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < ncodes; ++c) {
    double v = decode(c);
    if (std::isnan(v) || std::isinf(v)) continue;
    double err = std::fabs(v - x);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return uint32_t(best);
}

TEST(Bf16, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float f = bf16_to_f32(uint16_t(c));
    uint16_t back = f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(back))) << c;
      EXPECT_EQ(back & 0x8000, c & 0x8000) << c;
    } else {
      EXPECT_EQ(back, c) << c;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Midpoints between consecutive bf16 codes go to the even one; just above goes up.
  for (uint32_t c = 0; c < 0x7f7f; c += 7) {
    uint32_t bits = (c << 16) | 0x8000u;  // exactly halfway to c+1
    uint16_t r = f32_to_bf16(f32_from_bits(bits));
    EXPECT_EQ(r, (c & 1) ? c + 1 : c) << c;
    uint16_t up = f32_to_bf16(f32_from_bits(bits + 1));
    EXPECT_EQ(up, c + 1) << c;
    uint16_t down = f32_to_bf16(f32_from_bits(bits - 1));
    EXPECT_EQ(down, c) << c;
  }
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);  // max float rounds up to inf
}

TEST(Fp8E4M3, DecodeAllCodes) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    float f = fp8e4m3_to_f32(uint8_t(c));
    if (std::isnan(f)) {
      ++nans;
      EXPECT_EQ(c & 0x7f, 0x7f);
      continue;
    }
    int e = (c >> 3) & 15, m = c & 7;
    double expect = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    if (c & 0x80) expect = -expect;
    EXPECT_EQ(double(f), expect) << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), 1.0f / 512);
}

TEST(Fp8E4M3, EncodeAllCodesAndMidpoints) {
  auto dec = [](int c) { return double(fp8e4m3_to_f32(uint8_t(c))); };
  for (int c = 0; c < 0x7f; ++c) {  // positive finite codes
    float f = fp8e4m3_to_f32(uint8_t(c));
    EXPECT_EQ(f32_to_fp8e4m3(f), c) << c;
    EXPECT_EQ(f32_to_fp8e4m3(-f), c | 0x80) << c;
    if (c + 1 < 0x7f) {
      double mid = (dec(c) + dec(c + 1)) / 2;
      EXPECT_EQ(f32_to_fp8e4m3(float(mid)), nearest_even(mid, 0x7f, dec)) << c;
      EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(float(mid), 1e9f)), c + 1) << c;
      EXPECT_EQ(f32_to_fp8e4m3(std::nextafter(float(mid), -1e9f)), c) << c;
    }
  }
}

TEST(Fp8E4M3, SaturatesAndNaN) {
  EXPECT_EQ(f32_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(449.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(470.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(f32_to_fp8e4m3(std::nanf("")))));
  EXPECT_EQ(f32_to_fp8e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8e4m3(1.0f / 1024), 0x00);          // half of the smallest subnormal: even
  EXPECT_EQ(f32_to_fp8e4m3(1.0f / 1024 * 1.01f), 0x01);
}

TEST(Fp8E4M3, RandomAgainstNearest) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> ex(-12, 9.5f);
  auto dec = [](int c) { return double(fp8e4m3_to_f32(uint8_t(c))); };
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(ex(rng));
    if (x >= 448) continue;
    EXPECT_EQ(f32_to_fp8e4m3(x), nearest_even(x, 0x7f, dec)) << x;
  }
}

TEST(F16, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 65536; ++c) {
    float f = f16_to_f32(uint16_t(c));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), c) << c;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(E8M0, Values) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(120), 1.0f / 128);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DType, Names) {
  for (auto t : {DType::F32, DType::BF16, DType::F16, DType::FP8_E4M3, DType::U8, DType::I32, DType::I64})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  EXPECT_THROW(dtype_from_name("F64"), Error);
}

}  // namespace
}  // namespace sieve
