// CPU reference of ops::linear (weights F32, BF16 or FP8_E4M3 with block scales of any shape) and
// of the one activation quantizer of the FP8 GEMMs (1 x 128 groups, ops.h). FP8 weights and FP8
// rows are dequantized exactly as ops.h defines them (fp8 value times its fp32 scale, one fp32
// product), then multiplied with the arithmetic of run_matmul (fp32 products and sums in a fixed
// order), so the result depends neither on the scale layout's blocking nor on threads.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_parallel.h"

namespace sieve::cpu {

namespace {

// Rows of w dequantized per call of run_matmul (keeps the fp32 copy of a tile small).
constexpr int64_t kWeightTileRows = 256;

// (Appended piece by piece: "[" + std::string gives g++ 12 a false -Wrestrict warning.)
std::string shape_text(int64_t r, int64_t c) {
  std::string s = "[";
  s += std::to_string(r);
  s += ", ";
  s += std::to_string(c);
  s += "]";
  return s;
}

}  // namespace

float fp8_group_scale(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));  // fmax drops NaN
  return amax == 0.0f ? 1.0f : amax / kFp8E4M3Max;
}

void quantize_row_fp8(const float* x, int64_t n, uint8_t* q, float* scale) {
  for (int64_t g0 = 0, g = 0; g0 < n; g0 += ops::kFp8Group, ++g) {
    const int64_t len = std::min(ops::kFp8Group, n - g0);
    const float s = fp8_group_scale(x + g0, len);
    scale[g] = s;
    for (int64_t i = 0; i < len; ++i) q[g0 + i] = f32_to_fp8e4m3(x[g0 + i] / s);
  }
}

void validate_weight_view(const ops::WeightView& w, const char* op) {
  const std::string o(op);
  SIEVE_CHECK(w.rows >= 0 && w.cols >= 0,
              o + ": negative weight shape " + shape_text(w.rows, w.cols));
  SIEVE_CHECK(w.rows == 0 || w.cols == 0 || w.data, o + ": weight data is null");
  SIEVE_CHECK(
      w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::FP8_E4M3,
      o + ": weight dtype " + std::string(dtype_name(w.dtype)) + " is not F32, BF16 or F8_E4M3");
  if (w.dtype == DType::FP8_E4M3) {
    SIEVE_CHECK(w.scale_block_rows > 0 && w.scale_block_cols > 0,
                o + ": an F8_E4M3 weight needs a positive scale block shape, got (" +
                    std::to_string(w.scale_block_rows) + ", " + std::to_string(w.scale_block_cols) +
                    ")");
    SIEVE_CHECK(w.rows == 0 || w.cols == 0 || w.scale, o + ": an F8_E4M3 weight needs its scales");
  }
}

void validate_linear(const ops::LinearParams& p) {
  validate_weight_view(p.w, "linear");
  const int64_t n = p.w.rows, k = p.w.cols;
  SIEVE_CHECK(p.m >= 0, "linear: negative m");
  if (p.m == 0 || n == 0) return;
  SIEVE_CHECK(p.y && (k == 0 || p.x), "linear: null operand");
  SIEVE_CHECK(p.ldx >= k && p.ldy >= n, "linear: row strides must be >= k (x) and >= n (y)");
  SIEVE_CHECK(p.y_dtype == DType::F32 || p.y_dtype == DType::BF16, "linear: y must be F32 or BF16");
  SIEVE_CHECK(p.x_dtype == DType::F32 || p.x_dtype == DType::BF16 || p.x_dtype == DType::FP8_E4M3,
              "linear: x must be F32, BF16 or F8_E4M3");
  SIEVE_CHECK(p.x_dtype != DType::FP8_E4M3 || k == 0 || p.x_scale,
              "linear: F8_E4M3 x needs x_scale");
}

float weight_scale(const ops::WeightView& w, int64_t r, int64_t c) {
  const int64_t bc = w.scale_block_cols;
  return w.scale[(r / w.scale_block_rows) * ((w.cols + bc - 1) / bc) + c / bc];
}

void dequantize_weight_rows(const ops::WeightView& w, int64_t r0, int64_t r1, float* out) {
  const int64_t k = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    float* o = out + (r - r0) * k;
    if (w.dtype != DType::FP8_E4M3) {
      for (int64_t c = 0; c < k; ++c) o[c] = load_as_f32(w.data, w.dtype, size_t(r * k + c));
      continue;
    }
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * k;
    for (int64_t c = 0; c < k; ++c) o[c] = fp8e4m3_to_f32(q[c]) * weight_scale(w, r, c);
  }
}

void run_quantize_fp8(const ops::QuantizeFp8Params& p) {
  if (p.rows <= 0 || p.cols <= 0) return;
  SIEVE_CHECK(p.x && p.y && p.y_scale, "quantize_fp8: null operand");
  SIEVE_CHECK(p.ldx >= p.cols && p.ldy >= p.cols, "quantize_fp8: row strides must be >= cols");
  SIEVE_CHECK(p.x_dtype == DType::F32 || p.x_dtype == DType::BF16,
              "quantize_fp8: x must be F32 or BF16");
  std::vector<float> row(size_t(p.cols));
  const int64_t groups = ops::fp8_groups(p.cols);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c)
      row[size_t(c)] = load_as_f32(p.x, p.x_dtype, size_t(r * p.ldx + c));
    quantize_row_fp8(row.data(), p.cols, static_cast<uint8_t*>(p.y) + r * p.ldy,
                     p.y_scale + r * groups);
  }
}

void run_linear(const ops::LinearParams& p) {
  validate_linear(p);
  const int64_t m = p.m, n = p.w.rows, k = p.w.cols;
  if (m == 0 || n == 0) return;
  ops::MatmulParams mm;
  mm.x = p.x;
  mm.x_dtype = p.x_dtype;
  mm.ldx = p.ldx;
  mm.y_dtype = p.y_dtype;
  mm.ldy = p.ldy;
  mm.m = m;
  mm.k = k;
  mm.accumulate = p.accumulate;
  // FP8 rows: dequantized once, into packed fp32 rows.
  std::vector<float> xd;
  if (p.x_dtype == DType::FP8_E4M3 && k > 0) {
    xd.resize(size_t(m * k));
    const int64_t groups = ops::fp8_groups(k);
    const uint8_t* q = static_cast<const uint8_t*>(p.x);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < k; ++c)
        xd[size_t(i * k + c)] =
            fp8e4m3_to_f32(q[i * p.ldx + c]) * p.x_scale[i * groups + c / ops::kFp8Group];
    mm.x = xd.data();
    mm.x_dtype = DType::F32;
    mm.ldx = k;
  }
  if (p.w.dtype != DType::FP8_E4M3 || k == 0) {
    mm.w = p.w.data;
    mm.w_dtype = p.w.dtype == DType::FP8_E4M3 ? DType::F32 : p.w.dtype;
    mm.n = n;
    mm.y = p.y;
    run_matmul(mm);
    return;
  }
  // FP8 weights: a tile of rows dequantized to fp32 at a time, multiplied by run_matmul into the
  // tile's columns of y (its products do not depend on how the columns are split).
  std::vector<float> wt(size_t(std::min(kWeightTileRows, n) * k));
  const size_t ysz = dtype_size(p.y_dtype);
  for (int64_t r0 = 0; r0 < n; r0 += kWeightTileRows) {
    const int64_t r1 = std::min(n, r0 + kWeightTileRows);
    dequantize_weight_rows(p.w, r0, r1, wt.data());
    mm.w = wt.data();
    mm.w_dtype = DType::F32;
    mm.n = r1 - r0;
    mm.y = static_cast<uint8_t*>(p.y) + size_t(r0) * ysz;
    run_matmul(mm);
  }
}

}  // namespace sieve::cpu

namespace sieve::ops {

std::vector<float> fp8_scales_kmajor(const float* scale, int64_t rows, int64_t cols) {
  const int64_t kb = fp8_groups(cols);
  std::vector<float> out(size_t(kb * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) out[size_t(b * rows + r)] = scale[r * kb + b];
  return out;
}

std::vector<float> lt_weight_scales(const WeightView& w, const float* scale) {
  std::vector<float> out;
  if (w.dtype != DType::FP8_E4M3 || w.scale_block_cols != 128 || w.rows == 0 || w.cols == 0)
    return out;
  const int64_t kb = fp8_groups(w.cols);
  if (w.scale_block_rows == 1) {
    out = fp8_scales_kmajor(scale, w.rows, w.cols);
  } else if (w.scale_block_rows == 128 && kb % 4 != 0) {
    const int64_t nb = (w.rows + 127) / 128, kb4 = (kb + 3) / 4 * 4;
    out.assign(size_t(nb * kb4), 1.0f);
    for (int64_t r = 0; r < nb; ++r)
      for (int64_t b = 0; b < kb; ++b) out[size_t(r * kb4 + b)] = scale[r * kb + b];
  }
  return out;
}

}  // namespace sieve::ops
