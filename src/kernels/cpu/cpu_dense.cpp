// CPU reference of the dense ops: matmul, embedding, rms_norm, add, swiglu_oai, moe_route,
// moe_experts (kernels/ops.h has the contract; docs/kernels.md "CPU reference ops" summarises it).
//
// Precision: inputs are converted exactly to fp32; arithmetic is fp32 (matmul: fp32 products
// and fp32 accumulation in 8 lanes per output, summed pairwise at the end; rms_norm: sum of
// squares in double); the only rounding is the store to the output dtype (BF16 outputs round
// once, at the store).
//
// Readings of the contract chosen here:
// - rms_norm with residual: the sum x + residual is stored into residual (rounded to x_dtype)
//   and the norm is taken of that stored value (the "residual add in the model dtype" of
//   vLLM's fused_add_rms_norm). y may alias x.
// - swiglu_oai: min/clamp propagate NaN (as torch.clamp does).
// - moe_route: sigmoid in fp32; ranking by s + bias descending, ties (and NaN, ranked as -inf)
//   to the lower expert id; weights are the unbiased s of the chosen experts, divided by their
//   fp32 sum when renormalize (no epsilon), times scaling.
// - moe_experts: ids outside [0, num_experts) are skipped (expert-parallel style "not mine").
//   Intermediates (gate_up output, swiglu output, down output) stay fp32; the weighted
//   contributions of one token are summed in fp32 in expert-id order and added to out once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_parallel.h"

namespace sieve::cpu {

namespace {

void convert_row(const void* src, DType t, size_t offset, int64_t n, float* dst) {
  if (t == DType::F32) {
    std::memcpy(dst, static_cast<const float*>(src) + offset, size_t(n) * sizeof(float));
  } else if (t == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_from_bits(uint32_t(s[i]) << 16);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, offset + size_t(i));
  }
}

inline float reduce8(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// out[r] = <x, w_r> for 4 rows of w: 8 fp32 lanes per row, pairwise-summed, then the k % 8 tail.
inline void dot4(const float* __restrict x, const float* __restrict w0, const float* __restrict w1,
                 const float* __restrict w2, const float* __restrict w3, int64_t k, float* out) {
  float a0[8] = {}, a1[8] = {}, a2[8] = {}, a3[8] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const float xv = x[i + l];
      a0[l] += xv * w0[i + l];
      a1[l] += xv * w1[i + l];
      a2[l] += xv * w2[i + l];
      a3[l] += xv * w3[i + l];
    }
  }
  float s0 = reduce8(a0), s1 = reduce8(a1), s2 = reduce8(a2), s3 = reduce8(a3);
  for (; i < k; ++i) {
    s0 += x[i] * w0[i];
    s1 += x[i] * w1[i];
    s2 += x[i] * w2[i];
    s3 += x[i] * w3[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

inline float dot1(const float* __restrict x, const float* __restrict w, int64_t k) {
  float a[8] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int l = 0; l < 8; ++l) a[l] += x[i + l] * w[i + l];
  }
  float s = reduce8(a);
  for (; i < k; ++i) s += x[i] * w[i];
  return s;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

// ---------------------------------------------------------------------------------------------

void run_matmul(const ops::MatmulParams& p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  if (m <= 0 || n <= 0) return;
  SIEVE_CHECK(p.y != nullptr && (k == 0 || (p.x && p.w)), "matmul: null operand");
  SIEVE_CHECK(k >= 0 && p.ldx >= k && p.ldy >= n, "matmul: bad k or row strides");
  SIEVE_CHECK(p.y_dtype == DType::F32 || p.y_dtype == DType::BF16 || p.y_dtype == DType::F16,
              "matmul: y must be F32, BF16 or F16");

  // x as fp32 rows (pointer into x when it already is fp32).
  std::vector<float> xbuf;
  const float* X = nullptr;
  int64_t xs = p.ldx;
  if (k > 0) {
    if (p.x_dtype == DType::F32) {
      X = static_cast<const float*>(p.x);
    } else {
      xbuf.resize(size_t(m * k));
      for (int64_t i = 0; i < m; ++i) convert_row(p.x, p.x_dtype, size_t(i * p.ldx), k, &xbuf[size_t(i * k)]);
      X = xbuf.data();
      xs = k;
    }
  }

  constexpr int64_t kTile = 8;  // rows of w converted and kept hot at a time
  auto store = [&](int64_t i, int64_t j, float v) {
    const size_t idx = size_t(i * p.ldy + j);
    if (p.y_dtype == DType::F32) {
      float* y = static_cast<float*>(p.y);
      y[idx] = p.accumulate ? y[idx] + v : v;
    } else {
      store_from_f32(p.y, p.y_dtype, idx, p.accumulate ? load_as_f32(p.y, p.y_dtype, idx) + v : v);
    }
  };
  auto work = [&](int64_t n0, int64_t n1) {
    std::vector<float> wbuf;
    if (p.w_dtype != DType::F32) wbuf.resize(size_t(kTile * k));
    for (int64_t j0 = n0; j0 < n1; j0 += kTile) {
      const int64_t nt = std::min(kTile, n1 - j0);
      const float* W;
      if (k == 0) {
        W = nullptr;
      } else if (p.w_dtype == DType::F32) {
        W = static_cast<const float*>(p.w) + j0 * k;
      } else {
        for (int64_t r = 0; r < nt; ++r) convert_row(p.w, p.w_dtype, size_t((j0 + r) * k), k, &wbuf[size_t(r * k)]);
        W = wbuf.data();
      }
      for (int64_t i = 0; i < m; ++i) {
        const float* xr = k > 0 ? X + i * xs : nullptr;
        int64_t r = 0;
        float out[4];
        for (; r + 4 <= nt; r += 4) {
          dot4(xr, W + r * k, W + (r + 1) * k, W + (r + 2) * k, W + (r + 3) * k, k, out);
          for (int c = 0; c < 4; ++c) store(i, j0 + r + c, out[c]);
        }
        for (; r < nt; ++r) store(i, j0 + r, k > 0 ? dot1(xr, W + r * k, k) : 0.0f);
      }
    }
  };
  detail::parallel_for(n, double(m) * double(n) * double(k), work, kTile);
}

void run_embedding(const ops::EmbeddingParams& p) {
  if (p.num_tokens <= 0) return;
  SIEVE_CHECK(p.ids && p.table && p.out, "embedding: null operand");
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t id = p.ids[t];
    SIEVE_CHECK(id >= 0 && id < p.vocab, "embedding: token id " + std::to_string(id) +
                                             " is outside the vocabulary of " +
                                             std::to_string(p.vocab));
    for (int64_t d = 0; d < p.hidden; ++d) {
      store_from_f32(p.out, p.out_dtype, size_t(t * p.hidden + d),
                     load_as_f32(p.table, p.table_dtype, size_t(id * p.hidden + d)));
    }
  }
}

void run_rms_norm(const ops::RmsNormParams& p) {
  if (p.rows <= 0 || p.dim <= 0) return;
  SIEVE_CHECK(p.x && p.y && p.weight, "rms_norm: x, y and weight are required");
  SIEVE_CHECK(p.ldx >= p.dim && p.ldy >= p.dim && (!p.residual || p.ldr >= p.dim),
              "rms_norm: row strides must be >= dim");
  const int64_t dim = p.dim;
  std::vector<float> v(static_cast<size_t>(dim)), w(static_cast<size_t>(dim));
  for (int64_t d = 0; d < dim; ++d) {
    const float wd = load_as_f32(p.weight, p.weight_dtype, size_t(d));
    w[size_t(d)] = p.gemma ? 1.0f + wd : wd;
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t d = 0; d < dim; ++d) v[size_t(d)] = load_as_f32(p.x, p.x_dtype, size_t(r * p.ldx + d));
    if (p.residual) {
      for (int64_t d = 0; d < dim; ++d) {
        const size_t idx = size_t(r * p.ldr + d);
        store_from_f32(p.residual, p.x_dtype, idx, v[size_t(d)] + load_as_f32(p.residual, p.x_dtype, idx));
        v[size_t(d)] = load_as_f32(p.residual, p.x_dtype, idx);
      }
    }
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(v[size_t(d)]) * double(v[size_t(d)]);
    const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + p.eps);
    for (int64_t d = 0; d < dim; ++d) {
      store_from_f32(p.y, p.y_dtype, size_t(r * p.ldy + d), (v[size_t(d)] * inv) * w[size_t(d)]);
    }
  }
}

void run_add(const ops::AddParams& p) {
  if (p.n <= 0) return;
  SIEVE_CHECK(p.x && p.y, "add: null operand");
  if (p.dtype == DType::F32) {
    float* y = static_cast<float*>(p.y);
    const float* x = static_cast<const float*>(p.x);
    for (int64_t i = 0; i < p.n; ++i) y[i] += p.alpha * x[i];
    return;
  }
  for (int64_t i = 0; i < p.n; ++i) {
    store_from_f32(p.y, p.dtype, size_t(i),
                   load_as_f32(p.y, p.dtype, size_t(i)) + p.alpha * load_as_f32(p.x, p.dtype, size_t(i)));
  }
}

void run_swiglu_oai(const ops::SwigluOaiParams& p) {
  if (p.rows <= 0 || p.inter <= 0) return;
  SIEVE_CHECK(p.gate_up && p.out, "swiglu_oai: null operand");
  SIEVE_CHECK(p.ld_in >= 2 * p.inter && p.ld_out >= p.inter, "swiglu_oai: bad row strides");
  const float lim = p.limit;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.inter; ++i) {
      float g = load_as_f32(p.gate_up, p.dtype, size_t(r * p.ld_in + i));
      float u = load_as_f32(p.gate_up, p.dtype, size_t(r * p.ld_in + p.inter + i));
      g = g > lim ? lim : g;                           // min(gate, limit), NaN stays NaN
      u = u > lim ? lim : (u < -lim ? -lim : u);       // clamp(up, -limit, limit)
      const float o = g * sigmoidf(p.alpha * g) * (u + p.beta);
      store_from_f32(p.out, p.dtype, size_t(r * p.ld_out + i), o);
    }
  }
}

void run_moe_route(const ops::MoeRouteParams& p) {
  if (p.num_tokens <= 0) return;
  SIEVE_CHECK(p.logits && p.ids && p.weights, "moe_route: null operand");
  SIEVE_CHECK(p.num_experts > 0 && p.topk > 0 && p.topk <= p.num_experts,
              "moe_route: need 0 < topk <= num_experts");
  const int E = p.num_experts, K = p.topk;
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int e = 0; e < E; ++e) {
      s[size_t(e)] = sigmoidf(p.logits[t * E + e]);
      float c = s[size_t(e)] + (p.bias ? p.bias[e] : 0.0f);
      choice[size_t(e)] = std::isnan(c) ? -std::numeric_limits<float>::infinity() : c;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      if (choice[size_t(a)] != choice[size_t(b)]) return choice[size_t(a)] > choice[size_t(b)];
      return a < b;
    });
    float sum = 0;
    for (int j = 0; j < K; ++j) sum += s[size_t(order[size_t(j)])];
    for (int j = 0; j < K; ++j) {
      const int32_t e = order[size_t(j)];
      float w = s[size_t(e)];
      if (p.renormalize) w = w / sum;
      p.ids[t * K + j] = e;
      p.weights[t * K + j] = w * p.scaling;
    }
  }
}

void run_moe_experts(const ops::MoeExpertsParams& p) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return;
  SIEVE_CHECK(p.x && p.out && p.ids && p.weights && p.w_gate_up && p.w_down,
              "moe_experts: null operand");
  SIEVE_CHECK(p.inter > 0 && p.topk > 0 && p.num_experts > 0, "moe_experts: bad sizes");
  const int64_t H = p.hidden, I = p.inter, T = p.num_tokens;
  std::vector<float> sum(size_t(T * H), 0.0f);
  std::vector<float> X, GU, A, Y;
  std::vector<int64_t> tok;
  std::vector<float> wt;
  for (int e = 0; e < p.num_experts; ++e) {
    tok.clear();
    wt.clear();
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < p.topk; ++j) {
        if (p.ids[t * p.topk + j] == e) {
          tok.push_back(t);
          wt.push_back(p.weights[t * p.topk + j]);
        }
      }
    }
    if (tok.empty()) continue;
    SIEVE_CHECK(p.w_gate_up[e] && p.w_down[e], "moe_experts: missing weights of a routed expert");
    const int64_t c = int64_t(tok.size());
    X.resize(size_t(c * H));
    for (int64_t r = 0; r < c; ++r) convert_row(p.x, p.act_dtype, size_t(tok[size_t(r)] * H), H, &X[size_t(r * H)]);
    GU.resize(size_t(c * 2 * I));
    A.resize(size_t(c * I));
    Y.resize(size_t(c * H));
    ops::MatmulParams mm;
    mm.x = X.data();
    mm.x_dtype = DType::F32;
    mm.w = p.w_gate_up[e];
    mm.w_dtype = p.w_dtype;
    mm.y = GU.data();
    mm.y_dtype = DType::F32;
    mm.m = c;
    mm.n = 2 * I;
    mm.k = H;
    mm.ldx = H;
    mm.ldy = 2 * I;
    run_matmul(mm);
    ops::SwigluOaiParams sw;
    sw.gate_up = GU.data();
    sw.out = A.data();
    sw.dtype = DType::F32;
    sw.rows = c;
    sw.inter = I;
    sw.ld_in = 2 * I;
    sw.ld_out = I;
    sw.alpha = p.alpha;
    sw.limit = p.limit;
    sw.beta = p.beta;
    run_swiglu_oai(sw);
    mm.x = A.data();
    mm.w = p.w_down[e];
    mm.y = Y.data();
    mm.n = H;
    mm.k = I;
    mm.ldx = I;
    mm.ldy = H;
    run_matmul(mm);
    for (int64_t r = 0; r < c; ++r) {
      float* dst = &sum[size_t(tok[size_t(r)] * H)];
      const float w = wt[size_t(r)];
      for (int64_t d = 0; d < H; ++d) dst[d] += w * Y[size_t(r * H + d)];
    }
  }
  for (int64_t i = 0; i < T * H; ++i) {
    store_from_f32(p.out, p.act_dtype, size_t(i), load_as_f32(p.out, p.act_dtype, size_t(i)) + sum[size_t(i)]);
  }
}

}  // namespace sieve::cpu
