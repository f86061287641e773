// CPU reference of the dense ops: matmul, embedding, rms_norm, add, swiglu_oai (kernels/ops.h has
// the contract; docs/kernels.md "CPU reference ops" summarises it; the MoE ops are in cpu_moe.cpp).
//
// Precision: inputs are converted exactly to fp32; arithmetic is fp32 (matmul: fp32 products
// and fp32 accumulation in 8 lanes per output, lane l taking k = l mod 8, lanes summed pairwise,
// then the k % 8 tail; the result does not depend on blocking or threads; rms_norm: sum of
// squares in double); the only rounding is the store to the output dtype (BF16 outputs round
// once, at the store).
//
// Readings of the contract chosen here:
// - rms_norm with residual: the sum x + residual is stored into residual (rounded to its dtype:
//   x_dtype, or F32 with residual_f32) and the norm is taken of that stored value (the "residual
//   add in the model dtype" of vLLM's fused_add_rms_norm). y may alias x.
// - swiglu_oai: min/clamp propagate NaN (as torch.clamp does).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_parallel.h"

// v8f values only pass between inline functions of this file, so the AVX ABI note is moot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

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

// 8 fp32 lanes (GCC/Clang vector extension; two SSE registers on baseline x86-64, one on AVX).
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float reduce8(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Every (x row, w row) dot product has the same arithmetic whatever the blocking: lane l sums
// x[i] * w[i] for i = l mod 8 over the full groups of 8 in order, the lanes are summed pairwise,
// then the k % 8 tail is added in order. So results do not depend on m, n, tiling or threads.
template <int R, int C>
inline void dot_block(const float* const* x, const float* const* w, int64_t k, float* out,
                      int64_t out_stride) {
  v8f acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = v8f{};
  }
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    v8f wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load8(w[c] + i);
    for (int r = 0; r < R; ++r) {
      const v8f xv = load8(x[r] + i);
      for (int c = 0; c < C; ++c) acc[r][c] += xv * wv[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = reduce8(acc[r][c]);
      for (int64_t j = i; j < k; ++j) s += x[r][j] * w[c][j];
      out[r * out_stride + c] = s;
    }
  }
}

// Dots of every x row with `nt` rows of W (a tile): res[i * nt + r] = <x_i, w_r>. Built for
// AVX2 and baseline x86-64 (chosen at load time) where GCC supports it; the arithmetic is the
// same in both (no FMA contraction in ISO C++ mode), so results are identical.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx2", "default")))
#endif
void tile_dots(const float* X, int64_t xs, int64_t m, const float* W, int64_t nt, int64_t k,
               float* res) {
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) {
    const float* xr[2] = {X + i * xs, X + (i + 1) * xs};
    int64_t r = 0;
    for (; r + 4 <= nt; r += 4) {
      const float* wr[4] = {W + r * k, W + (r + 1) * k, W + (r + 2) * k, W + (r + 3) * k};
      dot_block<2, 4>(xr, wr, k, res + i * nt + r, nt);
    }
    for (; r < nt; ++r) {
      const float* wr[1] = {W + r * k};
      dot_block<2, 1>(xr, wr, k, res + i * nt + r, nt);
    }
  }
  for (; i < m; ++i) {
    const float* xr[1] = {X + i * xs};
    int64_t r = 0;
    for (; r + 4 <= nt; r += 4) {
      const float* wr[4] = {W + r * k, W + (r + 1) * k, W + (r + 2) * k, W + (r + 3) * k};
      dot_block<1, 4>(xr, wr, k, res + i * nt + r, nt);
    }
    for (; r < nt; ++r) {
      const float* wr[1] = {W + r * k};
      dot_block<1, 1>(xr, wr, k, res + i * nt + r, nt);
    }
  }
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
    std::vector<float> res(size_t(m * kTile));
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
      if (k > 0) {
        tile_dots(X, xs, m, W, nt, k, res.data());
      } else {
        std::fill(res.begin(), res.end(), 0.0f);
      }
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < nt; ++r) store(i, j0 + r, res[size_t(i * nt + r)]);
      }
    }
  };
  detail::parallel_for(n, double(m) * double(n) * double(k), work, kTile);
}

void run_embedding(const ops::EmbeddingParams& p) {
  if (p.num_tokens <= 0) return;
  SIEVE_CHECK(p.ids && p.table && p.out, "embedding: null operand");
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t id = int64_t(p.ids[t]) - (p.shard ? p.vocab0 : 0);
    const bool here = id >= 0 && id < p.vocab;
    SIEVE_CHECK(here || p.shard, "embedding: token id " + std::to_string(id) + " is outside the vocabulary of " +
                                     std::to_string(p.vocab));
    for (int64_t d = 0; d < p.hidden; ++d) {
      store_from_f32(p.out, p.out_dtype, size_t(t * p.hidden + d),
                     here ? load_as_f32(p.table, p.table_dtype, size_t(id * p.hidden + d)) : 0.0f);
    }
  }
}

void run_rms_norm(const ops::RmsNormParams& p) {
  if (p.rows <= 0 || p.dim <= 0) return;
  SIEVE_CHECK(p.x && p.y && p.weight, "rms_norm: x, y and weight are required");
  SIEVE_CHECK(p.ldx >= p.dim && p.ldy >= p.dim && (!p.residual || p.ldr >= p.dim),
              "rms_norm: row strides must be >= dim");
  const bool fp8 = p.y_dtype == DType::FP8_E4M3;
  SIEVE_CHECK(!fp8 || p.y_scale, "rms_norm: an F8_E4M3 y needs y_scale");
  SIEVE_CHECK(!p.y_fp8 || (!fp8 && p.y_fp8_scale && p.ld_fp8 >= p.dim && p.y != p.x),
              "rms_norm: y_fp8 needs y_fp8_scale, ld_fp8 >= dim and a y that is neither x nor FP8");
  const int64_t dim = p.dim;
  const DType rt = ops::rms_residual_dtype(p);
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
        store_from_f32(p.residual, rt, idx, v[size_t(d)] + load_as_f32(p.residual, rt, idx));
        v[size_t(d)] = load_as_f32(p.residual, rt, idx);
      }
    }
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(v[size_t(d)]) * double(v[size_t(d)]);
    const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + p.eps);
    if (fp8) {
      for (int64_t d = 0; d < dim; ++d) v[size_t(d)] = (v[size_t(d)] * inv) * w[size_t(d)];
      quantize_row_fp8(v.data(), dim, static_cast<uint8_t*>(p.y) + r * p.ldy, p.y_scale + r * ops::fp8_groups(dim));
      continue;
    }
    for (int64_t d = 0; d < dim; ++d) {
      store_from_f32(p.y, p.y_dtype, size_t(r * p.ldy + d), (v[size_t(d)] * inv) * w[size_t(d)]);
    }
    if (p.y_fp8) {
      for (int64_t d = 0; d < dim; ++d) v[size_t(d)] = (v[size_t(d)] * inv) * w[size_t(d)];
      quantize_row_fp8(v.data(), dim, static_cast<uint8_t*>(p.y_fp8) + r * p.ld_fp8,
                       p.y_fp8_scale + r * ops::fp8_groups(dim));
    }
  }
}

void run_add(const ops::AddParams& p) {
  if (p.n <= 0) return;
  SIEVE_CHECK(p.x && p.y, "add: null operand");
  if (p.dtype == DType::F32) {
    float* y = static_cast<float*>(p.y);
    const float* x = static_cast<const float*>(p.x);
    if (p.assign)
      for (int64_t i = 0; i < p.n; ++i) y[i] = p.alpha * x[i];
    else
      for (int64_t i = 0; i < p.n; ++i) y[i] += p.alpha * x[i];
    return;
  }
  for (int64_t i = 0; i < p.n; ++i) {
    const float ax = p.alpha * load_as_f32(p.x, p.dtype, size_t(i));
    store_from_f32(p.y, p.dtype, size_t(i), p.assign ? ax : load_as_f32(p.y, p.dtype, size_t(i)) + ax);
  }
}

void run_swiglu_oai(const ops::SwigluOaiParams& p) {
  if (p.rows <= 0 || p.inter <= 0) return;
  SIEVE_CHECK(p.gate_up && p.out, "swiglu_oai: null operand");
  SIEVE_CHECK(p.ld_in >= 2 * p.inter && p.ld_out >= p.inter, "swiglu_oai: bad row strides");
  const float lim = p.limit;
  std::vector<float> row(p.out_scale ? size_t(p.inter) : 0);  // fp32 outputs of a row (FP8 out)
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t i = 0; i < p.inter; ++i) {
      float g = load_as_f32(p.gate_up, p.dtype, size_t(r * p.ld_in + i));
      float u = load_as_f32(p.gate_up, p.dtype, size_t(r * p.ld_in + p.inter + i));
      g = g > lim ? lim : g;                           // min(gate, limit), NaN stays NaN
      u = u > lim ? lim : (u < -lim ? -lim : u);       // clamp(up, -limit, limit)
      const float o = g * sigmoidf(p.alpha * g) * (u + p.beta);
      if (p.out_scale) row[size_t(i)] = o;
      else store_from_f32(p.out, p.dtype, size_t(r * p.ld_out + i), o);
    }
    if (p.out_scale)
      quantize_row_fp8(row.data(), p.inter, static_cast<uint8_t*>(p.out) + r * p.ld_out,
                       p.out_scale + r * ops::fp8_groups(p.inter));
  }
}

}  // namespace sieve::cpu
