// Element access by a run-time dtype and the SwiGLU-OAI formula, shared by the dense ops
// (dense.cu) and the MoE kernels (moe.cu). Explicitly rounded operations (__fadd_rn, __fmul_rn)
// keep nvcc from contracting a product and a sum into one FMA, so each value is rounded where
// the CPU reference rounds it.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"

namespace sieve::cuda {

// Run-time element codes of the activation dtypes these kernels read and write.
enum ElemCode : int { kElemF32 = 0, kElemBF16 = 1, kElemF16 = 2 };
inline int elem_code(DType t) {
  switch (t) {
    case DType::F32: return kElemF32;
    case DType::BF16: return kElemBF16;
    case DType::F16: return kElemF16;
    default: return -1;
  }
}

__device__ __forceinline__ float ld_elem(const void* p, int t, int64_t i) {
  if (t == kElemF32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  if (t == kElemBF16) return bf16_to_f32(b);
  return __half2float(__ushort_as_half(b));
}

// Rounds to nearest even for BF16 and F16 (the CPU reference's store).
__device__ __forceinline__ void st_elem(void* p, int t, int64_t i, float v) {
  if (t == kElemF32) {
    static_cast<float*>(p)[i] = v;
  } else if (t == kElemBF16) {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  } else {
    static_cast<uint16_t*>(p)[i] = __half_as_ushort(__float2half_rn(v));
  }
}

// 1 / (1 + exp(-x)), rounded where the CPU reference rounds.
__device__ __forceinline__ float sigmoid_value(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// g = min(gate, limit); u = clamp(up, -limit, limit); g * sigmoid(alpha * g) * (u + beta).
// min / clamp keep NaN, as the CPU reference does.
__device__ __forceinline__ float swiglu_oai_value(float g, float u, float alpha, float limit, float beta) {
  g = g > limit ? limit : g;
  u = u > limit ? limit : (u < -limit ? -limit : u);
  return __fmul_rn(__fmul_rn(g, sigmoid_value(__fmul_rn(alpha, g))), __fadd_rn(u, beta));
}

}  // namespace sieve::cuda
