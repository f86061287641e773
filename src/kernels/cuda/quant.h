// Internal to kernels/cuda: the FP8 activation quantizers of quant.cu for the other kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cuda {

// Rows of x (F32 or BF16, row stride ldx) -> e4m3 codes q (row stride ldq) and the 1 x 128
// group scales, as ops.h defines them: [rows][fp8_groups(cols)], or with scale_kmajor
// [fp8_groups(cols)][rows] (cuBLASLt's layout). pdl: launched with programmatic dependent launch
// (it waits for the previous kernel before touching x, q or scale; the next may start at once).
void quantize_rows(const void* x, DType x_dtype, int64_t ldx, int64_t rows, int64_t cols,
                   uint8_t* q, int64_t ldq, float* scale, cudaStream_t stream, bool scale_kmajor,
                   bool pdl);
// Whether rows of x at that stride take 4-element vector loads (load_act4's `vec`).
bool act4_vec(const void* x, DType x_dtype, int64_t ldx);
// swiglu_oai with out_scale set (FP8 output); false for an unsupported input dtype.
bool run_swiglu_oai_fp8(const ops::SwigluOaiParams& p, void* stream);

}  // namespace sieve::cuda
