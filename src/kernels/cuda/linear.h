// ops::linear on CUDA beyond cuda_ops.h: the path and plan a call takes (its knobs are
// Tuning::linear, tuning.h), and the cuBLASLt FP8 GEMMs it and the benchmark use.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/linear_fp8_plan.h"
#include "kernels/ops.h"

namespace sieve::cuda {

// Which way run_linear computes a call (under the current knobs; docs/kernels.md "FP8 GEMM"):
// cuBLAS matmul (F32 / BF16 weights), the wgmma kernel on FP8 rows (F32 / BF16 rows quantized by
// a kernel first) or quantizing F32 / BF16 rows itself, cuBLASLt with 128 x 128 weight blocks
// or with 1 x 128 weight blocks (VEC128), or none ("unsupported").
enum class LinearPath { kMatmul, kOwn, kOwnFused, kLtBlock, kLtVec128, kNone };
LinearPath linear_path(const ops::LinearParams& p);

// The plan run_linear launches for an FP8 weight of n x k times m tokens (what the tests force
// and the benchmark prints).
fp8::Plan linear_fp8_plan(int64_t m, int64_t n, int64_t k);

// One FP8 GEMM through cuBLASLt, for the benchmark and the prefill path:
// y[m, n] (+)= sum_k x[m, k] w[n, k] scaled as `scaling` says (cuBLAS: A = w, op T; B = x, op N;
// D = y column-major n x m):
//   kTensor:   x_scale[0], w_scale[0] (one float each);
//   kOuterVec: x_scale[m], w_scale[n] (per token, per weight row: torch._scaled_mm's rowwise);
//   kBlock:    x_scale [ceil(k/128)][m] (token-contiguous, 1 x 128 groups), w_scale
//              [ceil(n/128)][round_up(ceil(k/128), 4)] (128 x 128 blocks);
//   kVec128:   x_scale as kBlock, w_scale [ceil(k/128)][n] (1 x 128 blocks, k-block-major).
// x, w FP8_E4M3 with row strides ldx, k (multiples of 16 bytes); y F32 or BF16.
enum class LtScaling { kTensor, kOuterVec, kBlock, kVec128 };
struct LtGemm {
  const void* x = nullptr;
  int64_t ldx = 0;
  const float* x_scale = nullptr;
  const void* w = nullptr;
  const float* w_scale = nullptr;
  void* y = nullptr;
  DType y_dtype = DType::BF16;
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  LtScaling scaling = LtScaling::kTensor;
  bool accumulate = false;
  bool fast_accum = false;
};
// False (with the reason in *why) when this cuBLASLt has no algorithm for it or the build has
// no cuBLASLt.
bool cublaslt_fp8_gemm(const LtGemm& g, void* stream, std::string* why = nullptr);
// Whether cublaslt_fp8_gemm would run g (its shape, dtypes and scaling; the pointers are not
// read). The answer is kept per shape.
bool cublaslt_fp8_accepts(const LtGemm& g, std::string* why = nullptr);

// Transposes the 1 x 128 activation scales [m][groups] into [groups][m] (cuBLASLt's layout).
void transpose_scales(const float* in, int64_t m, int64_t groups, float* out, void* stream);

}  // namespace sieve::cuda
