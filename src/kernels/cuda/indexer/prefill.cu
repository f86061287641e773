// Lightning indexer, prefill kernel: tensor-core block scores on a stream-K grid, then the
// per-row top-k by a selection kernel that overlaps the scoring grid's tail. Same contract and
// outputs as the CPU reference. The planner (planner.cu) runs it for rows of at most 2048 key
// blocks and sizes its grid and workspace; the long-context kernel (prefill_long.cu) runs beyond.
//
// Scoring. A query tile = 128 rows of one request and one index head. The stream-K grid gives
// 2 CTAs per SM per index head, each an equal share of the head's causal work counted in units
// (per tile: a.setup_units for its query tile and pipeline fill, then one per key block it sees),
// possibly several tiles in a row (sk_find, segments). The segment's block ids are cached in
// shared memory (s_bt) so the loop's copies never wait on a global load.
// CTA = 256 threads = 2 warpgroups; warpgroup w owns query rows [64w, 64w + 64) of the tile.
// Shared memory (dynamic, 1024-byte aligned by hand):
//   q tile   32 KB: bf16 [2 dim-chunks][128 rows][128 B], 128-byte swizzled (16-byte unit u of a
//            row r sits at unit u ^ (r & 7)), written once per segment (q rounded to bf16; to fp8
//            first when q_in_cache_dtype with an fp8 cache: fp8(bf16(q)) as the CPU reference);
//            bf16 q with 16-byte aligned rows goes in by cp.async, overlapping the first keys;
//   keys     2 stages x 32 KB, one 128-key block each, same swizzled bf16 layout.
// Keys: bf16 cache -> cp.async 16-byte copies straight into the swizzled stage; fp8 cache ->
// 16-byte global loads into registers (issued before the current block's math), converted
// exactly to bf16 and stored swizzled after it. Double-buffered: block i+1 is in flight while
// block i is multiplied; one CTA barrier per block (after the copy of block i has landed and
// every warp is done with block i-1).
// Math: per block and warpgroup, 8 x wgmma.m64n128k16 (bf16 x bf16 -> fp32, B = the 128 keys
// from shared memory through 128B-swizzle K-major descriptors: SBO 1024 B, start + 32 B per k16
// step, + 16 KB per 64-dim chunk). kMode: kSS (A, the warpgroup's 64 query rows, from shared
// memory too), kRS (A as register fragments loaded once by ldmatrix: less shared-memory
// traffic), kRSP (bf16 cache: kRS with each key block as two halves of 64 keys, one commit
// group each, software-pipelined so that the tensor pipe has the next half queued while a
// warpgroup takes the maxima of the previous one). The accumulator layout is the same in all.
// A warpgroup whose rows all precede the block skips it. 128 registers, 2 CTAs (4 warpgroups)
// per SM, so one CTA's epilogue overlaps the other's MMAs.
// Epilogue per block: each thread owns 2 rows x 32 keys of the 64 x 128 accumulator; masked
// (key <= row position, by selection so NaN keys past the query never enter) only when the
// block reaches past the warp's first row; fmaxf over the keys, 2 quad shuffles, x score_scale
// (positive: commutes with the max), forced sentinels (init 1e30 / local 1e29, local wins),
// NaN -> -1e30; lane q == 0 stores the block score straight into the row's global score row,
// [num_tokens, H, sstride] fp32 -- block_scores itself when requested (stride
// max_blocks_per_seq), else the workspace (stride max_blocks: 2 MB at 8192 tokens, 32 MB at
// 32768). (A NaN dot of a visible key is dropped by fmaxf; the CPU maps it to -1e30 first, which
// differs only when every visible key of a block is NaN.)
// Selection (prefill_select_kernel): one warp per (token, head) row stages the row's scores as
// order keys in shared memory, finds a lower bound of the k-th largest key from the 32 lane
// maxima, compacts the candidates above it by ballots and ranks them by counting (select_row,
// indexer/common.cuh; no per-slot rounds). With a.tile_done it selects a tile's rows as soon as
// the scoring CTAs have counted all of the tile's key blocks, while the scoring grid still runs.
// Precision: q bf16 (see above), keys exact in bf16, fp32 accumulation in tensor-core order;
// ties are exact because every comparison uses the (score, block id) rule.
// IndexerTuning: prefill_mma forces the MMA form, prefill_overlap = false makes the selection
// wait for the whole scoring grid, trace prints per-phase CTA times of eager calls.
#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/kernels.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/wgmma.cuh"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kRows = 128;  // query rows per CTA (2 warpgroups x 64)
constexpr int kThreads = 256;
constexpr int kChunkBytes = kSwzHalfBytes;   // one 64-dim chunk of 128 rows (swz): 16 KB
constexpr int kTileBytes = 2 * kChunkBytes;  // 128 rows x 128 dims bf16: 32 KB
constexpr int kQOff = 0;
constexpr int kKOff = kTileBytes;
// Dynamic shared memory as measured (docs/performance.md): the q tile, 2 key stages, 12.5 KB
// that the split-list path's score table used (kept so that the L1 / shared-memory carveout,
// and so the measured speed, stay the same), and the alignment slack.
constexpr int kSmemBytes = kKOff + 2 * kTileBytes + kRows * 25 * 4 + 1024;
static_assert(kSmemBytes <= 227 * 1024 / 2, "two CTAs per SM");

constexpr int kTracePoints = 9;  // 8 timestamps + (smid << 32 | key blocks)

// kMode of prefill_kernel (the values of IndexerTuning::PrefillMma).
enum Mode { kSS = 0, kRS = 1, kRSP = 4 };

// ---------------------------------------------------------------------------------------------
// Query tile and epilogue helpers

__device__ __forceinline__ float load_q_rounded(const IndexerArgs& a, int64_t tok, int h, int d) {
  float v = load_act(a.q, tok * a.q_stride + int64_t(h) * kDim + d, a.q_bf16);
  if (a.q_fp8_round) v = fp8_to_f32(f32_to_fp8_bits(round_bf16(v)));
  return v;
}

// Running maxima of an MMA accumulator's two rows over its N n-tiles of 8 keys: x[4n + {0,1}] is
// row A at keys 8n + 2q + {0,1}, x[4n + {2,3}] row B. With `all` every key counts; otherwise the
// keys past limA / limB (counted from x's first key) are masked.
template <int N>
__device__ __forceinline__ void rows_max(const float* x, bool all, int q, int limA, int limB, float& mA, float& mB) {
  if (all) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      mA = fmaxf(mA, fmaxf(x[4 * n], x[4 * n + 1]));
      mB = fmaxf(mB, fmaxf(x[4 * n + 2], x[4 * n + 3]));
    }
  } else {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = 8 * n + 2 * q + j;
        mA = fmaxf(mA, key <= limA ? x[4 * n + j] : kNegInf);
        mB = fmaxf(mB, key <= limB ? x[4 * n + 2 + j] : kNegInf);
      }
    }
  }
}

// Block score of a row at position pos for block b (max of its visible dots m).
__device__ __forceinline__ float row_score(const IndexerArgs& a, float m, int b, int pos) {
  const int nblk = pos / kBlock + 1;
  if (b >= nblk) return kNegInf;
  return forced_score(m * a.scale, b, nblk, a.init_blocks, a.local_blocks);
}

// ---------------------------------------------------------------------------------------------
// Stream-K work of one index head: the batch's tiles in order (requests in order, a request's
// tiles in order), tile t of a request = `setup` units (its query tile and pipeline fill;
// a.setup_units, IndexerTuning::prefill_setup_units: 1 by default) then one unit per key block
// it sees; CTA c of G takes the blocks whose units lie in [T c / G, T (c + 1) / G),
// T = all units. Every block belongs to exactly one CTA, and the blocks are
// independent (each writes its own score-row entries), so any cut is exact. A request with
// prefix P = seq_len - qlen >= 0 and nt tiles: tile t < nt - 1 sees t + c + 1 blocks,
// c = (P + 127) / 128; the last sees (P + qlen - 1) / 128 + 1; so its units before tile t are
// F(t) = t (t - 1) / 2 + t (c + 1 + setup), closed form.
struct SkRequest {
  int nt = 0, c = 0, n_last = 0;  // tiles, full-tile block offset, last tile's blocks
  int setup = 1;
  __device__ __forceinline__ long long before(int t) const {
    return (long long)t * (t - 1) / 2 + (long long)t * (c + 1 + setup);
  }
  __device__ __forceinline__ long long total() const { return nt ? before(nt - 1) + n_last + setup : 0; }
  __device__ __forceinline__ int blocks(int t) const { return t < nt - 1 ? t + c + 1 : n_last; }
};

// A request of L new tokens after a prefix of P (nt = 0: none of its rows is scored).
__device__ __forceinline__ SkRequest sk_shape(int L, int P, int setup) {
  SkRequest r;
  r.setup = setup;
  if (L <= 0 || P < 0) return r;  // empty, or a contract violation (no rows are scored)
  r.nt = (L + kRows - 1) / kRows;
  r.c = (P + kBlock - 1) / kBlock;
  r.n_last = (P + L - 1) / kBlock + 1;
  return r;
}
__device__ __forceinline__ SkRequest sk_request(const IndexerArgs& a, int s) {
  const int L = a.qsl[s + 1] - a.qsl[s];
  return sk_shape(L, a.seq_lens[s] - L, a.setup_units);
}

// Inclusive prefix sum over the warp's lanes.
__device__ __forceinline__ long long warp_inclusive_sum(long long x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const long long y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Warp 0: the start of CTA c's units in sk (request, tile, the tile's first unit) and its range.
// Requests 32 at a time (lane = request, one warp scan of their totals), then a binary search of
// the tile in the request holding the first unit. sk[0..2] = U, u0, u1; ski[0..1] = s, t; s =
// num_seqs when the CTA has no units.
__device__ void sk_find(const IndexerArgs& a, int c, int G, long long* sk, int* ski) {
  const int lane = threadIdx.x & 31;
  // The first 32 requests once: with up to 32 (the usual case) one pass gives the total and
  // the search below reuses it.
  const SkRequest r0 = lane < a.num_seqs ? sk_request(a, lane) : SkRequest{};
  const long long incl0 = warp_inclusive_sum(r0.total(), lane);
  long long T = __shfl_sync(0xffffffffu, incl0, 31);
  for (int s0 = 32; s0 < a.num_seqs; s0 += 32) {
    const long long tot = s0 + lane < a.num_seqs ? sk_request(a, s0 + lane).total() : 0;
    T += __shfl_sync(0xffffffffu, warp_inclusive_sum(tot, lane), 31);
  }
  const long long u0 = T * c / G, u1 = T * (c + 1) / G;
  int rs = a.num_seqs, rt = 0;
  long long U = 0, base = 0;
  if (u0 < u1) {
    for (int s0 = 0; s0 < a.num_seqs; s0 += 32) {
      const int s = s0 + lane;
      const SkRequest r = s0 == 0 ? r0 : s < a.num_seqs ? sk_request(a, s) : SkRequest{};
      const long long tot = r.total();
      const long long incl = s0 == 0 ? incl0 : warp_inclusive_sum(tot, lane);
      const long long excl = incl - tot;
      const unsigned hit = __ballot_sync(0xffffffffu, tot > 0 && base + excl <= u0 && u0 < base + incl);
      if (hit) {
        const int l = __ffs(hit) - 1;
        if (lane == l) {
          const long long v = u0 - base - excl;
          int lo = 0, hi = r.nt - 1;  // the last tile t with before(t) <= v
          while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (r.before(mid) <= v) lo = mid;
            else hi = mid - 1;
          }
          rs = s, rt = lo, U = base + excl + r.before(lo);
        }
        rs = __shfl_sync(0xffffffffu, rs, l);
        rt = __shfl_sync(0xffffffffu, rt, l);
        U = __shfl_sync(0xffffffffu, U, l);
        break;
      }
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  if (lane == 0) sk[0] = U, sk[1] = u0, sk[2] = u1, ski[0] = rs, ski[1] = rt;
}


// ---------------------------------------------------------------------------------------------
// Scoring kernel

template <bool kFp8, int kMode>
__global__ void __launch_bounds__(kThreads, 2) prefill_kernel(IndexerArgs a) {
  constexpr bool kRegA = kMode == kRS || kMode == kRSP;
  static_assert(!(kFp8 && kMode == kRSP), "kRSP: bf16 cache only");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem + kQOff;
  uint8_t* ks = smem + kKOff;

  const int h = blockIdx.z;
  // Trace slot of this CTA, recomputed at each point (a.trace lives in parameter space: no
  // register is held across the key loop).
#define SIEVE_TRACE_AT(i) \
  a.trace[((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * kTracePoints + (i)]
#define SIEVE_TRACE(i) \
  if (a.trace && threadIdx.x == 0) SIEVE_TRACE_AT(i) = global_ns()
  SIEVE_TRACE(0);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int wg = warp / 4;
  // Physical blocks of the segment's first kBtCache key blocks (the loop's copies then wait on no
  // global load), and the stream-K cursor: request, tile, the tile's first unit, the next unit,
  // the end of this CTA's units.
  constexpr int kBtCache = 64;
  __shared__ int s_bt[kBtCache];
  __shared__ long long s_sk[3];
  __shared__ int s_ski[2];
  // The selection kernel may launch now (with tile_done it selects each tile once scored; else it
  // waits for this grid to complete).
  pdl_trigger();
  if (warp == 0) sk_find(a, blockIdx.x, gridDim.x, s_sk, s_ski);
  __syncthreads();
  long long sk_U = s_sk[0], sk_u0 = s_sk[1], sk_u1 = s_sk[2];
  int sk_s = s_ski[0], sk_t = s_ski[1];
  int total_nb = 0;
  for (int seg = 0;; ++seg) {
  int s = 0, tile = 0, b_begin = 0, b_end = 0;
  {
    // The next tile holding blocks of this CTA's units (contract-violating tiles are skipped).
    bool got = false;
    while (!got && sk_s < a.num_seqs && sk_U + a.setup_units < sk_u1) {
      const SkRequest r = sk_request(a, sk_s);
      if (sk_t >= r.nt) {
        ++sk_s, sk_t = 0;
        continue;
      }
      const int n = r.blocks(sk_t);
      s = sk_s, tile = sk_t;
      b_begin = int(max(0ll, sk_u0 - sk_U - a.setup_units));
      b_end = int(min((long long)n, sk_u1 - sk_U - a.setup_units));
      got = b_end > b_begin && n <= a.max_blocks;
      sk_U += a.setup_units + n, sk_u0 = sk_U, ++sk_t;
    }
    if (!got) break;
  }
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int r0 = tile * kRows;
  const int rows = min(kRows, qlen - r0);
  const int pos_first = seq_len - qlen + r0;
  const int pos_last = pos_first + rows - 1;
  const int n_blocks = pos_last / kBlock + 1;
  const int nb = b_end - b_begin;
  total_nb += nb;
  const int32_t* btab = a.block_tables + int64_t(s) * a.mbps;
  // Block 0's entry straight from global memory (fetch(0) below); the others through s_bt,
  // visible after the first barrier (the previous segment's reads of s_bt ended before its
  // post-loop barrier).
  if (tid > 0 && tid < min(nb, kBtCache)) s_bt[tid] = btab[b_begin + tid];

  // Keys of block b_begin + i into stage i & 1.
  constexpr int kRowBytes = kFp8 ? kDim : kDim * 2;
  constexpr int kLoads = kFp8 ? 4 : 8;  // 16-byte units per thread per block
  uint4 kreg[kFp8 ? 4 : 1];
  // The stage of block i: the two key buffers in turn.
  auto stage_of = [&](int i) -> uint8_t* { return ks + (i & 1) * kTileBytes; };
  // Unit l of this thread: 16 bytes at tid * 16 + l * 4096 of the block, i.e. (bf16) key
  // tid / 16 + 16 l, dims (tid % 16) * 8 ..: swz of key tid / 16 + 16 l is swz of key tid / 16
  // plus 16 l rows (l * 2048 B; the swizzle depends on the key mod 8 only).
  auto fetch = [&](int i) {
    const int k_dst = swz(tid >> 4, (tid & 15) * 8);
    const int pb = i == 0 || i >= kBtCache ? btab[b_begin + i] : s_bt[i];
    const uint8_t* src = a.cache + int64_t(pb) * (kBlock * kRowBytes) + tid * 16;
    uint8_t* stage = stage_of(i);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      if constexpr (kFp8) {
        kreg[l] = ldg_stream(src + l * (kThreads * 16));
      } else {
        cp_async16(stage + k_dst + l * 2048, src + l * (kThreads * 16));
      }
    }
    if constexpr (!kFp8) cp_async_commit();
  };
  // fp8: the registers of block i, converted exactly to bf16, into stage i & 1.
  // fp8: unit l is key tid / 8 + 32 l, dims (tid % 8) * 16 ..: + l * 4096 B from key tid / 8.
  auto store_fp8 = [&](int i) {
    if constexpr (kFp8) {
      const int f_dst0 = swz(tid >> 3, (tid & 7) * 16), f_dst1 = swz(tid >> 3, (tid & 7) * 16 + 8);
      uint8_t* stage = ks + (i & 1) * kTileBytes;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const uint32_t w[4] = {kreg[l].x, kreg[l].y, kreg[l].z, kreg[l].w};
        uint32_t o[8];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          o[2 * t] = fp8x2_to_bf16x2(uint16_t(w[t] & 0xffffu));
          o[2 * t + 1] = fp8x2_to_bf16x2(uint16_t(w[t] >> 16));
        }
        *reinterpret_cast<uint4*>(stage + f_dst0 + l * 4096) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(stage + f_dst1 + l * 4096) = make_uint4(o[4], o[5], o[6], o[7]);
      }
    }
  };

  fetch(0);
  // Query tile: bf16, swizzled, one 16-byte unit (8 dims) per item; rows past the tile are zero.
  if (a.q_async) {
    const uint16_t* qb = static_cast<const uint16_t*>(a.q);
#pragma unroll
    for (int e = tid; e < kRows * (kDim / 8); e += kThreads) {
      const int r = e / (kDim / 8), d = (e % (kDim / 8)) * 8;
      if (r < rows) {
        cp_async16(qs + swz(r, d), qb + (tok0 + r0 + r) * a.q_stride + int64_t(h) * kDim + d);
      } else {
        *reinterpret_cast<uint4*>(qs + swz(r, d)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cp_async_commit();
  } else {
#pragma unroll 4
    for (int e = tid; e < kRows * (kDim / 8); e += kThreads) {
      const int r = e / (kDim / 8), d = (e % (kDim / 8)) * 8;
      float x[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = r < rows ? load_q_rounded(a, tok0 + r0 + r, h, d + j) : 0.f;
      *reinterpret_cast<uint4*>(qs + swz(r, d)) = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                                                             pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    }
  }
  if constexpr (kFp8) store_fp8(0);
  if (seg == 0) SIEVE_TRACE(1);
  // kRS: the warp's 16 query rows as mma A fragments for all 8 k-steps (ldmatrix, swizzled).
  uint32_t qf[kRegA ? 8 : 1][4];
  if constexpr (kRegA) {
    cp_async_wait_all();
    __syncthreads();
    const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int st = 0; st < 8; ++st)
      ldmatrix_x4(qf[st], qs + swz(warp * 16 + rr + (mi & 1) * 8, st * 16 + (mi >> 1) * 8));
  }

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;

  const int wrow = warp * 16;  // this warp's first row (warpgroup wg: rows 64wg .. 64wg+63)
  const int rA = wrow + g, rB = rA + 8;
  const int posA = pos_first + rA, posB = pos_first + rB;
  // This thread's score row of row rA (row rB = rA + 8 lies 8 * H * sstride further).
  float* const srowA = a.sbuf + (int64_t(tok0 + r0 + rA) * a.H + h) * a.sstride;
  // Last valid row of this warpgroup; -1 when none.
  const int unit_lo = wg * 64, unit_n = 64;
  const int unit_last = min(rows - 1, unit_lo + unit_n - 1);
  // Block i's scores of rows rA, rB from their maxima mA, mB (quad-reduced; lanes q == 0 store)
  // straight to the score rows (rows past the tile have none).
  auto store_scores = [&](int i, float mA, float mB) {
    const int b = b_begin + i;
    if (q == 0) {
      if (rA < rows) srowA[b] = row_score(a, mA, b, posA);
      if (rB < rows) srowA[int64_t(8 * a.H) * a.sstride + b] = row_score(a, mB, b, posB);
    }
  };

  if constexpr (kMode == kRSP) {
    // Two halves of 64 keys per block, each its own commit group: at block i the warpgroup
    // queues half 0 of block i, takes the maxima of block i - 1's half 1 (and stores the block's
    // scores) while it runs, queues half 1 of block i, then takes half 0's maxima while that one
    // runs. The tensor pipe idles only across the block barrier. Half 1 of block i - 1 is waited
    // for before the barrier that lets fetch(i + 1) refill its stage.
    float hA[32], hB[32];  // keys 0..63 / 64..127 of a block
#pragma unroll
    for (int e = 0; e < 32; ++e) hA[e] = hB[e] = 0.f;
    // Maxima of rows rA, rB over the keys koff .. koff + 63 of block b held in hh.
    auto half_max = [&](const float (&hh)[32], int b, int koff, float& mA, float& mB) {
      rows_max<8>(hh, b * kBlock + kBlock - 1 <= pos_first + wrow, q, posA - b * kBlock - koff,
                  posB - b * kBlock - koff, mA, mB);
    };
    // Block i's scores from the maxima of the thread's keys (all lanes: the quad reduction).
    auto store_block = [&](int i, float mA, float mB) {
      quad_max2(mA, mB);
      store_scores(i, mA, mB);
    };
    // Every block's two halves are issued, also a block past this warpgroup's rows (only where a
    // tile straddles a block boundary; its maxima are masked to -inf): MMAs under a
    // warpgroup-dependent branch, or a wait under one, make ptxas serialise every wgmma (C7514).
    float pmA = kNegInf, pmB = kNegInf;  // block i - 1's maxima over its half 0
    // Block i - 1 exists (its half 1 is in hB). Equal to i > 0 in the loop and nb > 0 after it,
    // but written as a flag: with those conditions ptxas spilled 60-68 bytes in this loop instead
    // of 8 (`ptxas -v`, select instantiation).
    bool pending = false;
    for (int i = 0; i < nb; ++i) {
      const int b = b_begin + i;
      cp_async_wait_all();  // block i (and at i = 0 the cp.async query tile)
      fence_proxy_async();
      wgmma_wait_all();  // block i - 1's half 1: its stage is refilled after the barrier
      fence_acc(hB);
      __syncthreads();  // block i in its stage for all; every warpgroup is done with block i - 1
      if (i == 0 && seg == 0) SIEVE_TRACE(2);
      if (i + 1 < nb) fetch(i + 1);
      const uint64_t db = make_desc(smem_u32(stage_of(i)));
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 8; ++st)
        wgmma_m64n64k16_rs(hA, qf[st], desc_add(db, (st >> 2) * kChunkBytes + (st & 3) * 32), st > 0);
      wgmma_commit();
      if (pending) {  // block i - 1, while half 0 of block i runs
        float mA = pmA, mB = pmB;
        half_max(hB, b - 1, 64, mA, mB);
        store_block(i - 1, mA, mB);
      }
      pmA = kNegInf, pmB = kNegInf;
      wgmma_wait_1();  // returns at once (half 0 stays in flight); ends the stretch that read hB
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 8; ++st)
        wgmma_m64n64k16_rs(hB, qf[st], desc_add(db, (st >> 2) * kChunkBytes + (st & 3) * 32 + 64 * 128), st > 0);
      wgmma_commit();
      wgmma_wait_1();  // half 0 done; half 1 runs on
      fence_acc(hA);
      half_max(hA, b, 0, pmA, pmB);
      pending = true;
    }
    wgmma_wait_all();
    fence_acc(hB);
    if (pending) {  // the last block's half 1
      float mA = pmA, mB = pmB;
      half_max(hB, b_end - 1, 64, mA, mB);
      store_block(nb - 1, mA, mB);
    }
  } else {
    for (int i = 0; i < nb; ++i) {
      const int b = b_begin + i;
      cp_async_wait_all();  // bf16: block i (and at i = 0 the cp.async query tile)
      fence_proxy_async();
      __syncthreads();  // block i in its stage for all; every warp is done with block i - 1
      if (i == 0 && seg == 0) SIEVE_TRACE(2);
      if (i + 1 < nb) fetch(i + 1);
      const uint8_t* stage = stage_of(i);
      const bool active = unit_last >= unit_lo && b * kBlock <= pos_first + unit_last;
      float mA = kNegInf, mB = kNegInf;
      if (active) {
        const uint64_t da = make_desc(smem_u32(qs) + wg * 64 * 128), db = make_desc(smem_u32(stage));
        fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          const uint32_t off = (st >> 2) * kChunkBytes + (st & 3) * 32;
          if constexpr (kRegA) {
            wgmma_m64n128k16_rs(acc, qf[st], desc_add(db, off), st > 0);
          } else {
            wgmma_m64n128k16(acc, desc_add(da, off), desc_add(db, off), st > 0);
          }
        }
        wgmma_commit();
        wgmma_wait_all();
        fence_acc(acc);
        // acc[4n + {0,1}]: row rA, keys 8n + 2q + {0,1}; acc[4n + {2,3}]: row rB.
        rows_max<16>(acc, b * kBlock + kBlock - 1 <= pos_first + wrow, q, posA - b * kBlock, posB - b * kBlock, mA,
                     mB);
        quad_max2(mA, mB);
      }
      store_scores(i, mA, mB);
      if constexpr (kFp8) {
        if (i + 1 < nb) store_fp8(i + 1);
      }
    }
  }
  __syncthreads();  // every warp is done with the segment's stages
  SIEVE_TRACE(3);  // (the last segment's loop end)
  if (a.trace && threadIdx.x == 0) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    SIEVE_TRACE_AT(8) = (uint64_t(smid) << 32) | uint32_t(total_nb);
  }

  // The CTA holding the tile's last block writes -inf past it in block_scores (which is sbuf).
  if (a.block_scores && b_end == n_blocks) {
    const int w = a.mbps - b_end;
    for (int e = tid; e < rows * w; e += kThreads) {
      const int r = e / w, i = e % w;
      a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b_end + i] = kNegInf;
    }
  }
  SIEVE_TRACE(4);
  if (a.tile_done) {
    // This segment's scores are stored (and fenced): count its blocks for the tile.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      atomicAdd(a.tile_done + (int64_t(tok0 + r0) * a.H + h), nb);
    }
  }
  }  // segments: until the CTA's units end
  SIEVE_TRACE(7);
#undef SIEVE_TRACE
#undef SIEVE_TRACE_AT
}


// ---------------------------------------------------------------------------------------------
// The selection kernel: each row's top-k from its score row, one warp per (token, head) row over
// the whole GPU (a tile's last CTA selecting its 128 rows at the end of the scoring kernel was
// the tail of the first select path, docs/performance.md).
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One (token, head) row of prefill_select_kernel (one warp). With a.tile_done: first waits until
// the scoring kernel has counted every key block of the row's tile (mirroring which tiles the
// stream-K grid scores: requests with a prefix >= 0, tiles of at most n_max blocks), and after
// the selection counts the row for its tile.
__device__ __forceinline__ void select_kernel_row(const IndexerArgs& a, int64_t row, int n_max, unsigned long long* cand,
                                                  uint32_t* mk, uint32_t* keys, int lane) {
  const int64_t tok = row / a.H;
  const int h = int(row % a.H);
  // The request holding tok: the last s with query_start_loc[s] <= tok (empty requests skipped).
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (a.qsl[mid] <= tok) lo = mid;
    else hi = mid - 1;
  }
  const int tok0 = a.qsl[lo], tok1 = a.qsl[lo + 1];
  if (tok < tok0 || tok >= tok1) return;  // a padding token past the last request
  const int L = tok1 - tok0, P = a.seq_lens[lo] - L;
  const int pos = P + int(tok - tok0);
  const int n = pos / kBlock + 1;
  int32_t* done = nullptr;
  int tile_rows = 0;
  // The stream-K grid's own description of the request: it scores tile t (r.blocks(t) key
  // blocks) when the request has tiles and the tile fits n_max (see the segment loop).
  const SkRequest r = sk_shape(L, P, a.setup_units);
  if (a.tile_done && r.nt > 0) {
    const int t = int(tok - tok0) / kRows;
    tile_rows = min(kRows, L - t * kRows);
    const int need = r.blocks(t);
    if (need <= n_max) {
      done = a.tile_done + ((int64_t(tok0) + int64_t(t) * kRows) * a.H + h);
      if (lane == 0) {
        // Bounded: a tile the scoring kernel never counts (a contract violation the mirror
        // above missed) costs at most ~2 s, not a hang.
        const unsigned long long t_end = global_ns() + 2000000000ull;
        while (ld_acquire_gpu(done) < need && global_ns() < t_end) __nanosleep(500);
      }
      __syncwarp();
    }
  }
  if (pos >= 0 && n <= n_max) {  // else a contract violation (the scoring kernel skipped the tile)
    stage_order_keys(a.sbuf + row * a.sstride, n, keys, lane);
    __syncwarp();
    select_row(keys, n, a.topk, cand, mk, a.topk_idx + row * a.topk, lane);
  }
  if (done && lane == 0) {
    int32_t* rows_done = a.sel_done + (done - a.tile_done);
    if (atomicAdd(rows_done, 1) == tile_rows - 1) {  // every row of the tile has read its scores
      *done = 0;
      *rows_done = 0;
    }
  }
}

// Dynamic shared memory per warp: cand + lane bests + the row's keys (n_max words). Launched with
// programmatic stream serialisation: without a.tile_done it waits for the
// scoring grid to complete and its writes to be visible; with it, rows of finished tiles are
// selected while the scoring grid still runs (on the SMs its CTAs have left), and the last CTA
// to finish waits for the scoring grid, so this grid never completes before it.
__global__ void __launch_bounds__(kThreads) prefill_select_kernel(IndexerArgs a, int64_t nrows, int n_max) {
  extern __shared__ __align__(16) uint8_t sel_smem[];
  __shared__ int s_last;
  if (!a.tile_done) pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = kThreads / 32;
  const int64_t row = int64_t(blockIdx.x) * nwarps + warp;  // token * H + head
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(sel_smem) + warp * kCandCap;
  uint32_t* mk = reinterpret_cast<uint32_t*>(sel_smem + nwarps * kCandCap * 8) + warp * 32;
  uint32_t* keys = reinterpret_cast<uint32_t*>(sel_smem + nwarps * (kCandCap * 8 + 128)) + int64_t(warp) * n_max;
  if (row < nrows) select_kernel_row(a, row, n_max, cand, mk, keys, lane);
  if (a.tile_done) {
    __syncthreads();
    if (threadIdx.x == 0) {
      s_last = atomicAdd(a.sel_ctas, 1) == int(gridDim.x) - 1;
      if (s_last) *a.sel_ctas = 0;
    }
    __syncthreads();
    if (s_last) pdl_wait();
  }
}


// ---------------------------------------------------------------------------------------------
// Host

double pct(const std::vector<double>& v, int p) { return v[std::min(v.size() - 1, v.size() * size_t(p) / 100)]; }

void print_trace(const IndexerArgs& a, dim3 grid, int mode, const std::vector<unsigned long long>& tr, int64_t ctas) {
  unsigned long long t0 = ~0ull, t1 = 0;
  int64_t early = 0, started = 0;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long* p = &tr[size_t(c * kTracePoints)];
    if (!p[0]) continue;
    ++started;
    t0 = std::min(t0, p[0]);
    t1 = std::max(t1, p[7]);
    if (!p[1]) ++early;
  }
  if (!started) return;
  static const char* names[8] = {"start", "q issued", "first K ready", "loop end",
                                 "scores written", "(unused)", "(unused)", "end"};
  std::fprintf(stderr,
               "prefill trace: grid %u x %u x %u = %lld CTAs (%lld started), mma mode %d, setup units %d, "
               "CTAs without units %lld, span %.2f us\n",
               grid.x, grid.y, grid.z, (long long)ctas, (long long)started, mode, a.setup_units, (long long)early,
               double(t1 - t0) / 1000.0);
  for (int i = 0; i < 8; ++i) {
    std::vector<double> v, d;  // from the first start; from the CTA's own start
    for (int64_t c = 0; c < ctas; ++c) {
      const unsigned long long* p = &tr[size_t(c * kTracePoints)];
      if (!p[0] || !p[i] || (i == 7 && !p[1])) continue;  // end: working CTAs only
      v.push_back(double(p[i] - t0) / 1000.0);
      d.push_back(double(p[i] - p[0]) / 1000.0);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::sort(d.begin(), d.end());
    std::fprintf(stderr,
                 "  %-13s n %6zu | from first start: min %7.2f p10 %7.2f med %7.2f p90 %7.2f max %7.2f"
                 " | from own start: med %7.2f p90 %7.2f max %7.2f\n",
                 names[i], v.size(), v.front(), pct(v, 10), pct(v, 50), pct(v, 90), v.back(), pct(d, 50), pct(d, 90),
                 d.back());
  }
  // Working CTAs: key-loop time per block (first block ready .. loop end, / blocks), blocks per
  // CTA, and how the CTAs spread over the SMs.
  {
    std::vector<double> per_block, nbs;
    std::map<int, int> per_sm;
    for (int64_t c = 0; c < ctas; ++c) {
      const unsigned long long* p = &tr[size_t(c * kTracePoints)];
      if (!p[2] || !p[3] || !p[8]) continue;
      const int nb = int(p[8] & 0xffffffffu);
      nbs.push_back(nb);
      per_block.push_back(double(p[3] - p[2]) / 1000.0 / std::max(1, nb));
      ++per_sm[int(p[8] >> 32)];
    }
    if (!per_block.empty()) {
      std::sort(per_block.begin(), per_block.end());
      std::sort(nbs.begin(), nbs.end());
      int most = 0;
      for (const auto& kv : per_sm) most = std::max(most, kv.second);
      std::fprintf(stderr,
                   "  loop us/block med %.3f p90 %.3f max %.3f | blocks/CTA med %.0f max %.0f | SMs used %zu, most "
                   "CTAs on one SM %d\n",
                   pct(per_block, 50), pct(per_block, 90), per_block.back(), pct(nbs, 50), nbs.back(), per_sm.size(),
                   most);
    }
  }
  if (early) {
    std::vector<double> d;
    for (int64_t c = 0; c < ctas; ++c) {
      const unsigned long long* p = &tr[size_t(c * kTracePoints)];
      if (p[0] && !p[1]) d.push_back(double(p[0] - t0) / 1000.0);
    }
    std::sort(d.begin(), d.end());
    std::fprintf(stderr, "  CTAs without units start (from first start): min %.2f med %.2f max %.2f\n", d.front(), pct(d, 50),
                 d.back());
  }
}

template <bool kFp8, int kMode>
void launch_scoring(const IndexerArgs& a, dim3 grid, cudaStream_t stream) {
  set_smem(prefill_kernel<kFp8, kMode>, kSmemBytes);
  prefill_kernel<kFp8, kMode><<<grid, kThreads, kSmemBytes, stream>>>(a);
}

}  // namespace

void launch_prefill(const IndexerArgs& a_in, bool fp8, IndexerTuning::PrefillMma mma, int ctas_per_head,
                    int64_t nrows, cudaStream_t stream) {
  IndexerArgs a = a_in;
  const dim3 grid(unsigned(ctas_per_head), 1u, unsigned(a.H));
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  a.trace = trace_alloc(tuning().indexer.trace, size_t(ctas) * kTracePoints, stream);
  using Mma = IndexerTuning::PrefillMma;
  if (mma == Mma::kRSP && !fp8) launch_scoring<false, kRSP>(a, grid, stream);
  else if (mma == Mma::kRS || mma == Mma::kRSP) fp8 ? launch_scoring<true, kRS>(a, grid, stream) : launch_scoring<false, kRS>(a, grid, stream);
  else fp8 ? launch_scoring<true, kSS>(a, grid, stream) : launch_scoring<false, kSS>(a, grid, stream);
  SIEVE_LAUNCH_CHECK("indexer prefill");
  const int nw = kThreads / 32;
  const size_t smem = size_t(nw) * (kCandCap * 8 + 128) + size_t(nw) * a.max_blocks * 4;
  set_smem(prefill_select_kernel, smem);
  launch_pdl(true, prefill_select_kernel, dim3(unsigned((nrows + nw - 1) / nw)), dim3(kThreads), smem, stream,
             "indexer prefill select launch", a, nrows, a.max_blocks);
  SIEVE_LAUNCH_CHECK("indexer prefill select");
  if (a.trace) print_trace(a, grid, int(mma), trace_collect(a.trace, size_t(ctas) * kTracePoints, stream), ctas);
}

}  // namespace sieve::cuda
