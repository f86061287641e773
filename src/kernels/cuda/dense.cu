// CUDA implementations of the dense ops of kernels/ops.h: matmul (cuBLAS), embedding, rms_norm,
// add and swiglu_oai. Same meaning as the CPU reference (kernels/cpu/cpu_dense.cpp); the one
// place they round more is matmul with fp32 activations and bf16 weights, which rounds x to bf16
// for the tensor cores (docs/kernels.md, "Dense ops and MoE").
#include <cuda_runtime.h>
#ifdef SIEVE_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/quant.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int64_t kAddRowElems = 8192;

// ---------------------------------------------------------------------------------------------
// Kernels

// shard: ids outside the table's [vocab0, vocab0 + vocab) are another rank's (zero rows).
__global__ void embedding_kernel(const int32_t* ids, int64_t vocab, int64_t hidden, const void* table, int tt,
                                 void* out, int ot, bool shard, int64_t vocab0) {
  // PDL (common.cuh): the ids may come from the kernel before.
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int64_t id = int64_t(ids[t]) - vocab0;
  const bool ok = id >= 0 && id < vocab;  // the model validates ids first; NaN marks a bad one
  const float miss = shard ? 0.0f : __int_as_float(0x7fc00000);
  for (int64_t d = threadIdx.x; d < hidden; d += blockDim.x)
    st_elem(out, ot, t * hidden + d, ok ? ld_elem(table, tt, id * hidden + d) : miss);
}

struct RmsArgs {
  const void* x;
  void* residual;
  void* y;
  const void* weight;
  int xt, yt, wt;
  int rt;  // the residual's: xt, or F32 (RmsNormParams::residual_f32)
  int64_t dim, ldx, ldr, ldy;
  float eps;
  bool gemma;
  float* y_scale;  // kFp8: y holds e4m3 codes, these the 1 x 128 group scales
  uint8_t* q;      // optional second output: e4m3 codes (row stride ldq) and their group scales
  int64_t ldq;
  float* q_scale;
};

// One normed value: x * inv * w (w + 1 for Gemma's weights), rounded as the CPU reference rounds.
__device__ __forceinline__ float normed(float x, float inv, float w, bool gemma) {
  if (gemma) w = __fadd_rn(1.0f, w);
  return __fmul_rn(__fmul_rn(x, inv), w);
}

// 1 / rms of a row from every thread's part of its sum of squares (in double, like the CPU's):
// summed over the warp, then the warps in order by thread 0. Every thread of the CTA calls it.
__device__ __forceinline__ float row_inv_rms(double ss, int64_t dim, float eps) {
  __shared__ double part[kRowThreads / 32];
  __shared__ float inv_s;
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kRowThreads / 32; ++w) total += part[w];
    inv_s = 1.0f / sqrtf(float(total / double(dim)) + eps);
  }
  __syncthreads();
  return inv_s;
}

// Row r's normed values (from the stored residual sums, or x) quantized per 1 x 128 group, a warp
// a group, into q / q_scale. The residual sums other threads stored must be visible (a barrier).
__device__ __forceinline__ void rms_quantize_row(const RmsArgs& a, int64_t r, float inv, uint8_t* q, int64_t ldq,
                                                float* q_scale) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = (a.dim + 127) / 128;
  for (int64_t g = threadIdx.x / 32; g < groups; g += kRowThreads / 32) {
    const int64_t c0 = g * 128 + lane * 4;
    const int valid = int(max(int64_t(0), min(int64_t(4), a.dim - c0)));
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = 0.0f;
      if (k < valid) {
        const int64_t d = c0 + k;
        const float x = a.residual ? ld_elem(a.residual, a.rt, r * a.ldr + d) : ld_elem(a.x, a.xt, r * a.ldx + d);
        v[k] = normed(x, inv, ld_elem(a.weight, a.wt, d), a.gemma);
      }
    }
    uint8_t c[4];
    const float s = quantize_group_warp(v, valid, c);
    if (valid > 0) store_codes(q + r * ldq + c0, c, valid);
    if (lane == 0) q_scale[r * groups + g] = s;
  }
}

// One CTA a row. Sum of squares in double (the CPU reference's), so the scale matches it.
// kFp8: the normed row is quantized per 1 x 128 group (a warp a group) instead of stored; a.q:
// stored and also quantized so.
// PDL (common.cuh): the norm weight is brought into L2 before waiting for the kernel before (the
// residual stream's writer).
template <bool kFp8>
__global__ void __launch_bounds__(kRowThreads) rms_norm_kernel(RmsArgs a) {
  pdl_trigger();
  prefetch_l2(a.weight, a.dim * (a.wt == kElemF32 ? 4 : 2));
  pdl_wait();
  const int64_t r = blockIdx.x;
  double ss = 0;
  for (int64_t d = threadIdx.x; d < a.dim; d += kRowThreads) {
    float v = ld_elem(a.x, a.xt, r * a.ldx + d);
    if (a.residual) {
      // The sum is stored in the residual's dtype and the norm is taken of the stored value.
      const int64_t i = r * a.ldr + d;
      st_elem(a.residual, a.rt, i, __fadd_rn(v, ld_elem(a.residual, a.rt, i)));
      v = ld_elem(a.residual, a.rt, i);
    }
    ss += double(v) * double(v);
  }
  const float inv = row_inv_rms(ss, a.dim, a.eps);
  if constexpr (kFp8) {
    // The residual sums other threads stored are visible after the barrier above.
    rms_quantize_row(a, r, inv, static_cast<uint8_t*>(a.y), a.ldy, a.y_scale);
  } else {
    // Each thread reads back only the elements it wrote above, so y may alias x (not with q).
    for (int64_t d = threadIdx.x; d < a.dim; d += kRowThreads) {
      const float v = a.residual ? ld_elem(a.residual, a.rt, r * a.ldr + d) : ld_elem(a.x, a.xt, r * a.ldx + d);
      st_elem(a.y, a.yt, r * a.ldy + d, normed(v, inv, ld_elem(a.weight, a.wt, d), a.gemma));
    }
    if (a.q) rms_quantize_row(a, r, inv, a.q, a.ldq, a.q_scale);
  }
}

// The decode-size path of rms_norm (run_rms_norm picks it where dim is a multiple of 128 up to
// kVecNormMaxGroups x 8 groups and every row is aligned for vector access): one CTA a row, warp w
// holding groups w, w + 8, ... of 128 values, lane l values 4l .. 4l + 3 of each, in registers
// from one round of vector loads to the stores. The general kernel above walks the row three times
// with scalar loads, and with a residual every step re-reads the sum it just stored (the pointers
// may alias, so nothing overlaps): 11-18 us a norm at 32 rows x 6144 in the decode chain. Same
// arithmetic: the residual sum rounded to the residual's dtype, the sum of squares in double,
// the norm's products rounded as there, the same quantizer.
constexpr int kVecNormMaxGroups = 8;  // per warp: dim <= 8 x 8 x 128 = 8192

__device__ __forceinline__ void store_act4(void* y, int yt, int64_t i, const float (&v)[4]) {
  if (yt == kElemF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(y) + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(y) + i) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kRowThreads) rms_norm_vec_kernel(RmsArgs a) {
  pdl_trigger();
  prefetch_l2(a.weight, a.dim * (a.wt == kElemF32 ? 4 : 2));
  pdl_wait();
  constexpr int kWarps = kRowThreads / 32;
  const int64_t r = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int groups = int(a.dim / 128);
  float v[kVecNormMaxGroups][4];
#pragma unroll
  for (int i = 0; i < kVecNormMaxGroups; ++i) {
    const int g = warp + i * kWarps;
    if (g < groups) load_act4(a.x, a.xt, r * a.ldx + g * 128 + lane * 4, 4, true, v[i]);
  }
  if (a.residual) {
    float res[kVecNormMaxGroups][4];
#pragma unroll
    for (int i = 0; i < kVecNormMaxGroups; ++i) {
      const int g = warp + i * kWarps;
      if (g < groups) load_act4(a.residual, a.rt, r * a.ldr + g * 128 + lane * 4, 4, true, res[i]);
    }
#pragma unroll
    for (int i = 0; i < kVecNormMaxGroups; ++i) {
      const int g = warp + i * kWarps;
      if (g >= groups) continue;
      // The sum is stored in the residual's dtype and the norm is taken of the stored value.
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float s = __fadd_rn(v[i][k], res[i][k]);
        v[i][k] = a.rt == kElemF32 ? s : round_bf16(s);
      }
      store_act4(a.residual, a.rt, r * a.ldr + g * 128 + lane * 4, v[i]);
    }
  }
  double ss = 0;
#pragma unroll
  for (int i = 0; i < kVecNormMaxGroups; ++i)
    if (warp + i * kWarps < groups)
#pragma unroll
      for (int k = 0; k < 4; ++k) ss += double(v[i][k]) * double(v[i][k]);
  const float inv = row_inv_rms(ss, a.dim, a.eps);
  const int64_t sgroups = groups;
#pragma unroll
  for (int i = 0; i < kVecNormMaxGroups; ++i) {
    const int g = warp + i * kWarps;
    if (g >= groups) continue;
    const int64_t c0 = int64_t(g) * 128 + lane * 4;
    float w[4], n[4];
    load_act4(a.weight, a.wt, c0, 4, true, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) n[k] = normed(v[i][k], inv, w[k], a.gemma);
    uint8_t c[4];
    if constexpr (kFp8) {
      const float sc = quantize_group_warp(n, 4, c);
      store_codes(static_cast<uint8_t*>(a.y) + r * a.ldy + c0, c, 4);
      if (lane == 0) a.y_scale[r * sgroups + g] = sc;
    } else {
      store_act4(a.y, a.yt, r * a.ldy + c0, n);
      if (a.q) {
        const float sc = quantize_group_warp(n, 4, c);
        store_codes(a.q + r * a.ldq + c0, c, 4);
        if (lane == 0) a.q_scale[r * sgroups + g] = sc;
      }
    }
  }
}

__global__ void add_kernel(void* y, const void* x, int t, int64_t n, float alpha, bool assign) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float ax = __fmul_rn(alpha, ld_elem(x, t, i));
    st_elem(y, t, i, assign ? ax : __fadd_rn(ld_elem(y, t, i), ax));
  }
}

__global__ void swiglu_kernel(const void* gate_up, void* out, int t, int64_t rows, int64_t inter, int64_t ld_in,
                              int64_t ld_out, float alpha, float limit, float beta) {
  pdl_trigger();
  pdl_wait();
  const int64_t n = rows * inter;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = ld_elem(gate_up, t, r * ld_in + c);
    const float u = ld_elem(gate_up, t, r * ld_in + inter + c);
    st_elem(out, t, r * ld_out + c, swiglu_oai_value(g, u, alpha, limit, beta));
  }
}

// x [m, k] (row stride ldx, fp32) -> [m, k] bf16, packed.
__global__ void rows_to_bf16_kernel(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out) {
  const int64_t n = m * k;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = f32_to_bf16_bits(x[(i / k) * ldx + i % k]);
}

// Grid of a grid-stride elementwise kernel: enough CTAs to fill the GPU a few times over.
unsigned elementwise_grid(int64_t n) {
  const int64_t want = (n + kRowThreads - 1) / kRowThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(num_sms()) * 16)));
}

#ifdef SIEVE_HAVE_CUBLAS
// One cuBLAS handle per device and scratch set (stream_scratch.h), made at first use; the stream
// is set at each call. A handle's default workspace serves every call made through it, so a side
// stream's GEMMs, which run beside the main stream's, go through a handle of their own.
cublasHandle_t blas_handle(cudaStream_t stream) {
  static std::mutex mu;
  static std::vector<std::vector<cublasHandle_t>> handles;  // [device][set]
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  const size_t set = size_t(scratch_set(stream));
  std::lock_guard<std::mutex> lock(mu);
  if (int(handles.size()) <= dev) handles.resize(size_t(dev) + 1);
  auto& of_dev = handles[size_t(dev)];
  if (of_dev.size() <= set) of_dev.resize(set + 1, nullptr);
  if (!of_dev[set]) {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("cuBLAS: cannot create a handle");
    of_dev[set] = h;
  }
  return of_dev[set];
}
#endif

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

void rows_to_bf16(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out, cudaStream_t stream) {
  if (m <= 0 || k <= 0) return;
  rows_to_bf16_kernel<<<elementwise_grid(m * k), kRowThreads, 0, stream>>>(x, ldx, m, k, out);
  SIEVE_LAUNCH_CHECK("rows to bf16");
}

bool run_embedding(const ops::EmbeddingParams& p, void* stream_v) {
  if (p.num_tokens <= 0) return true;
  if (!p.ids || !p.table || !p.out) throw Error("embedding: null operand");
  const int tt = elem_code(p.table_dtype), ot = elem_code(p.out_dtype);
  if (tt < 0 || ot < 0 || p.num_tokens > INT_MAX) return false;
  if (p.hidden <= 0) return true;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  launch_pdl(chain_pdl(st, p.num_tokens), embedding_kernel, dim3(unsigned(p.num_tokens)), dim3(kRowThreads), 0, st,
             "embedding", p.ids, p.vocab, p.hidden, p.table, tt, p.out, ot, p.shard, p.shard ? p.vocab0 : int64_t(0));
  return true;
}

bool run_rms_norm(const ops::RmsNormParams& p, void* stream_v) {
  if (p.rows <= 0 || p.dim <= 0) return true;
  if (!p.x || !p.y || !p.weight) throw Error("rms_norm: x, y and weight are required");
  if (p.ldx < p.dim || p.ldy < p.dim || (p.residual && p.ldr < p.dim))
    throw Error("rms_norm: row strides must be >= dim");
  RmsArgs a{};
  const bool fp8 = p.y_dtype == DType::FP8_E4M3;
  if (fp8 && !p.y_scale) throw Error("rms_norm: an F8_E4M3 y needs y_scale");
  if (p.y_fp8 && (fp8 || !p.y_fp8_scale || p.ld_fp8 < p.dim || p.y == p.x))
    throw Error("rms_norm: y_fp8 needs y_fp8_scale, ld_fp8 >= dim and a y that is neither x nor FP8");
  a.xt = elem_code(p.x_dtype);
  a.yt = fp8 ? kElemF32 : elem_code(p.y_dtype);
  a.wt = elem_code(p.weight_dtype);
  a.rt = elem_code(ops::rms_residual_dtype(p));
  if (a.xt < 0 || a.yt < 0 || a.wt < 0 || p.rows > INT_MAX) return false;
  a.x = p.x;
  a.residual = p.residual;
  a.y = p.y;
  a.weight = p.weight;
  a.dim = p.dim;
  a.ldx = p.ldx;
  a.ldr = p.ldr;
  a.ldy = p.ldy;
  a.eps = p.eps;
  a.gemma = p.gemma;
  a.y_scale = p.y_scale;
  a.q = static_cast<uint8_t*>(p.y_fp8);
  a.ldq = p.ld_fp8;
  a.q_scale = p.y_fp8_scale;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  // The register path: whole 128-groups, every row and vector of x, the residual, y and the weight
  // aligned for 16-byte (F32) or 8-byte (BF16) access (each by its own dtype: a bf16 x with an
  // fp32 residual too); F16 and odd shapes take the general kernel.
  const auto aligned = [](const void* ptr, int t, int64_t ld) {
    const int64_t bytes = t == kElemF32 ? 16 : 8;
    return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0 && ld % 4 == 0;
  };
  const bool vec = p.dim % 128 == 0 && p.dim / 128 <= int64_t(kVecNormMaxGroups) * (kRowThreads / 32) &&
                   a.xt != kElemF16 && a.wt != kElemF16 && aligned(p.x, a.xt, p.ldx) &&
                   (!p.residual || (a.rt != kElemF16 && aligned(p.residual, a.rt, p.ldr))) && aligned(p.weight, a.wt, 0) &&
                   (fp8 || (a.yt != kElemF16 && aligned(p.y, a.yt, p.ldy)));
  if (vec) {
    launch_pdl(chain_pdl(st, p.rows), fp8 ? rms_norm_vec_kernel<true> : rms_norm_vec_kernel<false>,
               dim3(unsigned(p.rows)), dim3(kRowThreads), 0, st, "rms_norm", a);
    return true;
  }
  launch_pdl(chain_pdl(st, p.rows), fp8 ? rms_norm_kernel<true> : rms_norm_kernel<false>, dim3(unsigned(p.rows)),
             dim3(kRowThreads), 0, st, "rms_norm", a);
  return true;
}

bool run_add(const ops::AddParams& p, void* stream_v) {
  if (p.n <= 0) return true;
  if (!p.x || !p.y) throw Error("add: null operand");
  const int t = elem_code(p.dtype);
  if (t < 0) return false;
  // add has no rows: chain_pdl counts every kAddRowElems elements as one (no served model's
  // hidden rows are wider, so a decode step's adds count at most their rows).
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  launch_pdl(chain_pdl(st, (p.n + kAddRowElems - 1) / kAddRowElems), add_kernel, dim3(elementwise_grid(p.n)), dim3(kRowThreads), 0, st,
             "add", p.y, p.x, t, p.n, p.alpha, p.assign);
  return true;
}

// L2 prefetch (ops::prefetch_l2): one `prefetch.global.L2` a 128-byte line, the lines of every
// range spread over the threads of the grid (kPrefetchLines a thread, so the requests leave from
// many SMs at once); the kernel ends once they are issued (the memory system completes them).
constexpr int kPrefetchThreads = 256;
constexpr int kPrefetchLines = 8;
constexpr int64_t kL2PrefetchMaxRows = 64;  // launch.l2_prefetch_mib's decode steps

__global__ void __launch_bounds__(kPrefetchThreads) prefetch_l2_kernel(ops::PrefetchL2Params p) {
  const uint64_t step = uint64_t(gridDim.x) * blockDim.x * 128;
  for (int r = 0; r < p.count; ++r) {
    const uint64_t a = reinterpret_cast<uint64_t>(p.ptr[r]), e = a + p.bytes[r];
    for (uint64_t c = a + (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 128; c < e; c += step)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(c));
  }
}

bool run_prefetch_l2(const ops::PrefetchL2Params& p, void* stream_v) {
  if (p.count < 0 || p.count > ops::PrefetchL2Params::kMaxRanges) throw Error("prefetch_l2: bad range count");
  uint64_t total = 0;
  for (int r = 0; r < p.count; ++r) {
    if (!p.ptr[r] && p.bytes[r]) throw Error("prefetch_l2: null range");
    total += p.bytes[r];
  }
  if (total == 0) return true;
  const uint64_t per_cta = uint64_t(kPrefetchThreads) * kPrefetchLines * 128;
  const unsigned grid = unsigned(std::min<uint64_t>(1024, (total + per_cta - 1) / per_cta));
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  launch_pdl(false, prefetch_l2_kernel, dim3(grid), dim3(kPrefetchThreads), 0, st, "prefetch_l2", p);
  return true;
}

size_t l2_prefetch_budget(int64_t rows) {
  if (rows > kL2PrefetchMaxRows) return 0;  // prefill: the weights serve many rows anyway
  return size_t(std::max(0, tuning().launch.l2_prefetch_mib)) << 20;
}

bool run_swiglu_oai(const ops::SwigluOaiParams& p, void* stream_v) {
  if (p.rows <= 0 || p.inter <= 0) return true;
  if (!p.gate_up || !p.out) throw Error("swiglu_oai: null operand");
  if (p.ld_in < 2 * p.inter || p.ld_out < p.inter) throw Error("swiglu_oai: bad row strides");
  if (p.out_scale) return run_swiglu_oai_fp8(p, stream_v);
  const int t = elem_code(p.dtype);
  if (t < 0) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  launch_pdl(chain_pdl(st, p.rows), swiglu_kernel, dim3(elementwise_grid(p.rows * p.inter)), dim3(kRowThreads), 0, st,
             "swiglu_oai", p.gate_up, p.out, t, p.rows, p.inter, p.ld_in, p.ld_out, p.alpha, p.limit, p.beta);
  return true;
}

// y[m, n] (+)= x[m, k] . w[n, k]^T with cuBLAS, fp32 accumulation:
// - w BF16: x BF16 as is, or x F32 rounded to bf16 first (into a scratch buffer); y F32 or BF16.
// - w F32: x F32, y F32, fp32 products (CUBLAS_COMPUTE_32F, no TF32).
// Row-major y = x w^T is column-major y^T = w x^T: A = w (k x n, transposed), B = x (k x m).
bool run_matmul(const ops::MatmulParams& p, void* stream_v) {
  if (p.m <= 0 || p.n <= 0) return true;
  if (!p.y || (p.k > 0 && (!p.x || !p.w))) throw Error("matmul: null operand");
  if (p.k < 0 || p.ldx < p.k || p.ldy < p.n) throw Error("matmul: bad k or row strides");
  if (p.y_dtype != DType::F32 && p.y_dtype != DType::BF16) return false;
  const bool w_bf16 = p.w_dtype == DType::BF16;
  if (!w_bf16 && p.w_dtype != DType::F32) return false;
  if (!w_bf16 && (p.x_dtype != DType::F32 || p.y_dtype != DType::F32)) return false;
  if (w_bf16 && p.x_dtype != DType::F32 && p.x_dtype != DType::BF16) return false;
  for (int64_t v : {p.m, p.n, p.k, p.ldx, p.ldy})
    if (v > INT_MAX) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  const size_t ysz = dtype_size(p.y_dtype);
  if (p.k == 0) {
    if (!p.accumulate)
      cuda_check(cudaMemset2DAsync(p.y, size_t(p.ldy) * ysz, 0, size_t(p.n) * ysz, size_t(p.m), st),
                 "cudaMemset2DAsync (matmul, k = 0)");
    return true;
  }
#ifndef SIEVE_HAVE_CUBLAS
  return false;
#else
  const void* b = p.x;
  int64_t ldb = p.ldx;
  if (w_bf16 && p.x_dtype == DType::F32) {
    auto* xb = static_cast<uint16_t*>(private_scratch(st, kScratchMatmulX, size_t(p.m * p.k) * 2));
    rows_to_bf16(static_cast<const float*>(p.x), p.ldx, p.m, p.k, xb, st);
    b = xb;
    ldb = p.k;
  }
  const cudaDataType ab = w_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType yc = p.y_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  cublasHandle_t h = blas_handle(st);
  if (cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS) throw Error("cuBLAS: cannot set the stream");
  const cublasStatus_t s =
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(p.n), int(p.m), int(p.k), &alpha, p.w, ab, int(p.k), b, ab,
                   int(ldb), &beta, p.y, yc, int(p.ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error("matmul: cublasGemmEx failed (status " + std::to_string(int(s)) + ") for m " + std::to_string(p.m) +
                ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k));
  return true;
#endif
}

}  // namespace sieve::cuda
