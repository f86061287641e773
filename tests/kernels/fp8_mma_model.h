// Hopper's FP8 tensor-core arithmetic, for the bounds of the FP8 GEMM parity tests. One
// wgmma.m64nNk32.f32.e4m3.e4m3 step computes each output d = c + sum_{i<32} a_i b_i (c the fp32
// accumulator it is given, a_i b_i exact products of fp8 values) as the H100 does:
//   - E = the largest exponent among c (floor(log2 |c|)) and the products, a product's exponent
//     being the sum of its operands' exponents (not the normalised product's);
//   - every term (c and each product) is truncated toward zero to a multiple of 2^(E - 13);
//   - the terms are summed exactly and the sum truncated toward zero to 13 bits after its
//     leading one.
// So a step loses up to 2^-13 of its largest term per term, always toward zero: about 2^-12 of a
// 128-k block's magnitude in the worst cases seen, not the ~2^-14 a rounded 14-bit sum would give.
// The model reproduces the H100's outputs of run r1 bit for bit (kernels_linear_emulation_test:
// TensorCoreModel.ReproducesTheH100); the bound below follows from it for any inputs.
#pragma once

#include <algorithm>
#include <cmath>

namespace sieve::test {

// floor(log2 |v|) of a nonzero finite value.
inline int exponent_of(double v) {
  int e;
  std::frexp(v, &e);
  return e - 1;
}

// v truncated toward zero to a multiple of 2^q.
inline double truncate_to(double v, int q) {
  const double u = std::ldexp(1.0, q);
  return std::trunc(v / u) * u;
}

// One k32 step as above over n <= 32 pairs (a, b: fp8 values as floats).
inline double hopper_fp8_step(double c, const float* a, const float* b, int n) {
  int e = c != 0 ? exponent_of(c) : -100000;
  for (int i = 0; i < n; ++i)
    if (a[i] != 0 && b[i] != 0) e = std::max(e, exponent_of(a[i]) + exponent_of(b[i]));
  if (e == -100000) return c;
  double s = truncate_to(c, e - 13);
  for (int i = 0; i < n; ++i) s += truncate_to(double(a[i]) * double(b[i]), e - 13);
  return s == 0 ? 0.0 : truncate_to(s, exponent_of(s) - 13);
}

// A block of up to 128 products as the FP8 GEMM kernels sum it: k32 steps from a zero accumulator
// (the block's tail past n is zero). `bound` >= |value - exact sum| for any inputs: per step, one
// 2^(E - 13) for each nonzero term (E taken from bounds of the terms, an fp8 subnormal's exponent
// as -6 whichever way the hardware counts it) plus 2^-13 of the step's sum.
struct BlockSum {
  double value = 0, bound = 0;
};
inline BlockSum hopper_fp8_block(const float* a, const float* b, int n) {
  BlockSum r;
  double exact = 0;
  for (int g0 = 0; g0 < n; g0 += 32) {
    const int len = std::min(32, n - g0);
    r.value = hopper_fp8_step(r.value, a + g0, b + g0, len);
    const double c_max = std::fabs(exact) + r.bound;
    int e = c_max > 0 ? exponent_of(c_max) : -100000, terms = c_max > 0 ? 1 : 0;
    for (int i = g0; i < g0 + len; ++i) {
      if (a[i] == 0 || b[i] == 0) continue;
      exact += double(a[i]) * double(b[i]);
      e = std::max(e, std::max(exponent_of(a[i]), -6) + std::max(exponent_of(b[i]), -6));
      ++terms;
    }
    if (terms == 0) continue;
    r.bound += terms * std::ldexp(1.0, e - 13);
    r.bound += (std::fabs(exact) + r.bound) * 0x1p-13;
  }
  return r;
}

}  // namespace sieve::test
