// CUDA moe_experts with F32 and BF16 weights (kernels/ops.h; CPU reference in
// kernels/cpu/cpu_moe.cpp). FP8_E4M3 weights go to moe_fp8.cu, moe_route is in moe_route.cu.
//
// moe_experts, per chunk of tokens (sized so its intermediate rows fit a 1 GiB scratch), a few
// kernels and no host synchronisation, so the op can be captured in a CUDA graph:
//  1. sort: one CTA counts the (token, slot) pairs of each expert, lays the experts' row ranges
//     and 64-row tiles out by prefix sums and scatters each pair's index into its expert's range;
//  2. gate_up: the tile's token rows times the expert's gate and up rows, SwiGLU-OAI in the
//     epilogue (fp32), into an intermediate row per pair;
//  3. down: those rows times the expert's down rows into a row per pair (fp32);
//  4. combine: out[t] += sum of weight x row over the token's experts, in expert-id order (the CPU
//     reference's order), one rounding to out's dtype at the end.
// The products of steps 2 and 3 run on tensor cores for BF16 weights (hidden and inter multiples
// of 8): the token rows are rounded to bf16 (fp32 ones), the intermediate rows are stored in
// bf16, and mma.sync multiplies bf16 by bf16 with fp32 accumulation; in tiles of 64 rows, or of
// 16 rows for small batches (decode), whose products are bound by streaming the weights. Other
// weights (F32) and sizes take fp32 SIMT tiles, exact like the CPU: products and sums in fp32,
// weights converted exactly, only the order of the dot products' sums differs.
// A row's result does not depend on where it lands in its expert's range, so the sort's order
// (shared-memory atomics) does not change the output. The grids of steps 2 and 3 are an upper
// bound on the tiles (pairs / 64 + experts); CTAs past the last tile return at once.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/moe_common.cuh"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {

constexpr int kMaxTopk = 32;
constexpr int kBM = 64, kBN = 64, kBK = 32, kGemmThreads = 256;
constexpr int kSortThreads = 1024;
constexpr int kMaxSortExperts = 4096;  // two int32 per expert in shared memory
constexpr size_t kScratchBytes = size_t(1) << 30;
// Tensor-core tiles of 16 rows (moe_mma_small_kernel) while a chunk has at most this many
// (token, expert) pairs an expert on average; 64-row tiles above.
constexpr int kSmallTilePairsPerExpert = 8;

// ---------------------------------------------------------------------------------------------
// moe_experts

// Step 1. offsets[e] .. offsets[e + 1]: expert e's rows of `sorted` (pair indices t * topk + j
// of the chunk); tile_start[e]: its first tile of `tile_rows` rows; offsets[E], tile_start[E]:
// the totals.
__global__ void __launch_bounds__(kSortThreads) moe_sort_kernel(const int32_t* ids, int pairs, int E, int tile_rows,
                                                                int32_t* offsets, int32_t* tile_start,
                                                                int32_t* sorted) {
  extern __shared__ int32_t sort_smem[];
  sort_pairs(ids, pairs, E, tile_rows, sort_smem, sort_smem + E, offsets, tile_start, sorted, nullptr);
}

// The expert whose tiles hold `tile`: the last e with tile_start[e] <= tile.
__device__ __forceinline__ int tile_expert(const int32_t* tile_start, int E, int tile) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
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

// Steps 2 and 3 on fp32 SIMT tiles. Thread (ty, tx) of a CTA holds rows 4 ty .. 4 ty + 3 of the tile and tile
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
  const int e = tile_expert(a.tile_start, a.E, tile);
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

// ---------------------------------------------------------------------------------------------
// Tensor-core products (BF16 weights, hidden and inter multiples of 8): bf16 x bf16 mma.sync with
// fp32 accumulation over 64 x 128 x 64 tiles. gate_up reads bf16 token rows (fp32 ones rounded
// to bf16 by one pass over the chunk first) through the sort's indirection; SwiGLU's output is
// stored in bf16 for down. Both operands come by cp.async.

// 64-wide k steps in 3 stages (83 KB of shared memory, two CTAs an SM) measured faster on the H200
// than 32-wide ones in 3 or 4 stages (docs/performance.md).
constexpr int kTM = 64, kTN = 128, kTK = 64, kTStages = 3, kTThreads = 128;
constexpr int kTLd = kTK + 8;  // shared row: 144 bytes, so ldmatrix's 8 rows hit distinct banks
constexpr size_t kTSmem = size_t(kTStages) * (kTM + kTN) * kTLd * 2;

// 16 bytes into shared memory: by cp.async from `src`, or zeros when `src` is null.
__device__ __forceinline__ void copy16_or_zero(void* dst, const void* src) {
  if (src) {
    cp_async16(dst, src);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

struct MmaArgs {
  const void* x;             // gate_up: the chunk's token rows [tokens, K]: BF16 (64-row tiles), or
                             // F32 unless x_bf16 (16-row tiles)
  int x_bf16, topk;
  const uint16_t* act_in;    // down: SwiGLU rows [rows, K] bf16 by sorted row
  const void* const* w;      // per expert, bf16: gate_up [2 N, K] ([gate | up] rows); down [N, K]
  int64_t N, K;              // gate_up: N = inter, K = hidden; down: N = hidden, K = inter
  int E;
  const int32_t* sorted;
  const int32_t* offsets;
  const int32_t* tile_start;
  uint16_t* act;             // gate_up: [rows, N] bf16 by sorted row
  float* y;                  // down: [pairs, N] fp32 by pair
  float alpha, limit, beta;
  int nblocks;               // CTAs a tile: 128 weight rows each
};

// A tensor-core CTA's tile (the grid's x is tile x weight-row block, blocks fastest): its expert,
// first sorted row and row count, with row_of[i] (gate_up: element offset of tile row i's x
// row; down: its pair; -1 past the rows) filled by the first kRows threads before a barrier.
// False for the CTAs past the last tile, which return.
struct Tile {
  int e, r0, rows;
  int64_t j0;            // the CTA's first unit (gate_up: 64 a CTA) or weight row (down: 128)
  const uint16_t* W;     // the expert's weights
};
template <bool kGateUp, int kRows>
__device__ __forceinline__ bool load_tile(const MmaArgs& a, int64_t* row_of, Tile& t) {
  const int tile = int(blockIdx.x / unsigned(a.nblocks));
  if (tile >= a.tile_start[a.E]) return false;
  t.e = tile_expert(a.tile_start, a.E, tile);
  t.r0 = a.offsets[t.e] + (tile - a.tile_start[t.e]) * kRows;
  t.rows = min(kRows, a.offsets[t.e + 1] - t.r0);
  t.j0 = int64_t(blockIdx.x % unsigned(a.nblocks)) * (kGateUp ? 64 : 128);
  t.W = static_cast<const uint16_t*>(a.w[t.e]);
  const int tid = threadIdx.x;
  if (tid < kRows) {
    int64_t v = -1;
    if (tid < t.rows) v = kGateUp ? int64_t(a.sorted[t.r0 + tid] / a.topk) * a.K : int64_t(a.sorted[t.r0 + tid]);
    row_of[tid] = v;
  }
  __syncthreads();
  return true;
}

// Weight row c (0 .. 127) of the CTA whose first unit (gate_up) or weight row (down) is j0, at
// k = 0; null past N. kGateUp: 64 units' gate and up rows interleaved in runs of 8 (gate units
// 8 p .. 8 p + 7, then their up rows).
template <bool kGateUp>
__device__ __forceinline__ const uint16_t* weight_row(const MmaArgs& a, const uint16_t* W, int64_t j0, int c) {
  if (kGateUp) {
    const int64_t unit = j0 + 8 * (c >> 4) + (c & 7);
    return unit < a.N ? W + (((c & 8) ? a.N : 0) + unit) * a.K : nullptr;
  }
  return j0 + c < a.N ? W + (j0 + c) * a.K : nullptr;
}

// Tile row i's token row at k = 0 (element type T: x's, or bf16 for down), null past the tile's
// rows: gate_up's x row through the sort (row_of: its element offset), down's SwiGLU row r0 + i.
template <bool kGateUp, class T>
__device__ __forceinline__ const T* token_row(const MmaArgs& a, const int64_t* row_of, int r0, int i, int rows) {
  if (i >= rows) return nullptr;
  if (kGateUp) return static_cast<const T*>(a.x) + row_of[i];
  return reinterpret_cast<const T*>(a.act_in + int64_t(r0 + i) * a.K);
}

// 16 bytes at element k of a row (null: zeros), k past K giving zeros too (K % 8 == 0).
template <class T>
__device__ __forceinline__ void copy_row16(void* dst, const T* row, int64_t k, int64_t K) {
  copy16_or_zero(dst, row && k < K ? row + k : nullptr);
}

// A CTA per (64-row tile, 128 weight rows); 4 warps, warp w takes tile rows 32 (w & 1) .. + 31
// and weight rows 64 (w >> 1) .. + 63 (8 n8 tiles); a 3-stage cp.async ring over k in dynamic
// shared memory.
// kGateUp: the 128 weight rows are 64 units' gate and up rows interleaved in runs of 8 (gate
// units 8 p .. 8 p + 7, then their up rows), so n8 tiles 2 i and 2 i + 1 of a warp hold a unit's
// gate and up sums in the same registers of the same lane and SwiGLU needs no exchange.
// The grid is one-dimensional with the weight-row blocks of a tile adjacent, so the CTAs that
// share a tile's rows, and the tiles of one expert that share its weights, run together and
// find them in L2.
template <bool kGateUp>
__global__ void __launch_bounds__(kTThreads, 2) moe_mma_kernel(MmaArgs a) {
  extern __shared__ uint4 moe_tile_smem[];
  auto As = reinterpret_cast<uint16_t(*)[kTM][kTLd]>(moe_tile_smem);
  auto Ws = reinterpret_cast<uint16_t(*)[kTN][kTLd]>(reinterpret_cast<uint16_t*>(moe_tile_smem) +
                                                      size_t(kTStages) * kTM * kTLd);
  __shared__ int64_t row_of[kTM];
  Tile t;
  if (!load_tile<kGateUp, kTM>(a, row_of, t)) return;
  static_assert(kTN == 128, "128 weight rows a CTA (load_tile's j0)");
  const int r0 = t.r0, rows = t.rows;
  const int64_t j0 = t.j0, nk = (a.K + kTK - 1) / kTK;
  const uint16_t* W = t.W;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Stage s <- k step kt by 16-byte cp.async chunks (rows past the tile, units past N and k past
  // K are zeros); a thread's chunks are the same every k step: rows (and their sources) fixed,
  // 8-element column ch.
  constexpr int kAq = kTM * kTK / 8 / kTThreads, kWq = kTN * kTK / 8 / kTThreads;
  const uint16_t* a_src[kAq];
  const uint16_t* w_src[kWq];
#pragma unroll
  for (int q = 0; q < kAq; ++q)
    a_src[q] = token_row<kGateUp, uint16_t>(a, row_of, r0, (tid + kTThreads * q) / (kTK / 8), rows);
#pragma unroll
  for (int q = 0; q < kWq; ++q) w_src[q] = weight_row<kGateUp>(a, W, j0, (tid + kTThreads * q) / (kTK / 8));
  const int ch = tid % (kTK / 8);  // kTThreads is a multiple of kTK / 8: the same column for every q
  auto load_async = [&](int s, int64_t kt) {
    const int64_t k = kt * kTK + 8 * ch;
#pragma unroll
    for (int q = 0; q < kAq; ++q) copy_row16(&As[s][(tid + kTThreads * q) / (kTK / 8)][8 * ch], a_src[q], k, a.K);
#pragma unroll
    for (int q = 0; q < kWq; ++q) copy_row16(&Ws[s][(tid + kTThreads * q) / (kTK / 8)][8 * ch], w_src[q], k, a.K);
  };
#pragma unroll
  for (int s = 0; s < kTStages - 1; ++s) {
    if (s < nk) load_async(s, s);
    cp_async_commit();
  }
  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mt][nt][c] = 0.0f;
  const int wm = 32 * (warp & 1), wn = 64 * (warp >> 1);
  const bool active = wm < rows;  // decode: a few rows an expert, so warps 1 and 3 only load
  for (int64_t kt = 0; kt < nk; ++kt) {
    cp_async_wait<kTStages - 2>();
    __syncthreads();  // stage kt landed for all; every warp is done with stage kt - 1
    const int64_t next = kt + kTStages - 1;
    if (next < nk) load_async(int(next % kTStages), next);
    cp_async_commit();
    const int s = int(kt % kTStages);
    if (active) {
#pragma unroll
      for (int ks = 0; ks < kTK / 16; ++ks) {
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(af[mt], &As[s][wm + 16 * mt + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bf[4];
          ldmatrix_x4(bf, &Ws[s][wn + 16 * np + (lane & 7) + 8 * (lane >> 4)][16 * ks + 8 * ((lane >> 3) & 1)]);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_bf16(acc[mt][2 * np], af[mt], bf[0], bf[1]);
            mma_bf16(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
          }
        }
      }
    }
  }
  cp_async_wait_all();
  if (!active) return;

  // acc[mt][nt][2 h + c]: tile row wm + 16 mt + lane / 4 + 8 h, weight row wn + 8 nt + 2 (lane % 4) + c.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = wm + 16 * mt + (lane >> 2) + 8 * h;
      if (row >= rows) continue;
      if (kGateUp) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t unit = j0 + wn / 2 + 8 * i + 2 * (lane & 3);
          if (unit >= a.N) continue;  // N % 8 == 0: unit + 1 < N too
          const float v0 = swiglu_oai_value(acc[mt][2 * i][2 * h], acc[mt][2 * i + 1][2 * h], a.alpha, a.limit, a.beta);
          const float v1 =
              swiglu_oai_value(acc[mt][2 * i][2 * h + 1], acc[mt][2 * i + 1][2 * h + 1], a.alpha, a.limit, a.beta);
          *reinterpret_cast<uint32_t*>(a.act + int64_t(r0 + row) * a.N + unit) = pack_bf16x2(v0, v1);
        }
      } else {
        float* dst = a.y + row_of[row] * a.N;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int64_t col = j0 + wn + 8 * nt + 2 * (lane & 3);
          if (col < a.N) *reinterpret_cast<float2*>(dst + col) = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
        }
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Small batches (decode: a few rows an expert), where the products are bound by streaming the
// routed experts' weights. Tiles of 16 rows (one m16 MMA row block, so a lone row wastes little
// tensor work), 128 weight rows a CTA, 64-element k steps in a 4-stage cp.async ring: 48 KB of
// weights in flight a CTA, two CTAs an SM. Both operands come by cp.async, so no thread waits on
// a load it issued in the same step: fp32 token rows land in shared memory as fp32 and are
// rounded to bf16 while the A fragments are built (the rounding of the 64-row tiles'
// conversion pass); bf16 rows (down's SwiGLU rows, bf16 activations) land as they are.
// Warp w takes the 32 weight rows 32 w .. 32 w + 31 (4 n8 tiles) of all 16 rows; with kGateUp
// they are the gate and up rows of 16 units, interleaved in runs of 8 as in the large tiles.

constexpr int kSM = 16, kSN = 128, kSK = 64, kSStages = 4, kSThreads = 128;
constexpr int kSWLd = kSK + 8;   // bf16 row in shared memory: 144 bytes, ldmatrix rows on distinct banks
constexpr int kSXLd = kSK + 8;   // fp32 row: 288 bytes, a half-warp's fragment float2 loads on distinct banks
constexpr size_t kSWStage = size_t(kSN) * kSWLd * 2, kSAStage = size_t(kSM) * kSXLd * 4;
constexpr size_t kSmallSmem = kSStages * (kSWStage + kSAStage);  // 92,160 bytes

template <bool kGateUp, bool kAF32>
__global__ void __launch_bounds__(kSThreads, 2) moe_mma_small_kernel(MmaArgs a) {
  extern __shared__ uint4 moe_small_smem[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>(moe_small_smem);
  __shared__ int64_t row_of[kSM];
  Tile t;
  if (!load_tile<kGateUp, kSM>(a, row_of, t)) return;
  static_assert(kSN == 128, "128 weight rows a CTA (load_tile's j0)");
  const int r0 = t.r0, rows = t.rows;
  const int64_t j0 = t.j0, nk = (a.K + kSK - 1) / kSK;
  const uint16_t* W = t.W;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto w_stage = [&](int s) { return reinterpret_cast<uint16_t*>(smem + size_t(s) * kSWStage); };
  auto a_stage = [&](int s) { return smem + kSStages * kSWStage + size_t(s) * kSAStage; };

  // Stage s <- k step kt in 16-byte chunks (rows past the tile, units past N and k past K are
  // zeros); a thread's chunks are the same every k step: rows fixed, column ch (weights, fp32
  // rows) or cha (bf16 rows).
  using AT = std::conditional_t<kAF32, float, uint16_t>;
  constexpr int kWq = kSN * kSK / 8 / kSThreads, kAElems = 16 / int(sizeof(AT));
  constexpr int kAq = kSM * kSK / kAElems / kSThreads;
  static_assert(kAq >= 1 && kSThreads % (kSK / kAElems) == 0, "whole chunks of the token rows a thread");
  const uint16_t* w_src[kWq];
  const AT* a_src[kAq];
#pragma unroll
  for (int q = 0; q < kWq; ++q) w_src[q] = weight_row<kGateUp>(a, W, j0, (tid + kSThreads * q) / (kSK / 8));
#pragma unroll
  for (int q = 0; q < kAq; ++q)
    a_src[q] = token_row<kGateUp, AT>(a, row_of, r0, (tid + kSThreads * q) / (kSK / kAElems), rows);
  const int ch = tid % (kSK / 8), cha = tid % (kSK / kAElems);
  constexpr int kALd = kAF32 ? kSXLd : kSWLd;
  auto load_stage = [&](int s, int64_t kt) {
    uint16_t* ws = w_stage(s);
#pragma unroll
    for (int q = 0; q < kWq; ++q)
      copy_row16(ws + ((tid + kSThreads * q) / (kSK / 8)) * kSWLd + 8 * ch, w_src[q], kt * kSK + 8 * ch, a.K);
    AT* as = reinterpret_cast<AT*>(a_stage(s));
#pragma unroll
    for (int q = 0; q < kAq; ++q)
      copy_row16(as + ((tid + kSThreads * q) / (kSK / kAElems)) * kALd + kAElems * cha, a_src[q],
                 kt * kSK + kAElems * cha, a.K);
  };

#pragma unroll
  for (int s = 0; s < kSStages - 1; ++s) {
    if (s < nk) load_stage(s, s);
    cp_async_commit();
  }
  float acc[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[nt][c] = 0.0f;
  const int g = lane >> 2, t4 = lane & 3, wn = 32 * warp;
  for (int64_t kt = 0; kt < nk; ++kt) {
    cp_async_wait<kSStages - 2>();
    __syncthreads();  // stage kt landed for all; every warp is done with stage kt - 1
    const int64_t next = kt + kSStages - 1;
    if (next < nk) load_stage(int(next % kSStages), next);
    cp_async_commit();
    const int s = int(kt % kSStages);
    const uint16_t* ws = w_stage(s);
#pragma unroll
    for (int ks = 0; ks < kSK / 16; ++ks) {
      // A fragment (m16n8k16): a0 row g, k 2 t4 .. + 1; a1 row g + 8; a2, a3 the same at k + 8.
      uint32_t af[4];
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int row = g + 8 * (f & 1), col = 16 * ks + 2 * t4 + 8 * (f >> 1);
        if (kAF32) {
          const float2 v = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(a_stage(s)) + row * kSXLd + col);
          af[f] = pack_bf16x2(v.x, v.y);
        } else {
          af[f] = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint16_t*>(a_stage(s)) + row * kSWLd + col);
        }
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bf[4];
        ldmatrix_x4(bf, ws + (wn + 16 * np + (lane & 7) + 8 * (lane >> 4)) * kSWLd + 16 * ks + 8 * ((lane >> 3) & 1));
        mma_bf16(acc[2 * np], af, bf[0], bf[1]);
        mma_bf16(acc[2 * np + 1], af, bf[2], bf[3]);
      }
    }
  }
  cp_async_wait_all();

  // acc[nt][2 h + c]: tile row g + 8 h, CTA weight row wn + 8 nt + 2 t4 + c.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = g + 8 * h;
    if (row >= rows) continue;
    if (kGateUp) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t unit = j0 + 8 * (2 * warp + i) + 2 * t4;
        if (unit >= a.N) continue;  // N % 8 == 0: unit + 1 < N too
        const float v0 = swiglu_oai_value(acc[2 * i][2 * h], acc[2 * i + 1][2 * h], a.alpha, a.limit, a.beta);
        const float v1 = swiglu_oai_value(acc[2 * i][2 * h + 1], acc[2 * i + 1][2 * h + 1], a.alpha, a.limit, a.beta);
        *reinterpret_cast<uint32_t*>(a.act + int64_t(r0 + row) * a.N + unit) = pack_bf16x2(v0, v1);
      }
    } else {
      float* dst = a.y + row_of[row] * a.N;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t col = j0 + wn + 8 * nt + 2 * t4;
        if (col < a.N) *reinterpret_cast<float2*>(dst + col) = make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
      }
    }
  }
}

// Step 4. One CTA a token.
__global__ void moe_combine_kernel(const int32_t* ids, const float* weights, int topk, int E, const float* y,
                                   int64_t H, void* out, int ot) {
  const int64_t t = blockIdx.x;
  int order[kMaxTopk];
  const int n = expert_order(ids, t, topk, E, order);
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


bool run_moe_experts(const ops::MoeExpertsParams& p, void* stream_v) {
  if (p.num_tokens <= 0 || p.hidden <= 0) return true;
  if (!p.x || !p.out || !p.ids || !p.weights || !p.w_gate_up || !p.w_down)
    throw Error("moe_experts: null operand");
  if (p.inter <= 0 || p.topk <= 0 || p.num_experts <= 0) throw Error("moe_experts: bad sizes");
  if (p.w_dtype == DType::FP8_E4M3) return run_moe_experts_fp8(p, stream_v);
  if (p.act_dtype != DType::F32 && p.act_dtype != DType::BF16) return false;
  if (p.x_scale) return false;  // FP8 x: only with FP8 weights
  if (p.w_dtype != DType::BF16 && p.w_dtype != DType::F32) return false;
  if (p.topk > kMaxTopk || p.num_experts > kMaxSortExperts) return false;
  const int64_t H = p.hidden, I = p.inter, T = p.num_tokens, E = p.num_experts, topk = p.topk;
  if (H > INT_MAX / 2 || I > INT_MAX / 2) return false;
  cudaStream_t st = static_cast<cudaStream_t>(stream_v);

  // Tensor cores for BF16 weights whose rows are whole 16-byte chunks (and x 16-byte aligned for
  // the tiles' cp.async copies); the fp32 SIMT tiles otherwise (F32 weights, odd sizes).
  const bool tc = p.w_dtype == DType::BF16 && H % 8 == 0 && I % 8 == 0 && H <= (1 << 20) && I <= (1 << 20) &&
                  reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && !tuning().moe.force_simt;

  // Tokens per chunk: its pairs' rows (act in bf16 with tensor cores, else fp32; y in fp32) fit
  // the scratch (at least one token).
  // Tensor cores with fp32 x: 64-row tiles read the chunk's x rounded to bf16 (a copy in the
  // scratch, H bf16 a token), 16-row tiles read x itself.
  const bool x_copy = tc && p.act_dtype == DType::F32;
  const size_t row_bytes = size_t(I) * (tc ? 2 : 4) + size_t(H) * 4 + sizeof(int32_t);
  const size_t fixed = 2 * align256(size_t(E + 1) * sizeof(int32_t)) + 5 * 256;
  int64_t chunk = int64_t((kScratchBytes - fixed) / (row_bytes * size_t(topk) + (x_copy ? size_t(H) * 2 : 0)));
  if (const int64_t forced = tuning().moe.chunk_tokens; forced > 0) chunk = forced;
  // At most 2^22 pairs a chunk: the tensor-core grid (tiles x weight-row blocks) stays below 2^31.
  chunk = std::max<int64_t>(1, std::min<int64_t>({chunk, T, (int64_t(1) << 22) / topk}));
  const int64_t max_pairs = chunk * topk;
  const size_t off_b = align256(size_t(E + 1) * sizeof(int32_t));
  const size_t sorted_b = align256(size_t(max_pairs) * sizeof(int32_t));
  const size_t act_b = align256(size_t(max_pairs) * size_t(I) * (tc ? 2 : 4));
  const size_t y_b = align256(size_t(max_pairs) * size_t(H) * sizeof(float));
  const size_t xb_b = x_copy ? align256(size_t(chunk) * size_t(H) * 2) : 0;
  auto* base = static_cast<uint8_t*>(private_scratch(st, kScratchMoe, 2 * off_b + sorted_b + act_b + y_b + xb_b));
  auto* offsets = reinterpret_cast<int32_t*>(base);
  auto* tile_start = reinterpret_cast<int32_t*>(base + off_b);
  auto* sorted = reinterpret_cast<int32_t*>(base + 2 * off_b);
  void* act = base + 2 * off_b + sorted_b;
  auto* y = reinterpret_cast<float*>(base + 2 * off_b + sorted_b + act_b);
  auto* x_bf16 = reinterpret_cast<uint16_t*>(base + 2 * off_b + sorted_b + act_b + y_b);
  const size_t esz = dtype_size(p.act_dtype);
  const DType out_t = ops::moe_out_dtype(p);

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tc_tokens = std::min(chunk, T - t0);
    const int pairs = int(tc_tokens * topk);
    const int32_t* ids = p.ids + t0 * topk;
    const void* x = static_cast<const uint8_t*>(p.x) + size_t(t0 * H) * esz;
    // 16-row tiles for small batches, else 64.
    const int tuned_rows = tuning().moe.tile_rows;
    const int forced_rows = tuned_rows == 16 || tuned_rows == 64 ? tuned_rows : 0;
    const bool small = tc && (forced_rows ? forced_rows == kSM : pairs <= kSmallTilePairsPerExpert * E);
    const int tile_rows = small ? kSM : kBM;
    moe_sort_kernel<<<1, kSortThreads, size_t(2 * E) * sizeof(int32_t), st>>>(ids, pairs, int(E), tile_rows, offsets,
                                                                              tile_start, sorted);
    SIEVE_LAUNCH_CHECK("moe_experts (sort)");

    if (tc) {
      // Both products on tensor cores, in tiles of tile_rows rows (the sort's tile count).
      static_assert(kTM == kBM, "the sort lays out tiles of kBM rows");
      const unsigned tiles = unsigned((pairs + tile_rows - 1) / tile_rows + E);
      MmaArgs m{};
      m.x = x;
      m.x_bf16 = p.act_dtype == DType::BF16;
      m.topk = int(topk);
      m.w = p.w_gate_up;
      m.N = I;
      m.K = H;
      m.E = int(E);
      m.sorted = sorted;
      m.offsets = offsets;
      m.tile_start = tile_start;
      m.act = static_cast<uint16_t*>(act);
      m.y = y;
      m.alpha = p.alpha;
      m.limit = p.limit;
      m.beta = p.beta;
      // Both shapes take 128 weight rows a CTA: the same weight-row blocks.
      static_assert(kSN == kTN, "both tiles take 128 weight rows");
      auto launch = [&](auto kernel, unsigned threads, size_t smem, const char* what) {
        set_smem(kernel, smem);
        kernel<<<tiles * unsigned(m.nblocks), threads, smem, st>>>(m);
        SIEVE_LAUNCH_CHECK(what);
      };
      m.nblocks = int((I + kTN / 2 - 1) / (kTN / 2));
      if (small) {
        if (m.x_bf16)
          launch(moe_mma_small_kernel<true, false>, kSThreads, kSmallSmem, "moe_experts (gate_up, small tiles)");
        else
          launch(moe_mma_small_kernel<true, true>, kSThreads, kSmallSmem, "moe_experts (gate_up, small tiles)");
      } else {
        if (x_copy) {
          rows_to_bf16(static_cast<const float*>(x), H, tc_tokens, H, x_bf16, st);
          m.x = x_bf16;
        }
        launch(moe_mma_kernel<true>, kTThreads, kTSmem, "moe_experts (gate_up)");
      }
      m.act_in = static_cast<const uint16_t*>(act);
      m.w = p.w_down;
      m.N = H;
      m.K = I;
      m.nblocks = int((H + kTN - 1) / kTN);
      if (small)
        launch(moe_mma_small_kernel<false, false>, kSThreads, kSmallSmem, "moe_experts (down, small tiles)");
      else
        launch(moe_mma_kernel<false>, kTThreads, kTSmem, "moe_experts (down)");
    } else {
      const unsigned tiles = unsigned((pairs + kBM - 1) / kBM + E);
      GemmArgs g{};
      g.x = x;
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
      g.out = static_cast<float*>(act);
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
    }

    moe_combine_kernel<<<unsigned(tc_tokens), 256, 0, st>>>(
        ids, p.weights + t0 * topk, int(topk), int(E), y, H,
        static_cast<uint8_t*>(p.out) + size_t(t0 * H) * dtype_size(out_t), elem_code(out_t));
    SIEVE_LAUNCH_CHECK("moe_experts (combine)");
  }
  return true;
}

}  // namespace sieve::cuda
