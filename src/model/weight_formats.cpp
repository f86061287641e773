#include "model/weight_formats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/tensor.h"

namespace sieve::model::detail {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fn(begin, end) over [0, n) on the machine's cores: a checkpoint's conversion is hundreds of
// millions of values.
template <class Fn>
void parallel_rows(int64_t n, int64_t per_row, Fn&& fn) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>(hw, std::max<int64_t>(1, n * per_row / (1 << 20)));
  if (threads <= 1 || n < 2) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::thread> ts;
  for (int64_t i = 0; i < threads; ++i) {
    const int64_t b = n * i / threads, e = n * (i + 1) / threads;
    ts.emplace_back([&fn, b, e] { fn(b, e); });
  }
  for (auto& t : ts) t.join();
}

std::string shape_text(const std::vector<int64_t>& s) { return shape_str(s); }

}  // namespace

size_t HostWeight::scale_count() const {
  if (dtype != DType::FP8_E4M3) return 0;
  return size_t(ceil_div(rows, block_rows) * ceil_div(cols, block_cols));
}

HostWeight read_plain(const TensorInfo& t, const Slice& s, bool want_f32) {
  HostWeight w;
  w.rows = s.nrows;
  w.cols = s.ncols;
  w.dtype = (t.dtype == DType::BF16 && !want_f32) ? DType::BF16 : DType::F32;
  const size_t esz = dtype_size(w.dtype);
  w.data.resize(size_t(w.rows * w.cols) * esz);
  const int64_t src_cols = std::max<int64_t>(s.cols, 1);
  parallel_rows(w.rows, w.cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const size_t src = size_t((s.row0 + r) * src_cols + s.col0);
      const size_t dst = size_t(r * w.cols);
      if (t.dtype == w.dtype) {
        std::memcpy(w.data.data() + dst * esz, static_cast<const uint8_t*>(t.data) + src * esz, size_t(w.cols) * esz);
      } else {
        for (int64_t c = 0; c < w.cols; ++c)
          store_from_f32(w.data.data(), w.dtype, dst + size_t(c), load_as_f32(t.data, t.dtype, src + size_t(c)));
      }
    }
  });
  return w;
}

HostWeight read_fp8(const TensorInfo& t, const TensorInfo& sc, const Slice& s, Fp8Source src,
                    const std::string& where) {
  const bool mx = src == Fp8Source::Mx;
  const int br = mx ? 1 : 128, bc = mx ? 32 : 128;
  const std::vector<int64_t> want = {ceil_div(s.rows, br), ceil_div(s.cols, bc)};
  const bool dtype_ok = mx ? sc.dtype == DType::U8 : (sc.dtype == DType::F32 || sc.dtype == DType::BF16);
  if (!dtype_ok || sc.shape != want)
    throw Error("checkpoint " + where + ": tensor " + sc.name + " has dtype " + std::string(dtype_name(sc.dtype)) +
                " and shape " + shape_text(sc.shape) + ", expected " + (mx ? "U8 " : "F32 or BF16 ") +
                shape_text(want) + (mx ? " (MXFP8: one E8M0 scale per 1x32 block of " : " (fp8: one scale per 128x128 block of ") +
                t.name + " " + shape_text(t.shape) + ")");
  if (s.col0 % bc != 0)
    throw Error("checkpoint " + where + ": tensor " + t.name + " is split at column " + std::to_string(s.col0) +
                " for this tensor-parallel rank, inside a " + std::to_string(bc) + "-column scale block");
  HostWeight w;
  w.dtype = DType::FP8_E4M3;
  w.rows = s.nrows;
  w.cols = s.ncols;
  w.data.resize(size_t(w.rows * w.cols));
  const uint8_t* q = static_cast<const uint8_t*>(t.data);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(w.data.data() + size_t(r * w.cols), q + size_t((s.row0 + r) * s.cols + s.col0), size_t(w.cols));
  // Per-row scales when the slice's rows do not start a scale block (exact: same multipliers).
  const int out_br = (s.row0 % br == 0) ? br : 1;
  w.block_rows = out_br;
  w.block_cols = bc;
  const int64_t kb = ceil_div(w.cols, bc), src_kb = ceil_div(s.cols, bc), kb0 = s.col0 / bc;
  const int64_t nb = ceil_div(w.rows, out_br);
  w.scale.resize(size_t(nb * kb));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t src_row = (s.row0 + b * out_br) / br;
    for (int64_t k = 0; k < kb; ++k) {
      const size_t i = size_t(src_row * src_kb + kb0 + k);
      w.scale[size_t(b * kb + k)] = mx ? e8m0_to_f32(static_cast<const uint8_t*>(sc.data)[i]) : load_as_f32(sc.data, sc.dtype, i);
    }
  }
  return w;
}

HostWeight quantize_block128(const HostWeight& in) {
  HostWeight w;
  w.dtype = DType::FP8_E4M3;
  w.rows = in.rows;
  w.cols = in.cols;
  w.block_rows = w.block_cols = 128;
  const int64_t rb = ceil_div(w.rows, 128), kb = ceil_div(w.cols, 128);
  w.data.resize(size_t(w.rows * w.cols));
  w.scale.resize(size_t(rb * kb));
  parallel_rows(rb, 128 * w.cols, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * 128, r1 = std::min(w.rows, r0 + 128);
      for (int64_t k = 0; k < kb; ++k) {
        const int64_t c0 = k * 128, c1 = std::min(w.cols, c0 + 128);
        float amax = 0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) {
            const float v = std::fabs(load_as_f32(in.data.data(), in.dtype, size_t(r * w.cols + c)));
            if (v > amax) amax = v;  // NaN compares false: ignored
          }
        const float scale = amax > 0 ? amax / 448.0f : 1.0f;
        w.scale[size_t(b * kb + k)] = scale;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c)
            w.data[size_t(r * w.cols + c)] =
                f32_to_fp8e4m3(load_as_f32(in.data.data(), in.dtype, size_t(r * w.cols + c)) / scale);
      }
    }
  });
  return w;
}

namespace {
// (1, 32) -> (br, 128), br 1 or 128: per br rows (from the weight's first row) and 128 columns the
// largest of the scales, each value rescaled by the power of two that takes its scale there.
HostWeight regroup(const HostWeight& in, int br, int64_t* inexact) {
  SIEVE_CHECK(in.dtype == DType::FP8_E4M3 && in.block_rows == 1 && in.block_cols == 32, "regroup: not 1x32 fp8");
  HostWeight w;
  w.dtype = DType::FP8_E4M3;
  w.rows = in.rows;
  w.cols = in.cols;
  w.block_rows = br;
  w.block_cols = 128;
  const int64_t rb = ceil_div(w.rows, br), kb = ceil_div(w.cols, 128), kb32 = ceil_div(w.cols, 32);
  w.data.resize(in.data.size());
  w.scale.resize(size_t(rb * kb));
  std::atomic<int64_t> changed{0};
  parallel_rows(rb, br * w.cols, [&](int64_t b0, int64_t b1) {
    int64_t local = 0;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * br, r1 = std::min(w.rows, r0 + br);
      for (int64_t k = 0; k < kb; ++k) {
        const int64_t s0 = k * 4, s1 = std::min(kb32, s0 + 4);
        float smax = 0;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t s = s0; s < s1; ++s) smax = std::max(smax, in.scale[size_t(r * kb32 + s)]);
        w.scale[size_t(b * kb + k)] = smax;
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t s = s0; s < s1; ++s) {
            // Both scales are powers of two, so the ratio is exact.
            const float ratio = in.scale[size_t(r * kb32 + s)] / smax;
            for (int64_t c = s * 32; c < std::min(w.cols, s * 32 + 32); ++c) {
              const float v = fp8e4m3_to_f32(in.data[size_t(r * w.cols + c)]) * ratio;
              const uint8_t q = f32_to_fp8e4m3(v);
              w.data[size_t(r * w.cols + c)] = q;
              if (fp8e4m3_to_f32(q) != v && !std::isnan(v)) ++local;
            }
          }
      }
    }
    changed += local;
  });
  if (inexact) *inexact += changed.load();
  return w;
}
}  // namespace

HostWeight regroup_1x128(const HostWeight& in, int64_t* inexact) { return regroup(in, 1, inexact); }

HostWeight regroup_block128(const HostWeight& in, int64_t* inexact) { return regroup(in, 128, inexact); }

HostWeight expand_rows(const HostWeight& in) {
  if (in.dtype != DType::FP8_E4M3 || in.block_rows == 1) return in;
  HostWeight w = in;
  w.block_rows = 1;
  const int64_t kb = ceil_div(w.cols, in.block_cols);
  w.scale.resize(size_t(w.rows * kb));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t k = 0; k < kb; ++k) w.scale[size_t(r * kb + k)] = in.scale[size_t((r / in.block_rows) * kb + k)];
  return w;
}

HostWeight dequantize(const HostWeight& in) {
  if (in.dtype != DType::FP8_E4M3) return in;
  HostWeight w;
  w.dtype = DType::F32;
  w.rows = in.rows;
  w.cols = in.cols;
  w.data.resize(size_t(w.rows * w.cols) * 4);
  float* out = reinterpret_cast<float*>(w.data.data());
  const int64_t kb = ceil_div(w.cols, in.block_cols);
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c)
      out[r * w.cols + c] = fp8e4m3_to_f32(in.data[size_t(r * w.cols + c)]) *
                            in.scale[size_t((r / in.block_rows) * kb + c / in.block_cols)];
  return w;
}

HostWeight stack(std::vector<HostWeight> parts) {
  SIEVE_CHECK(!parts.empty(), "stack: no parts");
  if (parts.size() == 1) return std::move(parts[0]);
  bool same = true;
  for (const auto& p : parts) {
    SIEVE_CHECK(p.cols == parts[0].cols, "stacked weights differ in width");
    same = same && p.dtype == parts[0].dtype && p.block_cols == parts[0].block_cols;
  }
  if (!same) {
    // Mixed formats (a checkpoint that quantized some of a fused weight's parts only).
    for (auto& p : parts) {
      p = dequantize(p);
      if (p.dtype != DType::F32) {
        HostWeight f;
        f.dtype = DType::F32;
        f.rows = p.rows;
        f.cols = p.cols;
        f.data.resize(size_t(p.rows * p.cols) * 4);
        for (size_t i = 0; i < size_t(p.rows * p.cols); ++i)
          store_from_f32(f.data.data(), DType::F32, i, load_as_f32(p.data.data(), p.dtype, i));
        p = std::move(f);
      }
    }
  }
  if (parts[0].dtype == DType::FP8_E4M3) {
    // Block rows line up only when every part but the last is whole blocks and all share them.
    bool aligned = true;
    for (size_t i = 0; i < parts.size(); ++i)
      aligned = aligned && parts[i].block_rows == parts[0].block_rows &&
                (i + 1 == parts.size() || parts[i].rows % parts[i].block_rows == 0);
    if (!aligned)
      for (auto& p : parts) p = expand_rows(p);
  }
  HostWeight out;
  out.dtype = parts[0].dtype;
  out.cols = parts[0].cols;
  out.block_rows = parts[0].block_rows;
  out.block_cols = parts[0].block_cols;
  for (auto& p : parts) {
    out.rows += p.rows;
    out.data.insert(out.data.end(), p.data.begin(), p.data.end());
    out.scale.insert(out.scale.end(), p.scale.begin(), p.scale.end());
  }
  return out;
}

}  // namespace sieve::model::detail
