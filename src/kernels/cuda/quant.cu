// The 1 x 128 activation quantization of the FP8 GEMMs on CUDA: the standalone op
// (quantize_fp8), the one ops::linear runs on F32 / BF16 rows (scales token-major for the wgmma
// kernel, k-block-major for cuBLASLt), the fused SwiGLU-OAI + quantize output of swiglu_oai, and
// the scale transposition cuBLASLt's block scaling wants. One warp a (row, group of 128); each
// matches cpu::quantize_row_fp8 bit for bit (fp8_common.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/quant.h"

namespace sieve::cuda {

namespace {

constexpr int kThreads = 256;

// The four values of lane `lane` in group g of a row: columns c0 .. c0 + valid - 1.
struct GroupSlot {
  int64_t c0;
  int valid;
};
__device__ __forceinline__ GroupSlot group_slot(int64_t g, int lane, int64_t cols) {
  GroupSlot s;
  s.c0 = g * 128 + lane * 4;
  s.valid = int(max(int64_t(0), min(int64_t(4), cols - s.c0)));
  return s;
}

// With programmatic dependent launch (the decode GEMM's quantizer) the kernel lets the GEMM start
// at once (it loads its weights meanwhile) and waits for the kernel before it, which wrote x and
// may still read q, before it touches either.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const void* x, int xt, int64_t ldx, bool vec, int64_t rows, int64_t cols,
                         uint8_t* q, int64_t ldq, float* scale, int64_t s_row, int64_t s_group) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t groups = (cols + 127) / 128, total = rows * groups;
  const int64_t step = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < total; w += step) {
    const int64_t r = w / groups, g = w % groups;
    const GroupSlot s = group_slot(g, lane, cols);
    float v[4];
    load_act4(x, xt, r * ldx + s.c0, s.valid, vec, v);
    uint8_t c[4];
    const float sc = quantize_group_warp(v, s.valid, c);
    if (s.valid > 0) store_codes(q + r * ldq + s.c0, c, s.valid);
    if (lane == 0) scale[r * s_row + g * s_group] = sc;
  }
}

// The GEMM after it (the down projection) may start its weight loads at once; with programmatic
// dependent launch (chain_pdl) this one waits for the gate_up GEMM before it reads its rows.
__global__ void __launch_bounds__(kThreads)
    swiglu_fp8_kernel(const void* gate_up, int t, int64_t ld_in, int64_t rows, int64_t inter,
                      uint8_t* out, int64_t ld_out, float* out_scale, float alpha, float limit,
                      float beta) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t groups = (inter + 127) / 128, total = rows * groups;
  const int64_t step = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < total; w += step) {
    const int64_t r = w / groups, g = w % groups;
    const GroupSlot s = group_slot(g, lane, inter);
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = 0.0f;
      if (k < s.valid) {
        const int64_t c = s.c0 + k;
        v[k] = swiglu_oai_value(ld_elem(gate_up, t, r * ld_in + c),
                                ld_elem(gate_up, t, r * ld_in + inter + c), alpha, limit, beta);
      }
    }
    uint8_t c[4];
    const float sc = quantize_group_warp(v, s.valid, c);
    if (s.valid > 0) store_codes(out + r * ld_out + s.c0, c, s.valid);
    if (lane == 0) out_scale[r * groups + g] = sc;
  }
}

__global__ void transpose_scales_kernel(const float* in, int64_t m, int64_t groups, float* out) {
  const int64_t n = m * groups;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[(i % groups) * m + i / groups] = in[i];
}

unsigned warp_grid(int64_t warps) {
  const int64_t want = (warps * 32 + kThreads - 1) / kThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(num_sms()) * 16)));
}

}  // namespace

bool act4_vec(const void* x, DType x_dtype, int64_t ldx) {
  return (reinterpret_cast<uintptr_t>(x) % (4 * dtype_size(x_dtype))) == 0 && ldx % 4 == 0;
}

void quantize_rows(const void* x, DType x_dtype, int64_t ldx, int64_t rows, int64_t cols,
                   uint8_t* q, int64_t ldq, float* scale, cudaStream_t stream, bool scale_kmajor,
                   bool pdl) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t groups = ops::fp8_groups(cols);
  launch_pdl(pdl, quantize_rows_kernel, dim3(warp_grid(rows * groups)), dim3(kThreads), 0, stream,
             "quantize_fp8", x, elem_code(x_dtype), ldx, act4_vec(x, x_dtype, ldx), rows, cols, q,
             ldq, scale, scale_kmajor ? int64_t(1) : groups, scale_kmajor ? rows : int64_t(1));
}

bool run_quantize_fp8(const ops::QuantizeFp8Params& p, void* stream) {
  if (p.rows <= 0 || p.cols <= 0) return true;
  if (!p.x || !p.y || !p.y_scale) throw Error("quantize_fp8: null operand");
  if (p.ldx < p.cols || p.ldy < p.cols) throw Error("quantize_fp8: row strides must be >= cols");
  if (p.x_dtype != DType::F32 && p.x_dtype != DType::BF16) return false;
  quantize_rows(p.x, p.x_dtype, p.ldx, p.rows, p.cols, static_cast<uint8_t*>(p.y), p.ldy, p.y_scale,
                static_cast<cudaStream_t>(stream), false, false);
  return true;
}

bool run_swiglu_oai_fp8(const ops::SwigluOaiParams& p, void* stream) {
  const int t = elem_code(p.dtype);
  if (t < 0) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  launch_pdl(chain_pdl(st, p.rows), swiglu_fp8_kernel, dim3(warp_grid(p.rows * ops::fp8_groups(p.inter))),
             dim3(kThreads), 0, st, "swiglu_oai (fp8 out)", p.gate_up, t, p.ld_in, p.rows, p.inter,
             static_cast<uint8_t*>(p.out), p.ld_out, p.out_scale, p.alpha, p.limit, p.beta);
  return true;
}

void transpose_scales(const float* in, int64_t m, int64_t groups, float* out, void* stream) {
  if (m <= 0 || groups <= 0) return;
  const int64_t n = m * groups;
  const unsigned grid =
      unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 1024)));
  transpose_scales_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, m, groups,
                                                                                    out);
  SIEVE_LAUNCH_CHECK("transpose scales");
}

}  // namespace sieve::cuda
