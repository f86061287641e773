// CUDA moe_route (kernels/ops.h; CPU reference in kernels/cpu/cpu_moe.cpp).
//
// Routing of a token is one warp: sigmoid + correction bias, the top-k by k rounds of a warp
// arg-max (higher biased score, then lower expert id; NaN ranks as -inf), the weights summed in
// rank order, renormalised and scaled as on the CPU.
//
// With the router GEMM fused (x and gate set), up to MoeTuning::route_fused_max_tokens tokens
// (decode) take one kernel: CTA (s, g) computes the logits of experts 8 g .. 8 g + 7 (a warp
// each) over hidden slice s (512 wide: a lane holds 16 of the expert's fp32 weights in registers
// and streams the tokens' x through L1) for every token, into fp32 partial sums; the last CTA of
// an expert group (an arrival counter) sums its slices in slice order into the logits, and the
// last group to finish routes every token. The sums' order is fixed, so the result does not
// depend on which CTA finishes last; it differs from the CPU's (fp32 products and sums in
// run_matmul's order) by rounding, so near ties may pick differently. Otherwise F32 x up to
// MoeTuning::route_splitk_max_tokens tokens takes the split-K router GEMM (moe_route_splitk_kernel)
// and a routing kernel that sums its slices first; larger batches run the GEMM through matmul
// (cuBLAS, fp32) into a scratch row block, then the routing kernel; BF16 x always takes the
// fused kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {

constexpr int kMaxExperts = 1024;  // 32 per lane
constexpr int kMaxTopk = 32;
constexpr int kSlice = 512;        // hidden columns a fused CTA
constexpr int kGroupExperts = 8;   // experts a fused CTA (a warp each)

// Routes token t from its logits row (global memory, read through L2: another CTA may have
// written it; or with kShared the CTA's own shared memory). kPer: experts a lane holds (E <= 32
// kPer). Every loop over them and over the top-k ranks is unrolled with compile-time indices, so
// the scores stay in registers and a lane's logit and bias loads are issued together (with a
// run-time bound the arrays lived in a 384-byte stack frame).
template <int kPer, bool kShared>
__device__ __forceinline__ void route_token_t(const ops::MoeRouteParams& p, const float* logits, int64_t t, int lane) {
  const int E = p.num_experts, K = p.topk;
  float lv[kPer], bv[kPer], s[kPer], c[kPer];
  uint32_t taken = 0;  // bit i: expert lane + 32 i is chosen (or does not exist)
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    lv[i] = e < E ? (kShared ? logits[e] : __ldcg(logits + e)) : 0.0f;
    bv[i] = e < E && p.bias ? p.bias[e] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    s[i] = 0.0f;
    c[i] = kNegInf;
    if (e >= E) {
      taken |= 1u << i;
      continue;
    }
    const float sv = sigmoid_value(lv[i]);
    const float cv = __fadd_rn(sv, bv[i]);
    s[i] = sv;
    c[i] = isnan(cv) ? kNegInf : cv;
  }
  float chosen_s[kMaxTopk];
#pragma unroll
  for (int j = 0; j < kMaxTopk; ++j) {
    if (j >= K) break;
    // The lane's best among its free experts (ascending ids, so ties keep the lower id), then
    // the warp's: a total order (score descending, id ascending) gives every lane the same one.
    float best = kNegInf;
    int bid = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if ((taken >> i) & 1u) continue;
      if (bid == INT_MAX || c[i] > best) {
        best = c[i];
        bid = lane + 32 * i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      if (ob > best || (ob == best && oi < bid)) {
        best = ob;
        bid = oi;
      }
    }
    const int owner = bid & 31, slot = bid >> 5;
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i == slot) mine = s[i];
    chosen_s[j] = __shfl_sync(0xffffffffu, mine, owner);
    if (lane == owner) taken |= 1u << slot;
    if (lane == 0) p.ids[t * K + j] = bid - p.id_offset;
  }
  if (lane == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j)
      if (j < K) sum = __fadd_rn(sum, chosen_s[j]);
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j) {
      if (j >= K) break;
      float w = chosen_s[j];
      if (p.renormalize) w = __fdiv_rn(w, sum);
      p.weights[t * K + j] = __fmul_rn(w, p.scaling);
    }
  }
}

template <bool kShared = false>
__device__ void route_token(const ops::MoeRouteParams& p, const float* logits, int64_t t, int lane) {
  const int per = (p.num_experts + 31) / 32;
  if (per <= 4) {
    route_token_t<4, kShared>(p, logits, t, lane);
  } else if (per <= 8) {
    route_token_t<8, kShared>(p, logits, t, lane);
  } else {
    route_token_t<kMaxExperts / 32, kShared>(p, logits, t, lane);
  }
}

// PDL (common.cuh, chain_pdl): waits for the router GEMM before it reads the logits.
__global__ void moe_route_kernel(ops::MoeRouteParams p, const float* logits) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.num_tokens) return;
  route_token(p, logits + t * p.num_experts, t, threadIdx.x & 31);
}

// Fused: grid (slices, expert groups), 8 warps. partial: [slices, tokens, E]; logits: [tokens, E];
// counters[g] (one a group) and counters[groups] (groups done), returned to zero.
__global__ void __launch_bounds__(256) moe_route_fused_kernel(ops::MoeRouteParams p, float* partial, float* logits,
                                                              int32_t* counters, bool vec) {
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = p.num_experts, S = gridDim.x, G = gridDim.y;
  const int64_t T = p.num_tokens, H = p.hidden;
  const int s = blockIdx.x, g = blockIdx.y;
  const int e = g * kGroupExperts + warp;
  const bool bf16 = p.x_dtype == DType::BF16;
  // PDL: the router weights load before waiting for x's writer; every thread waits.
  pdl_trigger();
  if (e >= E) pdl_wait();
  if (e < E) {
    // Lane l's columns: k0 + 4 l + 128 m + 0..3, m < 4 (16-byte runs, coalesced).
    const int64_t k0 = int64_t(s) * kSlice;
    float wv[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int64_t k = k0 + 4 * lane + 128 * m;
#pragma unroll
      for (int i = 0; i < 4; ++i) wv[m][i] = k + i < H ? p.gate[int64_t(e) * H + k + i] : 0.0f;
    }
    pdl_wait();
    // Four tokens at a time (independent loads in flight); x as 16-byte (F32) or 8-byte (BF16)
    // runs when vec (rows aligned, hidden % 4 == 0), else element by element.
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int64_t k = k0 + 4 * lane + 128 * m;
        if (k >= H) continue;
#pragma unroll
        for (int tt = 0; tt < 4; ++tt) {
          const int64_t t = t0 + tt;
          if (t >= T) continue;
          float xv[4];
          if (vec && bf16) {
            unpack_bf16x4(__ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.x) + t * p.ldx + k)), xv);
          } else if (vec) {
            unpack_f32x4(__ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + t * p.ldx + k)), xv);
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) xv[i] = k + i < H ? load_act(p.x, t * p.ldx + k + i, bf16) : 0.0f;
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[tt] = fmaf(xv[i], wv[m][i], acc[tt]);
        }
      }
#pragma unroll
      for (int tt = 0; tt < 4; ++tt) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[tt] += __shfl_xor_sync(0xffffffffu, acc[tt], o);
        if (lane == 0 && t0 + tt < T) partial[(int64_t(s) * T + t0 + tt) * E + e] = acc[tt];
      }
    }
  }
  // The group's last slice sums the slices in order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int old = atomicAdd(&counters[g], 1);
    last = old == S - 1;
    if (last) counters[g] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t i = threadIdx.x; i < T * kGroupExperts; i += blockDim.x) {
    const int64_t t = i / kGroupExperts;
    const int ee = g * kGroupExperts + int(i % kGroupExperts);
    if (ee >= E) continue;
    float sum = 0.0f;
    for (int k = 0; k < S; ++k) sum += __ldcg(partial + (int64_t(k) * T + t) * E + ee);
    logits[t * E + ee] = sum;
  }
  // The last group routes every token.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int old = atomicAdd(&counters[G], 1);
    last = old == G - 1;
    if (last) counters[G] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t t = warp; t < T; t += blockDim.x / 32) route_token(p, logits + t * E, t, lane);
}

// Split-K router GEMM (F32 x, decode): grid (slices of 16 x kWarps hidden columns, groups of 32
// experts), kWarps warps (8, or 4 for twice the CTAs: MoeTuning::route_splitk_warps). Lane l
// holds expert 32 g + l's weights over its warp's 16 columns in registers (loaded before
// pdl_wait); the tokens' x slice is staged in shared memory kSkTokens at a time and read as
// broadcasts (every lane the same address), so a warp does 16 FMAs a token for 4 shared loads.
// The warps' sums meet in shared memory and are added in warp order into partial [slices,
// tokens, E]; moe_route_sum_kernel adds the slices in slice order and routes. Every sum has a
// fixed order: the result does not depend on scheduling.
constexpr int kSkWarpCols = 16;
constexpr int kSkTokens = 32;  // a decode batch's tokens in one round (16: a second round's latency)

template <int kWarps>
__global__ void __launch_bounds__(kWarps * 32) moe_route_splitk_kernel(ops::MoeRouteParams p, float* partial, bool vec) {
  constexpr int kSkCols = kWarps * kSkWarpCols;
  __shared__ __align__(16) float xs[kSkTokens][kSkCols];
  __shared__ float red[kWarps][kSkTokens][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = p.num_experts;
  const int64_t T = p.num_tokens, H = p.hidden;
  const int s = blockIdx.x, g = blockIdx.y;
  const int e = g * 32 + lane;
  const int64_t k0 = int64_t(s) * kSkCols;
  const int64_t kw = k0 + warp * kSkWarpCols;
  pdl_trigger();
  float wv[kSkWarpCols];
  if (e < E && vec && kw + kSkWarpCols <= H) {
    const float4* src = reinterpret_cast<const float4*>(p.gate + int64_t(e) * H + kw);
#pragma unroll
    for (int j = 0; j < kSkWarpCols / 4; ++j) {
      const float4 f = __ldg(src + j);
      wv[4 * j] = f.x, wv[4 * j + 1] = f.y, wv[4 * j + 2] = f.z, wv[4 * j + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kSkWarpCols; ++j) wv[j] = e < E && kw + j < H ? p.gate[int64_t(e) * H + kw + j] : 0.0f;
  }
  pdl_wait();
  const float* x = static_cast<const float*>(p.x);
  for (int64_t t0 = 0; t0 < T; t0 += kSkTokens) {
    __syncthreads();  // the previous chunk's xs and red are read
    // Stage x[t0 .. t0 + 16, k0 .. k0 + kSkCols) (zeros past the tokens and the hidden size).
    for (int i = threadIdx.x; i < kSkTokens * kSkCols / 4; i += blockDim.x) {
      const int tt = i / (kSkCols / 4), c = 4 * (i % (kSkCols / 4));
      const int64_t t = t0 + tt, k = k0 + c;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < T) {
        if (vec && k + 4 <= H) {
          unpack_f32x4(__ldg(reinterpret_cast<const float4*>(x + t * p.ldx + k)), v);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q) v[q] = k + q < H ? x[t * p.ldx + k + q] : 0.0f;
        }
      }
      *reinterpret_cast<float4*>(&xs[tt][c]) = make_float4(v[0], v[1], v[2], v[3]);
    }
    __syncthreads();
#pragma unroll
    for (int tt = 0; tt < kSkTokens; ++tt) {
      if (t0 + tt >= T) break;  // the last chunk's missing tokens (uniform across the CTA)
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kSkWarpCols; j += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(&xs[tt][warp * kSkWarpCols + j]);
        acc = fmaf(xv.x, wv[j], acc);
        acc = fmaf(xv.y, wv[j + 1], acc);
        acc = fmaf(xv.z, wv[j + 2], acc);
        acc = fmaf(xv.w, wv[j + 3], acc);
      }
      red[warp][tt][lane] = acc;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kSkTokens * 32; i += blockDim.x) {
      const int tt = i / 32, el = i % 32;
      const int64_t t = t0 + tt;
      const int ee = g * 32 + el;
      if (t >= T || ee >= E) continue;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][tt][el];
      partial[(int64_t(s) * T + t) * E + ee] = sum;
    }
  }
}

// After moe_route_splitk_kernel: a CTA a token adds its partial logits over the S slices in slice
// order into shared memory (up to kSumInFlight slices' loads in flight at once: one L2 round trip
// at decode's 48), then its first warp routes the token from there.
constexpr int kSumInFlight = 64;
__global__ void __launch_bounds__(128) moe_route_sum_kernel(ops::MoeRouteParams p, const float* partial, int S) {
  __shared__ float lg[kMaxExperts];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.x, T = p.num_tokens;
  const int E = p.num_experts;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float* src = partial + t * E + e;
    float sum = 0.0f;
    if (S <= kSumInFlight) {
      float v[kSumInFlight];
#pragma unroll
      for (int q = 0; q < kSumInFlight; ++q)
        if (q < S) v[q] = __ldcg(src + int64_t(q) * T * E);
#pragma unroll
      for (int q = 0; q < kSumInFlight; ++q)
        if (q < S) sum += v[q];
    } else {
      int k = 0;
      for (; k + 16 <= S; k += 16) {  // 16 loads in flight, added in order
        float v[16];
#pragma unroll
        for (int q = 0; q < 16; ++q) v[q] = __ldcg(src + int64_t(k + q) * T * E);
#pragma unroll
        for (int q = 0; q < 16; ++q) sum += v[q];
      }
      for (; k < S; ++k) sum += __ldcg(src + int64_t(k) * T * E);
    }
    lg[e] = sum;
  }
  __syncthreads();
  if (threadIdx.x < 32) route_token<true>(p, lg, t, threadIdx.x);
}

// The split-K router GEMM's rule (run_moe_route and ops::moe_route_splits): F32 x with the GEMM in
// the op, decode batches up to moe.route_splitk_max_tokens, not the fused kernel's batches. The
// hidden slices a call splits into, or 0 where it takes another path. (Slices of 64 or 128
// columns within the grid's 65535 bound also keep the fused kernel's slices of 512 within it, and
// kMaxExperts keeps the expert groups far below it.)
int64_t splitk_slices(const ops::MoeRouteParams& p) {
  if (p.logits || !p.x || !p.gate || p.x_dtype != DType::F32 || p.hidden <= 0) return 0;
  if (p.num_experts <= 0 || p.num_experts > kMaxExperts || p.topk <= 0 || p.topk > kMaxTopk) return 0;
  const int64_t T = p.num_tokens;
  if (T <= 0 || T <= tuning().moe.route_fused_max_tokens || T > tuning().moe.route_splitk_max_tokens) return 0;
  const int64_t cols = (tuning().moe.route_splitk_warps == 4 ? 4 : 8) * kSkWarpCols;
  const int64_t slices = (p.hidden + cols - 1) / cols;
  return slices <= 65535 && T <= INT_MAX ? slices : 0;
}

}  // namespace

bool moe_route_splits(const ops::MoeRouteParams& p) { return splitk_slices(p) > 0; }

bool run_moe_route(const ops::MoeRouteParams& p, void* stream_v) {
  if (p.num_tokens <= 0) return true;
  if ((!p.logits && !(p.x && p.gate)) || !p.ids || !p.weights) throw Error("moe_route: null operand");
  if (p.num_experts <= 0 || p.topk <= 0 || p.topk > p.num_experts)
    throw Error("moe_route: need 0 < topk <= num_experts");
  if (p.num_experts > kMaxExperts || p.topk > kMaxTopk) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);
  const int64_t T = p.num_tokens, E = p.num_experts;
  constexpr int kWarps = 4;
  const int64_t blocks = (T + kWarps - 1) / kWarps;
  if (blocks > INT_MAX) return false;
  const bool pdl = chain_pdl(st, T);
  if (p.logits) {
    launch_pdl(pdl, moe_route_kernel, dim3(unsigned(blocks)), dim3(kWarps * 32), 0, st, "moe_route", p, p.logits);
    return true;
  }
  if (p.hidden <= 0 || p.ldx < p.hidden) throw Error("moe_route: the fused router GEMM needs hidden and ldx");
  if (p.x_dtype != DType::F32 && p.x_dtype != DType::BF16) return false;
  const int64_t S = (p.hidden + kSlice - 1) / kSlice, G = (E + kGroupExperts - 1) / kGroupExperts;
  if (S > 65535 || G > 65535) return false;
  const bool fused = T <= tuning().moe.route_fused_max_tokens || p.x_dtype == DType::BF16;
  const int sk_warps = tuning().moe.route_splitk_warps == 4 ? 4 : 8;
  const int64_t sk_slices = splitk_slices(p), sk_groups = (E + 31) / 32;
  // Scratch, in the MoE scratch (moe_experts, which reuses it, runs after the routing on the
  // stream): split-K, [partial S x T x E] (the sum kernel keeps a token's logits in shared memory);
  // otherwise [logits T x E][fused: partial S x T x E].
  const size_t logit_bytes = (size_t(T * E) * 4 + 255) / 256 * 256;
  if (sk_slices > 0) {
    auto* partial = static_cast<float*>(private_scratch(st, kScratchMoe, size_t(sk_slices * T * E) * 4));
    const bool vec = p.hidden % 4 == 0 && p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(p.gate) % 16 == 0;
    launch_pdl(pdl, sk_warps == 4 ? moe_route_splitk_kernel<4> : moe_route_splitk_kernel<8>,
               dim3(unsigned(sk_slices), unsigned(sk_groups)), dim3(sk_warps * 32), 0, st, "moe_route (split-K router GEMM)",
               p, partial, vec);
    launch_pdl(pdl, moe_route_sum_kernel, dim3(unsigned(T)), dim3(128), 0, st, "moe_route (split-K sum)", p,
               static_cast<const float*>(partial), int(sk_slices));
    return true;
  }
  auto* base = static_cast<uint8_t*>(private_scratch(st, kScratchMoe, logit_bytes + (fused ? size_t(S * T * E) * 4 : 0)));
  auto* logits = reinterpret_cast<float*>(base);
  if (fused) {
    int32_t* counters = zeroed_counters(st, size_t(G + 1));
    const size_t esz = p.x_dtype == DType::BF16 ? 2 : 4;
    const bool vec = p.hidden % 4 == 0 && p.ldx % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % (4 * esz) == 0;
    launch_pdl(pdl, moe_route_fused_kernel, dim3(unsigned(S), unsigned(G)), dim3(256), 0, st,
               "moe_route (fused router GEMM)", p, reinterpret_cast<float*>(base + logit_bytes), logits, counters, vec);
    return true;
  }
  ops::MatmulParams mm;
  mm.x = p.x;
  mm.x_dtype = p.x_dtype;
  mm.w = p.gate;
  mm.w_dtype = DType::F32;
  mm.y = logits;
  mm.y_dtype = DType::F32;
  mm.m = T;
  mm.n = E;
  mm.k = p.hidden;
  mm.ldx = p.ldx;
  mm.ldy = E;
  if (!run_matmul(mm, stream_v)) return false;
  launch_pdl(pdl, moe_route_kernel, dim3(unsigned(blocks)), dim3(kWarps * 32), 0, st, "moe_route", p,
             static_cast<const float*>(logits));
  return true;
}

}  // namespace sieve::cuda
