// The FP8 MoE kernels (kernels/cuda/moe_fp8*.cu) emulated on the host, and the parity check of
// a result against the exact arithmetic (tests/kernels: the CPU emulation test and the CUDA test).
//
// Emulation: the kernels' arithmetic step by step: the 1 x 128 quantizer, per 128-k block a
// chain of k32 fp8 MMAs into a temporary, the promotion final = fma(temp, w_scale * x_scale,
// final) in fp32, SwiGLU-OAI with the device's roundings, the group amax / 448 scale and the fp8
// rounding, the down product the same way, its rows in bf16, and the combine in expert-id order.
// Work is walked the way the kernels walk it (moe_fp8_work.h: work items, the [gate | up] row
// permutation of a 256-row block, row blocks of an expert), so an indexing error in those
// functions shows up here too. The MMA chain is either exact (products summed exactly, rounded
// once to fp32) or the Hopper fp8 tensor-core arithmetic: per k32 instruction the 32 products
// and the accumulator are aligned to the largest exponent among them and truncated to 13
// fractional bits, summed, and the sum truncated to 13 fraction bits (the bit-accurate model of
// Xie et al., "MMA-Sim", arXiv 2511.10909). With the Hopper arithmetic a SwiGLU value that sits
// near an fp8 rounding boundary can land on the other neighbour than the exact value does, and
// that moves its token's whole output row: the emulation reproduces what the GPU does.
//
// Check (check_moe_fp8): a result and its quantized SwiGLU rows (act_q and act_scale by pair,
// as the kernels wrote them) against the exact arithmetic, in two stages that each hold for
// every element (no allowance for a fraction of outliers):
//  A. each group scale within 2^-7 of amax / 448 of the exact SwiGLU row, each fp8 value one of
//     the two fp8 neighbours of the exact value / scale (widened by 2^-7); and at most 10 % of
//     them off the exact value's rounding;
//  B. out against out0 + sum over the token's experts of weight x (the result's own act_q rows
//     times the dequantized down rows, exact): within 2^-10 x sum |terms| (the tensor cores'
//     accumulation) + 2^-8 x |expert row| (its bf16 storage) + the output's rounding.
// Stage B takes the activations as given, so the fp8 rounding of values near a boundary (which
// any fp32 accumulation order can flip) cannot hide in its bound, and its bound stays tight.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/moe_fp8_work.h"
#include "moe_test_util.h"

namespace sieve::test {

enum class MmaModel { kExact, kHopper };

// e4m3 codes as integers: value = sign * m * 2^(e - 3), m = 0..15 (8..15 when normal), e the
// exponent of the value's significand m / 8 in [1, 2) (subnormals: e = -6, m < 8).
struct Fp8Int {
  int m[256], e[256], neg[256];
  float val[256];
  Fp8Int() {
    for (int v = 0; v < 256; ++v) {
      val[v] = fp8e4m3_to_f32(uint8_t(v));
      const int ex = (v >> 3) & 15, mant = v & 7;
      m[v] = ex ? 8 + mant : mant;
      e[v] = (ex ? ex : 1) - 7;
      neg[v] = v >> 7;
    }
  }
};
inline const Fp8Int& fp8_int() {
  static const Fp8Int t;
  return t;
}

// One wgmma k32 step of one output, c + sum a[i] * b[i] over e4m3 codes (finite), in the Hopper
// fp8 arithmetic: each product (m_a m_b / 64 at exponent e_a + e_b) and c are truncated toward
// zero to 13 fraction bits at the largest exponent among them, summed exactly, and the sum is
// truncated to 13 fraction bits.
inline float hopper_mma_step(const uint8_t* a, const uint8_t* b, int n, float c) {
  const Fp8Int& t = fp8_int();
  int emax = INT32_MIN;
  int ec = 0;
  int64_t mc = 0;
  if (c != 0.0f) {
    uint32_t bits;
    std::memcpy(&bits, &c, 4);
    const int be = int((bits >> 23) & 255);
    mc = int64_t((bits & 0x7fffff) | (be ? 0x800000u : 0u));
    ec = (be ? be : 1) - 127;
    if (bits >> 31) mc = -mc;
    emax = ec;
  }
  for (int i = 0; i < n; ++i)
    if (t.m[a[i]] && t.m[b[i]]) emax = std::max(emax, t.e[a[i]] + t.e[b[i]]);
  if (emax == INT32_MIN) return 0.0f;
  // Integer units of 2^(emax - 13).
  int64_t sum = 0;
  if (mc) {
    const int sh = emax - ec + 10;
    const int64_t mag = sh < 63 ? (mc < 0 ? -mc : mc) >> sh : 0;
    sum += mc < 0 ? -mag : mag;
  }
  for (int i = 0; i < n; ++i) {
    const int64_t prod = int64_t(t.m[a[i]]) * t.m[b[i]];
    if (!prod) continue;
    const int d = emax - (t.e[a[i]] + t.e[b[i]]);  // >= 0
    const int64_t mag = d <= 7 ? prod << (7 - d) : (d - 7 < 63 ? prod >> (d - 7) : 0);
    sum += (t.neg[a[i]] ^ t.neg[b[i]]) ? -mag : mag;
  }
  if (sum == 0) return 0.0f;
  uint64_t mag = uint64_t(sum < 0 ? -sum : sum);
  const int lead = 63 - __builtin_clzll(mag);
  if (lead > 13) mag = mag >> (lead - 13) << (lead - 13);
  const double v = std::ldexp(double(mag), emax - 13);
  return float(sum < 0 ? -v : v);
}

// The temporary of one 128-k block: k32 steps over codes a[0 .. n) . b[0 .. n) (n <= 128; the
// kernels' copies read zeros past the end).
inline float mma_block(const uint8_t* a, const uint8_t* b, int n, MmaModel model) {
  if (model == MmaModel::kExact) {
    const float* val = fp8_int().val;
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += double(val[a[i]]) * double(val[b[i]]);
    return float(s);
  }
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += 32) acc = hopper_mma_step(a + k0, b + k0, std::min(32, n - k0), acc);
  return acc;
}

// The device's SwiGLU-OAI (elementwise.cuh) with the same fp32 roundings.
inline float swiglu_device(float g, float u, float alpha, float limit, float beta) {
  g = g > limit ? limit : g;
  u = u > limit ? limit : (u < -limit ? -limit : u);
  const volatile float ag = alpha * g;
  const volatile float sig = 1.0f / (1.0f + std::exp(-ag));
  const volatile float gs = g * sig;
  const volatile float ub = u + beta;
  return gs * ub;
}

// What the kernels compute for a case: the output and, by pair (token * topk + slot), the
// quantized SwiGLU rows, their scales and the bf16 expert rows (pairs whose id is not an expert
// keep NaN / 0x7f poison).
struct MoeFp8Emulated {
  TypedBuffer out;
  std::vector<uint8_t> act_q;    // [pairs, I]
  std::vector<float> act_scale;  // [pairs, ceil(I / 128)]
  std::vector<uint16_t> y;       // [pairs, H] bf16
};

// Deliberate faults for the check's own test: 1 the k block of the down product's weight scales
// off by one, 2 two units' gate rows exchanged.
inline MoeFp8Emulated emulate_moe_fp8(const MoeCaseData& c, MmaModel model, int fault = 0) {
  const MoeShape& s = c.s;
  const int64_t T = s.T, H = s.H, I = s.I;
  const int E = s.E, K = s.K, br = s.br;
  const int gh = int((H + 127) / 128), gi = int((I + 127) / 128);
  const ops::MoeExpertsParams p = c.params();
  // x quantized per token (bit for bit the device quantizer) as fp8 values and scales.
  std::vector<uint8_t> xq(size_t(T * H));
  std::vector<float> xs(size_t(T * gh));
  {
    std::vector<float> row(static_cast<size_t>(H));
    std::vector<uint8_t> q(static_cast<size_t>(H));
    for (int64_t t = 0; t < T; ++t) {
      if (s.fp8_x) {
        for (int64_t k = 0; k < H; ++k) q[size_t(k)] = static_cast<const uint8_t*>(c.x.data())[t * H + k];
        for (int g = 0; g < gh; ++g) xs[size_t(t * gh + g)] = c.x_scale[size_t(t * gh + g)];
      } else {
        for (int64_t k = 0; k < H; ++k) row[size_t(k)] = c.x.get(size_t(t * H + k));
        cpu::quantize_row_fp8(row.data(), H, q.data(), &xs[size_t(t * gh)]);
      }
      std::copy(q.begin(), q.end(), xq.begin() + t * H);
    }
  }

  MoeFp8Emulated r;
  const int64_t pairs = T * K;
  r.act_q.assign(size_t(pairs * I), 0x7f);
  r.act_scale.assign(size_t(pairs * gi), kNaN);
  r.y.assign(size_t(pairs * H), 0x7fc0);

  // The sort: each expert's pairs in pair order (the kernels' order within an expert is
  // arbitrary and must not matter).
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E));
  for (int64_t q = 0; q < pairs; ++q) {
    const int e = c.ids[size_t(q)];
    if (e >= 0 && e < E) rows_of[size_t(e)].push_back(q);
  }
  std::vector<float> gu_val(static_cast<size_t>(2 * I));
  std::vector<uint8_t> col(128);
  for (int e = 0; e < E; ++e) {
    if (rows_of[size_t(e)].empty()) continue;
    const auto* wgu = static_cast<const uint8_t*>(c.gu[size_t(e)].data());
    const auto* wdn = static_cast<const uint8_t*>(c.dn[size_t(e)].data());
    const std::vector<float>& sgu = c.gu_scale[size_t(e)];
    const std::vector<float>& sdn = c.dn_scale[size_t(e)];
    for (int64_t q : rows_of[size_t(e)]) {
      const int64_t t = q / K;
      // gate_up, by 256-row weight blocks of [gate | up] rows as the kernels permute them.
      for (int rb = 0; rb < gi; ++rb) {
        std::vector<float> v(128, 0.0f);
        for (int cc = 0; cc < 256; ++cc) {
          bool valid;
          int n = cuda::moe_fp8::gate_up_row(rb, cc, int(I), valid);
          if (!valid) continue;
          if (fault == 2 && n == 0) n = 1;
          else if (fault == 2 && n == 1) n = 0;
          float fin = 0.0f;
          for (int kb = 0; kb < gh; ++kb) {
            const int len = int(std::min<int64_t>(128, H - int64_t(kb) * 128));
            const float acc = mma_block(&xq[size_t(t * H + int64_t(kb) * 128)], &wgu[size_t(n * H + int64_t(kb) * 128)],
                                        len, model);
            const float sc = sgu[size_t((n / br) * gh + kb)] * xs[size_t(t * gh + kb)];
            fin = std::fma(acc, sc, fin);
          }
          // Column cc of the block: unit rb * 128 + 64 (cc / 128) + cc % 64; gate below 64.
          const int unit = (cc >> 7) * 64 + (cc & 63);
          gu_val[size_t(((cc >> 6) & 1) * 128 + unit)] = fin;
        }
        float amax = 0.0f;
        for (int u = 0; u < 128; ++u) {
          if (rb * 128 + u >= I) break;
          v[size_t(u)] = swiglu_device(gu_val[size_t(u)], gu_val[size_t(128 + u)], p.alpha, p.limit, p.beta);
          amax = std::max(amax, std::fabs(v[size_t(u)]));
        }
        const float scale = amax == 0.0f ? 1.0f : amax / 448.0f;
        r.act_scale[size_t(q * gi + rb)] = scale;
        for (int u = 0; u < 128 && rb * 128 + u < I; ++u)
          r.act_q[size_t(q * I + rb * 128 + u)] = f32_to_fp8e4m3(v[size_t(u)] / scale);
      }
      // down
      for (int64_t d = 0; d < H; ++d) {
        float fin = 0.0f;
        for (int kb = 0; kb < gi; ++kb) {
          const int len = int(std::min<int64_t>(128, I - int64_t(kb) * 128));
          for (int u = 0; u < len; ++u) col[size_t(u)] = r.act_q[size_t(q * I + kb * 128 + u)];
          const float acc = mma_block(col.data(), &wdn[size_t(d * I + int64_t(kb) * 128)], len, model);
          const int skb = fault == 1 ? (kb + 1) % gi : kb;
          const float sc = sdn[size_t((d / br) * gi + skb)] * r.act_scale[size_t(q * gi + kb)];
          fin = std::fma(acc, sc, fin);
        }
        r.y[size_t(q * H + d)] = f32_to_bf16(fin);
      }
    }
  }
  // combine: per token its slots in expert-id order, fp32 sum of weight x row, one rounding.
  r.out = c.out0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> order;
    for (int j = 0; j < K; ++j) {
      const int e = c.ids[size_t(t * K + j)];
      if (e >= 0 && e < E) order.push_back(j);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return c.ids[size_t(t * K + a)] < c.ids[size_t(t * K + b)]; });
    if (order.empty()) continue;
    for (int64_t d = 0; d < H; ++d) {
      float sum = 0.0f;
      for (int j : order) {
        const volatile float term = c.weights[size_t(t * K + j)] * bf16_to_f32(r.y[size_t((t * K + j) * H + d)]);
        sum = sum + term;
      }
      const size_t o = size_t(t * H + d);
      r.out.set(o, r.out.get(o) + sum);
    }
  }
  return r;
}

// fp8 e4m3 neighbours of z: the largest finite value <= z and the smallest >= z (saturating
// at +-448, as the quantizer does).
inline float fp8_floor(double z) {
  if (z >= 448.0) return 448.0f;
  if (z <= -448.0) return -448.0f;
  const float r = round_fp8e4m3(float(z));
  if (double(r) <= z) return r;
  // The next value below r: codes are monotone in magnitude.
  const uint8_t b = f32_to_fp8e4m3(r);
  if (r > 0.0f) return fp8e4m3_to_f32(uint8_t(b - 1));
  return r == 0.0f ? -fp8e4m3_to_f32(0x01) : fp8e4m3_to_f32(uint8_t(b + 1));
}
inline float fp8_ceil(double z) { return -fp8_floor(-z); }

struct MoeFp8CheckStats {
  int64_t units = 0, off_rounding = 0;  // stage A: units checked, units not at the exact value's rounding
  double worst_b = 0;                   // stage B: the largest |error| / bound
};

// Row n of a dequantized FP8 matrix [rows, cols] (exact, in double).
inline void dequant_row(const TypedBuffer& m, const std::vector<float>& sc, int br, int64_t n, int64_t cols,
                        double* out) {
  const auto* q = static_cast<const uint8_t*>(m.data()) + n * cols;
  const float* srow = &sc[size_t((n / br) * ((cols + 127) / 128))];
  const float* val = fp8_int().val;
  for (int64_t k = 0; k < cols; ++k) out[k] = double(val[q[k]]) * double(srow[k / 128]);
}

// The two-stage check described at the top. act_q [pairs, I] and act_scale [pairs, gi] by pair;
// `out` the result. Returns the first few failures ("" when it passes); stats when set. Needs
// FP8 weights with 128-column scale blocks (what the CUDA kernels take).
inline std::string check_moe_fp8(const MoeCaseData& c, const TypedBuffer& out, const uint8_t* act_q,
                                 const float* act_scale, MoeFp8CheckStats* stats = nullptr) {
  const MoeShape& s = c.s;
  const int64_t T = s.T, H = s.H, I = s.I;
  const int E = s.E, K = s.K;
  const int gi = int((I + 127) / 128);
  const ops::MoeExpertsParams p = c.params();
  std::string why;
  int bad = 0;
  auto fail = [&](const std::string& m) {
    if (bad++ < 6) why += m + "; ";
  };
  MoeFp8CheckStats st;
  // x as the kernels quantize it, exactly.
  std::vector<double> xr(size_t(T * H));
  {
    std::vector<float> row(static_cast<size_t>(H));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < H; ++k) row[size_t(k)] = float(c.xval(t, k));
      if (!s.fp8_x) MoeCaseData::qdq(row);
      for (int64_t k = 0; k < H; ++k) xr[size_t(t * H + k)] = row[size_t(k)];
    }
  }
  std::vector<double> want(size_t(T * H)), sum_abs(size_t(T * H), 0.0), rows_abs(size_t(T * H), 0.0);
  for (size_t i = 0; i < want.size(); ++i) want[i] = c.out0.get(i);
  std::vector<bool> touched(size_t(T), false);
  std::vector<double> wrow(static_cast<size_t>(std::max(H, I)));
  for (int e = 0; e < E; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t q = 0; q < T * K; ++q)
      if (c.ids[size_t(q)] == e) pairs.push_back(q);
    if (pairs.empty()) continue;
    const int64_t np = int64_t(pairs.size());
    // Stage A: the exact SwiGLU rows of the expert's pairs, then the result's quantization.
    std::vector<double> g(size_t(np * I)), up(size_t(np * I));
    for (int64_t n = 0; n < 2 * I; ++n) {
      dequant_row(c.gu[size_t(e)], c.gu_scale[size_t(e)], s.br, n, H, wrow.data());
      for (int64_t i = 0; i < np; ++i) {
        const double* x = &xr[size_t((pairs[size_t(i)] / K) * H)];
        double acc = 0;
        for (int64_t k = 0; k < H; ++k) acc += x[k] * wrow[size_t(k)];
        (n < I ? g : up)[size_t(i * I + n % I)] = acc;
      }
    }
    std::vector<double> a(size_t(np * I));
    for (int64_t i = 0; i < np; ++i) {
      const int64_t q = pairs[size_t(i)];
      touched[size_t(q / K)] = true;
      std::vector<double> v(static_cast<size_t>(I));
      for (int64_t u = 0; u < I; ++u) {
        const double gg = std::min(g[size_t(i * I + u)], double(p.limit));
        const double uu = std::clamp(up[size_t(i * I + u)], -double(p.limit), double(p.limit));
        v[size_t(u)] = gg / (1.0 + std::exp(-double(p.alpha) * gg)) * (uu + double(p.beta));
      }
      for (int gq = 0; gq < gi; ++gq) {
        const int64_t u0 = gq * 128, u1 = std::min<int64_t>(I, u0 + 128);
        double amax = 0;
        for (int64_t u = u0; u < u1; ++u) amax = std::max(amax, std::fabs(v[size_t(u)]));
        const double want_scale = amax == 0 ? 1.0 : amax / 448.0;
        const double got_scale = act_scale[size_t(q * gi + gq)];
        if (!(std::fabs(got_scale - want_scale) <= 0x1p-7 * want_scale))
          fail("pair " + std::to_string(q) + " group " + std::to_string(gq) + ": scale " + std::to_string(got_scale) +
               " want " + std::to_string(want_scale));
        for (int64_t u = u0; u < u1; ++u) {
          // Rounding errors of the sums move a value by a little of the group's largest.
          const double z = v[size_t(u)] / want_scale, tol = 0x1p-6 * std::fabs(z) + 0x1p-8 * 448.0;
          const float gq8 = fp8e4m3_to_f32(act_q[size_t(q * I + u)]);
          ++st.units;
          if (gq8 != round_fp8e4m3(float(z))) ++st.off_rounding;
          if (!(gq8 >= fp8_floor(z - tol) && gq8 <= fp8_ceil(z + tol)))
            fail("pair " + std::to_string(q) + " unit " + std::to_string(u) + ": fp8 " + std::to_string(gq8) + " for " +
                 std::to_string(z));
          a[size_t(i * I + u)] = double(gq8) * got_scale;
        }
      }
    }
    // Stage B terms: the result's activations times the exact down rows.
    for (int64_t d = 0; d < H; ++d) {
      dequant_row(c.dn[size_t(e)], c.dn_scale[size_t(e)], s.br, d, I, wrow.data());
      for (int64_t i = 0; i < np; ++i) {
        const int64_t q = pairs[size_t(i)], t = q / K;
        double y = 0, abs_terms = 0;
        for (int64_t u = 0; u < I; ++u) {
          const double term = a[size_t(i * I + u)] * wrow[size_t(u)];
          y += term;
          abs_terms += std::fabs(term);
        }
        const double w = c.weights[size_t(q)];
        want[size_t(t * H + d)] += w * y;
        sum_abs[size_t(t * H + d)] += std::fabs(w) * abs_terms;
        rows_abs[size_t(t * H + d)] += std::fabs(w * y);
      }
    }
  }
  if (st.units > 0 && st.off_rounding * 10 > st.units)
    fail(std::to_string(st.off_rounding) + " of " + std::to_string(st.units) +
         " fp8 activations are not the exact value's rounding");
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < H; ++d) {
      const size_t i = size_t(t * H + d);
      const double got = out.get(i);
      if (!touched[size_t(t)]) {
        if (!(got == c.out0.get(i))) fail("row of an unrouted token changed at " + std::to_string(i));
        continue;
      }
      const double out_ulp = s.out_dtype() == DType::BF16 ? std::fabs(want[i]) / 256 : std::fabs(want[i]) * 0x1p-23;
      const double bound = 0x1p-10 * sum_abs[i] + 0x1p-8 * rows_abs[i] + out_ulp + 1e-6;
      const double err = std::fabs(got - want[i]);
      st.worst_b = std::max(st.worst_b, err / bound);
      if (!(err <= bound))
        fail("out[" + std::to_string(t) + "," + std::to_string(d) + "] " + std::to_string(got) + " want " +
             std::to_string(want[i]) + " (bound " + std::to_string(bound) + ")");
    }
  }
  if (bad > 6) why += std::to_string(bad - 6) + " more";
  if (stats) *stats = st;
  return why;
}

}  // namespace sieve::test
