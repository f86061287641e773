// CPU reference of the MoE ops: moe_route (with or without the fused router GEMM) and moe_experts
// (F32, BF16 and FP8_E4M3 expert weights). kernels/ops.h has the contract; docs/kernels.md
// "CPU reference ops" summarises it.
//
// Readings of the contract chosen here:
// - moe_route: sigmoid in fp32; ranking by s + bias descending, ties (and NaN, ranked as -inf)
//   to the lower expert id; weights are the unbiased s of the chosen experts, divided by their
//   fp32 sum when renormalize (no epsilon), times scaling. The fused router GEMM is run_matmul's
//   arithmetic (fp32 products and sums in its fixed order), so it gives the same logits as a
//   separate matmul.
// - moe_experts: ids outside [0, num_experts) are skipped (expert-parallel style "not mine").
//   Intermediates (gate_up output, swiglu output, down output) stay fp32; the weighted
//   contributions of one token are summed in fp32 in expert-id order and added to out once.
//   FP8 weights are dequantized exactly into fp32 (fp8 value times its block's multiplier, one
//   fp32 product: exact for power-of-two multipliers such as MXFP8's), for any block shape; FP8
//   x is dequantized the same way (value times its 1 x 128 group's scale). quantize_act rounds the
//   activations entering each product through the contract's 1 x 128 quantizer
//   (quantize_row_fp8), as the CUDA kernels must.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/moe_fp8_work.h"  // the CUDA MoE kernels' row order (plain C++), which the tiled scales follow

namespace sieve {
namespace {

// The tiled layout of a routed expert's (1, 128) scales (ops::fp8_scales_moe_tiled): row blocks of
// the kernels' 256 weight rows.
int64_t tiled_row_blocks(int64_t rows, bool gate_up) { return gate_up ? (rows / 2 + 127) / 128 : (rows + 255) / 256; }

// Every existing weight row's place in the tiled layout, in the kernels' own row order
// (moe_fp8_work.h: gate_up_row, down_row): f(tiled slot, row-major index) for each row and k block.
template <class F>
void for_each_tiled_scale(int64_t rows, int64_t cols, bool gate_up, F&& f) {
  const int64_t kb = ops::fp8_groups(cols);
  for (int64_t rb = 0; rb < tiled_row_blocks(rows, gate_up); ++rb)
    for (int c = 0; c < 256; ++c) {
      bool ok;
      const int64_t n = gate_up ? cuda::moe_fp8::gate_up_row(int(rb), c, int(rows / 2), ok)
                                : cuda::moe_fp8::down_row(int(rb), c, int(rows), ok);
      if (!ok) continue;
      for (int64_t b = 0; b < kb; ++b) f((rb * kb + b) * 256 + c, n * kb + b);
    }
}

}  // namespace
}  // namespace sieve

namespace sieve::cpu {

namespace {

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Rows of `src` (dtype t, row stride ld) as packed fp32 rows.
void rows_to_f32(const void* src, DType t, int64_t ld, const int64_t* rows, int64_t n, int64_t cols, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const size_t base = size_t(rows[r] * ld);
    float* d = dst + r * cols;
    if (t == DType::F32) {
      std::memcpy(d, static_cast<const float*>(src) + base, size_t(cols) * sizeof(float));
    } else {
      for (int64_t k = 0; k < cols; ++k) d[k] = load_as_f32(src, t, base + size_t(k));
    }
  }
}

// Each row of [rows, cols] (packed) replaced by its 1 x 128 quantization (the contract's
// quantizer) read back in fp32.
void quantize_dequantize_rows(float* x, int64_t rows, int64_t cols) {
  std::vector<uint8_t> q(static_cast<size_t>(cols));
  std::vector<float> sc(static_cast<size_t>(ops::fp8_groups(cols)));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    quantize_row_fp8(row, cols, q.data(), sc.data());
    for (int64_t k = 0; k < cols; ++k) row[k] = fp8e4m3_to_f32(q[size_t(k)]) * sc[size_t(k / ops::kFp8Group)];
  }
}

// One expert matrix [rows, cols] as packed fp32: F32 as it is, BF16 converted exactly and
// FP8_E4M3 dequantized exactly (the WeightView rule) into `out`.
// tiled: the scales are in the MoE kernels' tiled layout (ops::fp8_scales_moe_tiled, (1, 128)
// blocks; gate_up: which matrix), put back in row-major order in `scratch` first.
const float* matrix_as_f32(const void* w, const float* scale, DType t, int64_t rows, int64_t cols, int br, int bc,
                           bool tiled, bool gate_up, std::vector<float>& out, std::vector<float>& scratch) {
  if (t == DType::F32) return static_cast<const float*>(w);
  out.resize(size_t(rows * cols));
  if (tiled && scale) {
    scratch.resize(size_t(rows * ops::fp8_groups(cols)));
    for_each_tiled_scale(rows, cols, gate_up, [&](int64_t slot, int64_t i) { scratch[size_t(i)] = scale[slot]; });
    scale = scratch.data();
  }
  ops::WeightView v;
  v.data = w;
  v.dtype = t;
  v.rows = rows;
  v.cols = cols;
  v.scale = scale;
  v.scale_block_rows = br;
  v.scale_block_cols = bc;
  dequantize_weight_rows(v, 0, rows, out.data());
  return out.data();
}

// y[m, n] = x[m, k] . w[n, k]^T with fp32 operands (run_matmul's arithmetic).
void product(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y) {
  ops::MatmulParams mm;
  mm.x = x;
  mm.x_dtype = DType::F32;
  mm.w = w;
  mm.w_dtype = DType::F32;
  mm.y = y;
  mm.y_dtype = DType::F32;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.ldx = k;
  mm.ldy = n;
  run_matmul(mm);
}

}  // namespace

void run_moe_route(const ops::MoeRouteParams& p) {
  if (p.num_tokens <= 0) return;
  SIEVE_CHECK((p.logits || (p.x && p.gate)) && p.ids && p.weights, "moe_route: null operand");
  SIEVE_CHECK(p.num_experts > 0 && p.topk > 0 && p.topk <= p.num_experts,
              "moe_route: need 0 < topk <= num_experts");
  const int E = p.num_experts, K = p.topk;
  std::vector<float> fused;
  const float* logits = p.logits;
  if (!logits) {
    SIEVE_CHECK(p.hidden > 0 && p.ldx >= p.hidden, "moe_route: the fused router GEMM needs hidden and ldx");
    fused.resize(size_t(p.num_tokens * E));
    ops::MatmulParams mm;
    mm.x = p.x;
    mm.x_dtype = p.x_dtype;
    mm.w = p.gate;
    mm.w_dtype = DType::F32;
    mm.y = fused.data();
    mm.y_dtype = DType::F32;
    mm.m = p.num_tokens;
    mm.n = E;
    mm.k = p.hidden;
    mm.ldx = p.ldx;
    mm.ldy = E;
    run_matmul(mm);
    logits = fused.data();
  }
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int e = 0; e < E; ++e) {
      s[size_t(e)] = sigmoidf(logits[t * E + e]);
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
      p.ids[t * K + j] = e - p.id_offset;
      p.weights[t * K + j] = w * p.scaling;
    }
  }
}

void run_moe_experts(const ops::MoeExpertsParams& p) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return;
  SIEVE_CHECK(p.x && p.out && p.ids && p.weights && p.w_gate_up && p.w_down, "moe_experts: null operand");
  SIEVE_CHECK(p.inter > 0 && p.topk > 0 && p.num_experts > 0, "moe_experts: bad sizes");
  const bool fp8 = p.w_dtype == DType::FP8_E4M3;
  SIEVE_CHECK(p.w_dtype == DType::F32 || p.w_dtype == DType::BF16 || fp8,
              "moe_experts: weights must be F32, BF16 or FP8_E4M3");
  SIEVE_CHECK(p.act_dtype == DType::F32 || p.act_dtype == DType::BF16, "moe_experts: act_dtype must be F32 or BF16");
  if (fp8) {
    SIEVE_CHECK(p.w_gate_up_scale && p.w_down_scale, "moe_experts: FP8 weights need their scale arrays");
    SIEVE_CHECK(p.scale_block_rows > 0 && p.scale_block_cols > 0, "moe_experts: FP8 weights need a scale block shape");
    SIEVE_CHECK(!p.scale_tiled || (p.scale_block_rows == 1 && p.scale_block_cols == ops::kFp8Group),
                "moe_experts: tiled scales (scale_tiled) need (1, 128) blocks");
  }
  const int64_t H = p.hidden, I = p.inter, T = p.num_tokens;
  const int64_t xgroups = ops::fp8_groups(H);
  const bool quant = fp8 && p.quantize_act;
  std::vector<float> sum(size_t(T * H), 0.0f);
  std::vector<float> X, GU, A, Y, W, S;
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
    SIEVE_CHECK(p.w_gate_up[e] && p.w_down[e] && (!fp8 || (p.w_gate_up_scale[e] && p.w_down_scale[e])),
                "moe_experts: missing weights of a routed expert");
    const int64_t c = int64_t(tok.size());
    X.resize(size_t(c * H));
    if (p.x_scale) {
      const uint8_t* xq = static_cast<const uint8_t*>(p.x);
      for (int64_t r = 0; r < c; ++r) {
        const int64_t t = tok[size_t(r)];
        for (int64_t k = 0; k < H; ++k)
          X[size_t(r * H + k)] = fp8e4m3_to_f32(xq[t * H + k]) * p.x_scale[t * xgroups + k / ops::kFp8Group];
      }
    } else {
      rows_to_f32(p.x, p.act_dtype, H, tok.data(), c, H, X.data());
      if (quant) quantize_dequantize_rows(X.data(), c, H);
    }
    GU.resize(size_t(c * 2 * I));
    A.resize(size_t(c * I));
    Y.resize(size_t(c * H));
    product(X.data(), c, H,
            matrix_as_f32(p.w_gate_up[e], fp8 ? p.w_gate_up_scale[e] : nullptr, p.w_dtype, 2 * I, H,
                          p.scale_block_rows, p.scale_block_cols, p.scale_tiled, true, W, S),
            2 * I, GU.data());
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
    if (quant) quantize_dequantize_rows(A.data(), c, I);
    product(A.data(), c, I,
            matrix_as_f32(p.w_down[e], fp8 ? p.w_down_scale[e] : nullptr, p.w_dtype, H, I, p.scale_block_rows,
                          p.scale_block_cols, p.scale_tiled, false, W, S),
            H, Y.data());
    for (int64_t r = 0; r < c; ++r) {
      float* dst = &sum[size_t(tok[size_t(r)] * H)];
      const float w = wt[size_t(r)];
      for (int64_t d = 0; d < H; ++d) dst[d] += w * Y[size_t(r * H + d)];
    }
  }
  const DType ot = ops::moe_out_dtype(p);
  for (int64_t i = 0; i < T * H; ++i) {
    store_from_f32(p.out, ot, size_t(i), load_as_f32(p.out, ot, size_t(i)) + sum[size_t(i)]);
  }
}

}  // namespace sieve::cpu

namespace sieve::ops {

int64_t fp8_moe_tiled_size(int64_t rows, int64_t cols, bool gate_up) {
  return tiled_row_blocks(rows, gate_up) * fp8_groups(cols) * 256;
}

std::vector<float> fp8_scales_moe_tiled(const float* scale, int64_t rows, int64_t cols, bool gate_up) {
  SIEVE_CHECK(!gate_up || rows % 2 == 0, "fp8_scales_moe_tiled: gate_up has an even row count");
  std::vector<float> out(size_t(fp8_moe_tiled_size(rows, cols, gate_up)), 0.0f);
  for_each_tiled_scale(rows, cols, gate_up, [&](int64_t slot, int64_t i) { out[size_t(slot)] = scale[i]; });
  return out;
}

}  // namespace sieve::ops
