// CUDA moe_route and moe_experts (kernels/ops.h; CPU reference in kernels/cpu/cpu_dense.cpp).
//
// moe_route: one warp a token; the top-k by k rounds of a warp arg-max (higher biased score,
// then lower expert id; NaN ranks as -inf), the weights summed in rank order as on the CPU.
//
// moe_experts, per chunk of tokens (sized so its intermediate rows fit a 256 MiB scratch), four
// kernels and no host synchronisation, so the op can be captured in a CUDA graph:
//  1. sort: one CTA counts the (token, slot) pairs of each expert, lays the experts' row ranges
//     and 64-row tiles out by prefix sums and scatters each pair's index into its expert's range;
//  2. gate_up: a CTA per (tile, 32 intermediate columns) multiplies the tile's token rows by the
//     expert's gate and up rows and applies SwiGLU-OAI in its epilogue (fp32);
//  3. down: a CTA per (tile, 64 hidden columns) multiplies those rows by the expert's down rows
//     into a row per pair;
//  4. combine: out[t] += sum of weight x row over the token's experts, in expert-id order (the CPU
//     reference's order), one rounding to the activation dtype at the end.
// Products and sums are fp32 (weights converted exactly), as on the CPU; only the order of the
// dot products' sums differs. A row's result does not depend on where it lands in its expert's
// range, so the sort's order (shared-memory atomics) does not change the output. The grid of
// steps 2 and 3 is an upper bound on the tiles (pairs / 64 + experts); CTAs past the last tile
// return at once.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

constexpr int kMaxExperts = 1024;  // moe_route: 32 per lane
constexpr int kMaxTopk = 32;
constexpr int kBM = 64, kBN = 64, kBK = 32, kGemmThreads = 256;
constexpr int kSortThreads = 1024;
constexpr int kMaxSortExperts = 4096;  // two int32 per expert in shared memory
constexpr size_t kScratchBytes = size_t(256) << 20;
std::atomic<int64_t> g_chunk_tokens{0};  // test hook; 0: from kScratchBytes

// ---------------------------------------------------------------------------------------------
// moe_route

__global__ void moe_route_kernel(ops::MoeRouteParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.num_tokens) return;
  const int E = p.num_experts, K = p.topk;
  const int per = (E + 31) / 32;
  float s[kMaxExperts / 32], c[kMaxExperts / 32];
  uint32_t taken = 0;  // bit i: expert lane + 32 i is chosen (or does not exist)
  for (int i = 0; i < kMaxExperts / 32; ++i) {
    const int e = lane + 32 * i;
    s[i] = 0.0f;
    c[i] = kNegInf;
    if (i >= per || e >= E) {
      taken |= 1u << i;
      continue;
    }
    const float sv = sigmoid_value(p.logits[t * E + e]);
    const float cv = __fadd_rn(sv, p.bias ? p.bias[e] : 0.0f);
    s[i] = sv;
    c[i] = isnan(cv) ? kNegInf : cv;
  }
  float chosen_s[kMaxTopk];
  for (int j = 0; j < K; ++j) {
    // The lane's best among its free experts (ascending ids, so ties keep the lower id), then
    // the warp's: a total order (score descending, id ascending) gives every lane the same one.
    float best = kNegInf;
    int bid = INT_MAX;
    for (int i = 0; i < per; ++i) {
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
    for (int i = 0; i < kMaxExperts / 32; ++i)
      if (i == slot) mine = s[i];
    chosen_s[j] = __shfl_sync(0xffffffffu, mine, owner);
    if (lane == owner) taken |= 1u << slot;
    if (lane == 0) p.ids[t * K + j] = bid;
  }
  if (lane == 0) {
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) sum = __fadd_rn(sum, chosen_s[j]);
    for (int j = 0; j < K; ++j) {
      float w = chosen_s[j];
      if (p.renormalize) w = __fdiv_rn(w, sum);
      p.weights[t * K + j] = __fmul_rn(w, p.scaling);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_experts

// Step 1. offsets[e] .. offsets[e + 1]: expert e's rows of `sorted` (pair indices t * topk + j
// of the chunk); tile_start[e]: its first 64-row tile; offsets[E], tile_start[E]: the totals.
__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(const int32_t* ids, int pairs, int E,
                                                                int32_t* offsets, int32_t* tile_start,
                                                                int32_t* sorted) {
  extern __shared__ int32_t sort_smem[];
  int32_t* cnt = sort_smem;
  int32_t* cur = sort_smem + E;
  for (int e = threadIdx.x; e < E; e += kSortThreads) cnt[e] = 0;
  __syncthreads();
  for (int q = threadIdx.x; q < pairs; q += kSortThreads) {
    const int e = ids[q];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, tiles = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = off;
      tile_start[e] = tiles;
      cur[e] = off;
      off += cnt[e];
      tiles += (cnt[e] + kBM - 1) / kBM;
    }
    offsets[E] = off;
    tile_start[E] = tiles;
  }
  __syncthreads();
  for (int q = threadIdx.x; q < pairs; q += kSortThreads) {
    const int e = ids[q];
    if (e >= 0 && e < E) sorted[atomicAdd(&cur[e], 1)] = q;
  }
}

struct GemmArgs {
  const void* x;  // gate_up: the chunk's token rows (act dtype); down: the act rows (fp32)
  int64_t ldx;
  int x_bf16;               // gate_up: x is BF16 (else F32)
  const void* const* w;     // per expert: gate_up [2 N, K] ([gate | up] rows); down [N, K]
  int w_bf16;               // weights are BF16 (else F32)
  int64_t N, K;             // gate_up: N = inter, K = hidden; down: N = hidden, K = inter
  int topk, E;
  const int32_t* sorted;
  const int32_t* offsets;
  const int32_t* tile_start;
  float* out;               // gate_up: act [rows, N] by sorted row; down: y [pairs, N] by pair
  float alpha, limit, beta;
};

// Steps 2 and 3. Thread (ty, tx) of a CTA holds rows 4 ty .. 4 ty + 3 of the tile and tile
// columns 2 tx, 2 tx + 1, 32 + 2 tx, 33 + 2 tx: with kGateUp the first two are gate columns and
// the last two the up columns of the same intermediate units, so SwiGLU needs no exchange.
template <bool kGateUp>
__global__ void __launch_bounds__(kGemmThreads) moe_gemm_kernel(GemmArgs a) {
  __shared__ float As[kBK][kBM + 1];
  __shared__ float Ws[kBK][kBN + 1];
  __shared__ int64_t src_row[kBM];  // element offset of the tile row's x row, -1: none
  __shared__ int32_t out_row[kBM];  // output row, -1: none
  const int tile = blockIdx.x;
  if (tile >= a.tile_start[a.E]) return;
  // The expert whose tiles hold this one: the last e with tile_start[e] <= tile.
  int lo = 0, hi = a.E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (a.tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int e = lo;
  const int r0 = a.offsets[e] + (tile - a.tile_start[e]) * kBM;
  const int rows = min(kBM, a.offsets[e + 1] - r0);
  const int tid = threadIdx.x;
  if (tid < kBM) {
    int64_t src = -1;
    int32_t orow = -1;
    if (tid < rows) {
      const int r = r0 + tid;
      if (kGateUp) {
        src = int64_t(a.sorted[r] / a.topk) * a.ldx;
        orow = r;
      } else {
        src = int64_t(r) * a.ldx;
        orow = a.sorted[r];
      }
    }
    src_row[tid] = src;
    out_row[tid] = orow;
  }
  const int64_t j0 = kGateUp ? int64_t(blockIdx.y) * (kBN / 2) : int64_t(blockIdx.y) * kBN;
  const void* W = a.w[e];
  __syncthreads();

  const int ty = tid / 16, tx = tid % 16;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t k0 = 0; k0 < a.K; k0 += kBK) {
#pragma unroll
    for (int q = 0; q < kBM * kBK / kGemmThreads; ++q) {
      const int idx = tid + kGemmThreads * q;
      const int i = idx / kBK, kk = idx % kBK;
      const int64_t k = k0 + kk, src = src_row[i];
      float v = 0.0f;
      if (src >= 0 && k < a.K)
        v = a.x_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(a.x)[src + k]) : static_cast<const float*>(a.x)[src + k];
      As[kk][i] = v;
    }
#pragma unroll
    for (int q = 0; q < kBN * kBK / kGemmThreads; ++q) {
      const int idx = tid + kGemmThreads * q;
      const int c = idx / kBK, kk = idx % kBK;
      const int64_t k = k0 + kk;
      int64_t n;
      bool ok;
      if (kGateUp) {
        const int64_t unit = j0 + (c % 32);
        ok = unit < a.N;
        n = (c < 32 ? 0 : a.N) + unit;
      } else {
        n = j0 + c;
        ok = n < a.N;
      }
      float v = 0.0f;
      if (ok && k < a.K)
        v = a.w_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(W)[n * a.K + k]) : static_cast<const float*>(W)[n * a.K + k];
      Ws[kk][c] = v;
    }
    __syncthreads();
    // Threads whose four rows are all past the tile's last row (decode: a few rows an expert)
    // only load; warp w holds rows 8 w .. 8 w + 7 (ty = 2 w, 2 w + 1), so whole warps skip.
#pragma unroll 8
    for (int kk = 0; kk < (ty * 4 < rows ? kBK : 0); ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty * 4 + i];
      bv[0] = Ws[kk][2 * tx];
      bv[1] = Ws[kk][2 * tx + 1];
      bv[2] = Ws[kk][32 + 2 * tx];
      bv[3] = Ws[kk][33 + 2 * tx];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int32_t orow = out_row[ty * 4 + i];
    if (orow < 0) continue;
    float* dst = a.out + int64_t(orow) * a.N;
    if (kGateUp) {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int64_t col = j0 + 2 * tx + jj;
        if (col < a.N) dst[col] = swiglu_oai_value(acc[i][jj], acc[i][2 + jj], a.alpha, a.limit, a.beta);
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int64_t col = j0 + (jj < 2 ? 2 * tx + jj : 32 + 2 * tx + (jj - 2));
        if (col < a.N) dst[col] = acc[i][jj];
      }
    }
  }
}

// Step 4. One CTA a token.
__global__ void moe_combine_kernel(const int32_t* ids, const float* weights, int topk, int E, const float* y,
                                   int64_t H, void* out, int ot) {
  const int64_t t = blockIdx.x;
  int order[kMaxTopk];
  int n = 0;
  for (int j = 0; j < topk; ++j) {
    const int e = ids[t * topk + j];
    if (e < 0 || e >= E) continue;
    int at = n++;
    while (at > 0 && ids[t * topk + order[at - 1]] > e) {
      order[at] = order[at - 1];
      --at;
    }
    order[at] = j;
  }
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) {
    float sum = 0.0f;
    for (int q = 0; q < n; ++q) {
      const int j = order[q];
      sum = __fadd_rn(sum, __fmul_rn(weights[t * topk + j], y[(t * topk + j) * H + d]));
    }
    const int64_t i = t * H + d;
    st_elem(out, ot, i, __fadd_rn(ld_elem(out, ot, i), sum));
  }
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

void set_moe_chunk_tokens(int64_t tokens) { g_chunk_tokens.store(std::max<int64_t>(0, tokens)); }

bool run_moe_route(const ops::MoeRouteParams& p, void* stream_v) {
  if (p.num_tokens <= 0) return true;
  if (!p.logits || !p.ids || !p.weights) throw Error("moe_route: null operand");
  if (p.num_experts <= 0 || p.topk <= 0 || p.topk > p.num_experts)
    throw Error("moe_route: need 0 < topk <= num_experts");
  if (p.num_experts > kMaxExperts || p.topk > kMaxTopk) return false;
  constexpr int kWarps = 4;
  const int64_t blocks = (p.num_tokens + kWarps - 1) / kWarps;
  if (blocks > INT_MAX) return false;
  moe_route_kernel<<<unsigned(blocks), kWarps * 32, 0, static_cast<cudaStream_t>(stream_v)>>>(p);
  SIEVE_LAUNCH_CHECK("moe_route");
  return true;
}

bool run_moe_experts(const ops::MoeExpertsParams& p, void* stream_v) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return true;
  if (!p.x || !p.out || !p.ids || !p.weights || !p.w_gate_up || !p.w_down)
    throw Error("moe_experts: null operand");
  if (p.inter <= 0 || p.topk <= 0 || p.num_experts <= 0) throw Error("moe_experts: bad sizes");
  if (p.act_dtype != DType::F32 && p.act_dtype != DType::BF16) return false;
  const int at = elem_code(p.act_dtype);
  if (p.w_dtype != DType::BF16 && p.w_dtype != DType::F32) return false;
  if (p.topk > kMaxTopk || p.num_experts > kMaxSortExperts) return false;
  const int64_t H = p.hidden, I = p.inter, T = p.num_tokens, E = p.num_experts, topk = p.topk;
  if (H > INT_MAX / 2 || I > INT_MAX / 2) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);

  // Tokens per chunk: its pairs' act and y rows (fp32) fit the scratch (at least one token).
  const size_t row_bytes = size_t(I + H) * sizeof(float) + sizeof(int32_t);
  const size_t fixed = 2 * align256(size_t(E + 1) * sizeof(int32_t)) + 3 * 256;
  int64_t chunk = int64_t((kScratchBytes - fixed) / row_bytes) / topk;
  if (const int64_t forced = g_chunk_tokens.load(std::memory_order_relaxed); forced > 0) chunk = forced;
  chunk = std::max<int64_t>(1, std::min<int64_t>({chunk, T, int64_t(INT_MAX) / topk / 2}));
  const int64_t max_pairs = chunk * topk;
  const size_t off_b = align256(size_t(E + 1) * sizeof(int32_t));
  const size_t sorted_b = align256(size_t(max_pairs) * sizeof(int32_t));
  const size_t act_b = align256(size_t(max_pairs) * size_t(I) * sizeof(float));
  const size_t y_b = align256(size_t(max_pairs) * size_t(H) * sizeof(float));
  auto* base = static_cast<uint8_t*>(private_scratch(st, kScratchMoe, 2 * off_b + sorted_b + act_b + y_b));
  auto* offsets = reinterpret_cast<int32_t*>(base);
  auto* tile_start = reinterpret_cast<int32_t*>(base + off_b);
  auto* sorted = reinterpret_cast<int32_t*>(base + 2 * off_b);
  auto* act = reinterpret_cast<float*>(base + 2 * off_b + sorted_b);
  auto* y = reinterpret_cast<float*>(base + 2 * off_b + sorted_b + act_b);
  const size_t esz = dtype_size(p.act_dtype);

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tc = std::min(chunk, T - t0);
    const int pairs = int(tc * topk);
    const int32_t* ids = p.ids + t0 * topk;
    moe_sort_kernel<<<1, kSortThreads, size_t(2 * E) * sizeof(int32_t), st>>>(ids, pairs, int(E), offsets,
                                                                              tile_start, sorted);
    SIEVE_LAUNCH_CHECK("moe_experts (sort)");
    const unsigned tiles = unsigned((pairs + kBM - 1) / kBM + E);

    GemmArgs g{};
    g.x = static_cast<const uint8_t*>(p.x) + size_t(t0 * H) * esz;
    g.ldx = H;
    g.x_bf16 = p.act_dtype == DType::BF16;
    g.w = p.w_gate_up;
    g.w_bf16 = p.w_dtype == DType::BF16;
    g.N = I;
    g.K = H;
    g.topk = int(topk);
    g.E = int(E);
    g.sorted = sorted;
    g.offsets = offsets;
    g.tile_start = tile_start;
    g.out = act;
    g.alpha = p.alpha;
    g.limit = p.limit;
    g.beta = p.beta;
    moe_gemm_kernel<true><<<dim3(tiles, unsigned((I + kBN / 2 - 1) / (kBN / 2))), kGemmThreads, 0, st>>>(g);
    SIEVE_LAUNCH_CHECK("moe_experts (gate_up)");

    g.x = act;
    g.ldx = I;
    g.x_bf16 = 0;
    g.w = p.w_down;
    g.N = H;
    g.K = I;
    g.out = y;
    moe_gemm_kernel<false><<<dim3(tiles, unsigned((H + kBN - 1) / kBN)), kGemmThreads, 0, st>>>(g);
    SIEVE_LAUNCH_CHECK("moe_experts (down)");

    moe_combine_kernel<<<unsigned(tc), 256, 0, st>>>(ids, p.weights + t0 * topk, int(topk), int(E), y, H,
                                                     static_cast<uint8_t*>(p.out) + size_t(t0 * H) * esz, at);
    SIEVE_LAUNCH_CHECK("moe_experts (combine)");
  }
  return true;
}

}  // namespace sieve::cuda
