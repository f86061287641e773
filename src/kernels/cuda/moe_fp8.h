// Entry points of the FP8 MoE kernels (moe_fp8*.cu) beyond cuda_ops.h, for moe.cu, the tests and
// the benchmark. Their tuning fields are MoeTuning's fp8_* (tuning.h).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cuda {

// FP8 moe_experts (called by run_moe_experts for FP8_E4M3 weights); false when the kernels do not
// take the parameters: scale blocks other than (r, 128), hidden or inter not a multiple of 16,
// activations other than F32 / BF16 (or FP8 x with scales), more than 32 experts a token or 4096
// experts.
bool run_moe_experts_fp8(const ops::MoeExpertsParams& p, void* stream);

// The device 1 x 128 quantizer on its own (tests): x [rows, cols] (F32 or BF16, row stride ldx,
// 16-byte aligned rows, cols % 16 == 0) -> q [rows, cols] fp8 and scale [rows, ceil(cols / 128)].
void quantize_fp8_1x128(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        float* scale, void* stream);

}  // namespace sieve::cuda
