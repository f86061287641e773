// Entry points of the FP8 MoE kernels (moe_fp8*.cu) beyond cuda_ops.h, for moe.cu, the tests and
// the benchmark. Their tuning fields are MoeTuning's fp8_* (tuning.h).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cuda {

// Tests: device buffers that also receive, by pair (token * topk + slot over all the call's
// tokens), the quantized SwiGLU rows that entered the down product and their 1 x 128 scales, so a
// test can check each product against exact arithmetic on its own (pairs whose id is not an
// expert are left as they were).
struct MoeFp8Probe {
  uint8_t* act_q = nullptr;    // [tokens * topk, inter]
  float* act_scale = nullptr;  // [tokens * topk, ceil(inter / 128)]
};

// FP8 moe_experts (called by run_moe_experts for FP8_E4M3 weights); false when the kernels do not
// take the parameters: scale blocks other than (r, 128), hidden or inter not a multiple of 16,
// activations other than F32 / BF16 (or FP8 x with scales), more than 32 experts a token or 4096
// experts.
bool run_moe_experts_fp8(const ops::MoeExpertsParams& p, void* stream, const MoeFp8Probe* probe = nullptr);

// The device 1 x 128 quantizer on its own (tests): x [rows, cols] (F32 or BF16, row stride ldx,
// 16-byte aligned rows, cols % 16 == 0) -> q [rows, cols] fp8 and scale [rows, ceil(cols / 128)].
void quantize_fp8_1x128(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        float* scale, void* stream);

}  // namespace sieve::cuda
