// Internal to model/: a weight matrix in host memory on its way to the device, and the
// conversions between the stored formats and the ones the kernels read (weights.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace sieve::model::detail {

// [rows, cols] of `dtype`; FP8_E4M3 with fp32 multipliers per (block_rows x block_cols) block,
// row-major over blocks (ops::WeightView).
struct HostWeight {
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;
  std::vector<float> scale;
  int block_rows = 0, block_cols = 0;
  size_t scale_count() const;  // ceil(rows / block_rows) * ceil(cols / block_cols)
};

// A part of a checkpoint tensor: rows [row0, row0 + nrows) and columns [col0, col0 + ncols) of
// a tensor of shape [rows, cols] (cols 0: a vector of rows).
struct Slice {
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0, nrows = 0, col0 = 0, ncols = 0;
  bool whole() const { return row0 == 0 && col0 == 0 && nrows == rows && ncols == std::max<int64_t>(cols, 1); }
};

// How a checkpoint stores its FP8 projections (config.quant_method).
enum class Fp8Source { None, Mx, Block128 };

// The slice of a stored BF16/F16/F32 tensor, as BF16 (F32 when want_f32 or when the tensor is
// not BF16: F16 widens exactly to F32).
HostWeight read_plain(const TensorInfo& t, const Slice& s, bool want_f32);
// The slice of an F8_E4M3 tensor with its `weight_scale_inv` (checked against the format: U8
// [rows, ceil(cols / 32)] for MXFP8, F32/BF16 [ceil(rows / 128), ceil(cols / 128)] for block
// fp8); the result keeps the stored blocks (1 x 32; 128 x 128, or 1 x 128 when the slice does
// not start on a block row). `where` names the checkpoint in errors.
HostWeight read_fp8(const TensorInfo& t, const TensorInfo& scale, const Slice& s, Fp8Source src,
                    const std::string& where);

// BF16/F32 -> FP8 per 128 x 128 block: scale = amax / 448 (1 when 0), q = sat_fp8(x / scale).
HostWeight quantize_block128(const HostWeight& w);
// (1, 32) -> (1, 128): per row and 128 columns the largest of the (up to four) scales, each value
// rescaled by the power of two 2^(e_i - e_max). Adds to *inexact the values that changed
// (fp8's subnormal range and underflow).
HostWeight regroup_1x128(const HostWeight& w, int64_t* inexact);
// (1, 32) -> (128, 128) (--fp8-scale-blocks 128x128): per 128 rows (from the weight's first row)
// and 128 columns the largest of the (up to 512) scales, each value rescaled by its power of two
// as regroup_1x128 does. Adds to *inexact the values that changed.
HostWeight regroup_block128(const HostWeight& w, int64_t* inexact);
// (br, bc) -> (1, bc): the same multipliers per row, exactly.
HostWeight expand_rows(const HostWeight& w);
// FP8 -> F32, exactly.
HostWeight dequantize(const HostWeight& w);
// Rows of the parts one after another. Parts of one format stay in it (FP8 block rows must
// line up: parts whose rows are not whole blocks are expanded to (1, bc) first); parts of mixed
// formats become F32 (exact).
HostWeight stack(std::vector<HostWeight> parts);

}  // namespace sieve::model::detail
