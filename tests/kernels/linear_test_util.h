// A random ops::linear case on the host (CPU reference test, CUDA parity test, host emulation of
// the CUDA tiles): x rows (F32, BF16, or FP8 quantized by cpu::quantize_row_fp8 with their
// scales), a weight (F32, BF16, or FP8 with random block scales of any shape), y poisoned or
// random under accumulate, padded row strides; a double-precision reference built from the
// dequantization formula of ops.h; and for FP8 x FP8 the bound of what Hopper's tensor cores may
// differ from it (fp8_mma_model.h).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "fp8_mma_model.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace sieve::test {

struct LinearCase {
  int64_t m, n, k, ldx, ldy;
  DType xt, wt, yt;
  int br, bc;  // FP8 weight scale blocks
  bool acc;
  TypedBuffer x, w, y;  // y: before the op (NaN, or random under accumulate; padding NaN)
  std::vector<float> xscale, wscale;

  // x_pad / y_pad: elements of padding after each row (x_pad 16 keeps FP8 rows 16-byte aligned).
  LinearCase(int64_t m_, int64_t n_, int64_t k_, DType xt_, DType wt_, int br_, int bc_, DType yt_,
             bool acc_, uint64_t seed, int64_t x_pad = 3, int64_t y_pad = 2)
      : m(m_),
        n(n_),
        k(k_),
        ldx(k_ + x_pad),
        ldy(n_ + y_pad),
        xt(xt_),
        wt(wt_),
        yt(yt_),
        br(br_),
        bc(bc_),
        acc(acc_) {
    Rng rng(seed);
    // Rows with a spread of magnitudes inside each group (so the scales and small values matter).
    std::vector<float> xv(size_t(m * ldx), kNaN);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < k; ++c)
        xv[size_t(i * ldx + c)] = rng.normal(1.0f) * (c % 7 == 0 ? 8.0f : 1.0f);
    if (xt == DType::FP8_E4M3) {
      x = TypedBuffer(DType::FP8_E4M3, size_t(m * ldx));
      xscale.assign(size_t(std::max<int64_t>(1, m * ops::fp8_groups(k))), kNaN);
      for (int64_t i = 0; i < m; ++i)
        cpu::quantize_row_fp8(&xv[size_t(i * ldx)], k, static_cast<uint8_t*>(x.data()) + i * ldx,
                              &xscale[size_t(i * ops::fp8_groups(k))]);
    } else {
      x = TypedBuffer::from(xt, xv);
    }
    std::vector<float> wv(size_t(n * k));
    if (wt == DType::FP8_E4M3) {
      for (auto& v : wv) v = std::fmax(-448.0f, std::fmin(448.0f, rng.normal(100.0f)));
      w = TypedBuffer::from(wt, wv);
      const int64_t sr = (n + br - 1) / br, sc = (k + bc - 1) / bc;
      wscale.resize(size_t(std::max<int64_t>(1, sr * sc)));
      // (1, 32) blocks carry MXFP8's powers of two; other shapes arbitrary positive floats.
      for (auto& s : wscale)
        s = bc == 32 && br == 1 ? std::ldexp(1.0f, rng.uniform_int(-12, -6))
                                : rng.uniform(0.5f, 4.0f) / 448.0f;
    } else {
      for (auto& v : wv) v = rng.uniform(-0.1f, 0.1f);
      w = TypedBuffer::from(wt, wv);
    }
    y = TypedBuffer(yt, size_t(m * ldy));
    if (acc)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y.set(size_t(i * ldy + j), rng.uniform(-4.0f, 4.0f));
  }

  std::string describe() const {
    std::string s = "m=";
    s += std::to_string(m);
    s += " n=";
    s += std::to_string(n);
    s += " k=";
    s += std::to_string(k);
    s += " x=";
    s += dtype_name(xt);
    s += " w=";
    s += dtype_name(wt);
    if (wt == DType::FP8_E4M3) {
      s += " (";
      s += std::to_string(br);
      s += "x";
      s += std::to_string(bc);
      s += ")";
    }
    s += " y=";
    s += dtype_name(yt);
    s += acc ? " accumulate" : "";
    return s;
  }

  ops::LinearParams params(const void* xp, const void* wp, const float* wsp, const float* xsp,
                           void* yp) const {
    ops::LinearParams p;
    p.x = xp;
    p.x_dtype = xt;
    p.ldx = ldx;
    p.x_scale = xt == DType::FP8_E4M3 ? xsp : nullptr;
    p.w.data = wp;
    p.w.dtype = wt;
    p.w.rows = n;
    p.w.cols = k;
    if (wt == DType::FP8_E4M3) {
      p.w.scale = wsp;
      p.w.scale_block_rows = br;
      p.w.scale_block_cols = bc;
    }
    p.y = yp;
    p.y_dtype = yt;
    p.ldy = ldy;
    p.m = m;
    p.accumulate = acc;
    return p;
  }

  double xd(int64_t i, int64_t c) const {
    const double v = x.get(size_t(i * ldx + c));
    return xt == DType::FP8_E4M3 ? v * xscale[size_t(i * ops::fp8_groups(k) + c / 128)] : v;
  }
  double wd(int64_t j, int64_t c) const {
    const double v = w.get(size_t(j * k + c));
    return wt == DType::FP8_E4M3 ? v * wscale[size_t((j / br) * ((k + bc - 1) / bc) + c / bc)] : v;
  }

  // Reference y (double) of every (i, j) and the sum of magnitudes that bounds its error.
  void reference(std::vector<double>& ref, std::vector<double>& mag) const {
    ref.assign(size_t(m * n), 0.0);
    mag.assign(size_t(m * n), 0.0);
    std::vector<double> wrow(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < k; ++c) wrow[size_t(c)] = wd(j, c);
      for (int64_t i = 0; i < m; ++i) {
        double s = 0, a = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double pr = xd(i, c) * wrow[size_t(c)];
          s += pr;
          a += std::fabs(pr);
        }
        if (acc) {
          s += y.get(size_t(i * ldy + j));
          a += std::fabs(y.get(size_t(i * ldy + j)));
        }
        ref[size_t(i * n + j)] = s;
        mag[size_t(i * n + j)] = a;
      }
    }
  }

  // The first mismatches of `got` (y after the op) against the reference, or "". Bound per
  // output: sum_tol x (sum of |products| and |y before|) + atol, plus one bf16 rounding of a BF16
  // output; padding columns must stay NaN.
  std::string mismatches(const TypedBuffer& got, double sum_tol, double atol) const {
    std::vector<double> ref, mag;
    reference(ref, mag);
    for (size_t e = 0; e < mag.size(); ++e) mag[e] = (sum_tol * mag[e] + atol) * 1.01;
    return mismatches_within(got, ref, mag);
  }

  // FP8 x and FP8 w (what the CUDA FP8 GEMMs multiply): per output the exact reference, the
  // tensor-core model's value (each 128-k block summed by hopper_fp8_block, times its scales, in
  // double) and a bound on the GPU's distance from the exact reference: the blocks' bounds times
  // their scales, plus fp32 roundings of the scale products, the promotions, the split sums and
  // an accumulated y.
  void tensor_core_reference(std::vector<double>& ref, std::vector<double>& model,
                             std::vector<double>& bound) const {
    std::vector<double> mag;
    reference(ref, mag);
    const int64_t kb = (k + 127) / 128;
    std::vector<float> wf(size_t(n * k)), xf(size_t(m * k));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c = 0; c < k; ++c) wf[size_t(j * k + c)] = w.get(size_t(j * k + c));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < k; ++c) xf[size_t(i * k + c)] = x.get(size_t(i * ldx + c));
    model.assign(size_t(m * n), 0.0);
    bound.assign(size_t(m * n), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double v = acc ? double(y.get(size_t(i * ldy + j))) : 0.0, b = 0;
        for (int64_t q = 0; q < kb; ++q) {
          const int len = int(std::min<int64_t>(128, k - q * 128));
          const BlockSum s =
              hopper_fp8_block(&wf[size_t(j * k + q * 128)], &xf[size_t(i * k + q * 128)], len);
          const double sc = double(wscale[size_t((j / br) * ((k + bc - 1) / bc) + q * 128 / bc)]) *
                            xscale[size_t(i * kb + q)];
          v += s.value * sc;
          b += s.bound * sc;
        }
        model[size_t(i * n + j)] = v;
        bound[size_t(i * n + j)] =
            b * 1.01 + double(2 * kb + 8) * 0x1p-23 * (mag[size_t(i * n + j)] + b);
      }
  }

  // The first mismatches of `got` against ref within tol (per output; plus one bf16 rounding of a
  // BF16 output), padding columns NaN; "" when all hold.
  std::string mismatches_within(const TypedBuffer& got, const std::vector<double>& ref,
                                const std::vector<double>& tol) const {
    std::string out;
    int bad = 0;
    for (int64_t i = 0; i < m && bad < 5; ++i) {
      for (int64_t j = 0; j < ldy && bad < 5; ++j) {
        const double g = got.get(size_t(i * ldy + j));
        if (j >= n) {
          if (!std::isnan(g) && bad++ < 5)
            out += " padding y[" + std::to_string(i) + "," + std::to_string(j) + "] written;";
          continue;
        }
        const double r = ref[size_t(i * n + j)];
        const double t = tol[size_t(i * n + j)] + (yt == DType::BF16 ? std::fabs(r) / 256 : 0.0);
        if (!(std::fabs(g - r) <= t) && bad++ < 5)
          out += " y[" + std::to_string(i) + "," + std::to_string(j) + "] = " + std::to_string(g) +
                 " want " + std::to_string(r) + " (tol " + std::to_string(t) + ");";
      }
    }
    return out;
  }
};

// The case with F32 / BF16 rows quantized on the host by cpu::quantize_row_fp8 (what the CUDA op
// computes from them, bit for bit); an FP8 case as it is.
inline LinearCase quantized_twin(const LinearCase& c) {
  LinearCase q = c;
  if (c.xt == DType::FP8_E4M3) return q;
  q.xt = DType::FP8_E4M3;
  q.x = TypedBuffer(DType::FP8_E4M3, size_t(c.m * c.ldx));
  q.xscale.assign(size_t(std::max<int64_t>(1, c.m * ops::fp8_groups(c.k))), 0.0f);
  std::vector<float> row(static_cast<size_t>(c.k));
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t kk = 0; kk < c.k; ++kk) row[size_t(kk)] = c.x.get(size_t(i * c.ldx + kk));
    cpu::quantize_row_fp8(row.data(), c.k, static_cast<uint8_t*>(q.x.data()) + i * c.ldx,
                          &q.xscale[size_t(i * ops::fp8_groups(c.k))]);
  }
  return q;
}

}  // namespace sieve::test
