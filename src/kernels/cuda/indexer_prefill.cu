// Tensor-core prefill indexer, variant 2 (IndexerPath::kPrefill; falls back to the first prefill
// kernel in indexer.cu where this returns false). Same contract and outputs as that kernel.
//
// Work unit = one CTA = (query tile of 128 rows of one request, key split of <= kb blocks, index
// head). Grid (tiles_upper, max_splits, H) with tiles_upper = ceil(num_tokens / 128) + num_seqs
// and max_splits = ceil(ceil(max_seq_len / 128) / kb), host values only; a CTA finds its
// (request, tile) by scanning query_start_loc and exits at once when its split lies past the
// tile's last block. kb (2..24 blocks) is chosen so the causal work is about 6 units per
// resident CTA slot (2 CTAs per SM), and so a tile has at most 64 splits (longer contexts:
// false, the first kernel runs); SIEVE_PREFILL_V2_KB overrides it for tuning.
//
// CTA = 256 threads = 2 warpgroups; warpgroup w owns query rows [64w, 64w + 64) of the tile.
// Shared memory (dynamic, 1024-byte aligned by hand):
//   q tile   32 KB: bf16 [2 dim-chunks][128 rows][128 B], 128-byte swizzled (16-byte unit u of a
//            row r sits at unit u ^ (r & 7)), written once per CTA (q rounded to bf16; to fp8
//            first when q_in_cache_dtype with an fp8 cache: fp8(bf16(q)) as the CPU reference);
//            bf16 q with 16-byte aligned rows goes in by cp.async, overlapping the first keys;
//   keys     2 stages x 32 KB, one 128-key block each, same swizzled bf16 layout;
//   table    [128 rows][25] fp32 block scores of this split (sentinels applied, -inf where the
//            row does not see the block).
// Keys: bf16 cache -> cp.async 16-byte copies straight into the swizzled stage; fp8 cache ->
// 16-byte global loads into registers (issued before the current block's math), converted
// exactly to bf16 and stored swizzled after it. Double-buffered: block i+1 is in flight while
// block i is multiplied; one CTA barrier per block (after the copy of block i has landed and
// every warp is done with block i-1).
// Math: per block and warpgroup, 8 x wgmma.m64n128k16 (bf16 x bf16 -> fp32, A = the warpgroup's
// 64 query rows and B = the 128 keys, both from shared memory through 128B-swizzle K-major
// descriptors: SBO 1024 B, start + 32 B per k16 step, + 16 KB per 64-dim chunk). A warpgroup
// whose rows all precede the block skips it. 128 registers, ~110 KB shared memory: 2 CTAs (4
// warpgroups) per SM, so one CTA's epilogue overlaps the other's MMAs. Environment
// SIEVE_PREFILL_V2_MMA (read once): ss (default, above), rs (wgmma with the query rows as
// register A fragments loaded once by ldmatrix: less shared-memory traffic), sync (mma.sync
// m16n8k16 + ldmatrix over the same layout: a cross-check of the descriptors). The accumulator
// layout is the same in all three.
// Epilogue per block: each thread owns 2 rows x 32 keys of the 64 x 128 accumulator; masked
// (key <= row position, by selection so NaN keys past the query never enter) only when the
// block reaches past the warp's first row; fmaxf over the keys, 2 quad shuffles, x score_scale
// (positive: commutes with the max), forced sentinels (init 1e30 / local 1e29, local wins),
// NaN -> -1e30; lane q == 0 writes the table entry. No per-block top-k update. (A NaN dot of
// a visible key is dropped by fmaxf, as in the first kernel; the CPU maps it to -1e30 first,
// which differs only when every visible key of a block is NaN.)
// After the loop: block_scores (optional) are written from the table with row-contiguous
// stores (the tile's last split also writes -inf up to max_blocks_per_seq). Then one warp per
// row ranks the split's <= 24 candidates (rank = number of candidates that beat it under
// "higher score, then lower block id", the contract's rule) into a sorted list: written to
// topk_idx directly when the tile has one split, else to the workspace as min(topk, kb)
// entries per (row, split), a row's lists contiguous; the tile's last split to finish (atomic
// counter per (tile, head), reset to zero by that CTA: no memset, graph safe) merges them:
// batches of rows staged in shared memory by the whole CTA, then one warp per row, lane c
// offering the heads of lists c and c + 32, topk rounds of __reduce_max_sync over an
// order-preserving integer key of the score and __reduce_min_sync over the block ids of the
// maxima (the same rule; block ids are unique across splits). Empty slots are id -1 (never
// compared by score), so -inf-scoring candidates still rank.
// Precision: q bf16 (see above), keys exact in bf16, fp32 accumulation in tensor-core order;
// ties are exact because every comparison uses the (score, block id) rule.
//
// Development knobs (environment, read once; defaults = the behaviour above):
//   SIEVE_PREFILL_V2_MMA=rs3    bf16 cache: rs with a 3-stage key ring (the query buffer becomes
//                               the third stage once the fragments are in registers), two key
//                               blocks in flight during a block's math (fp8 cache: rs).
//   SIEVE_PREFILL_V2_MERGE=rank the merging CTA ranks every staged candidate (all 256 threads):
//                               its own list position + a binary search per other sorted list
//                               (prefix of entries that beat it); no per-row topk rounds.
//   SIEVE_PREFILL_V2_ORDER=1    1-D grid, a tile's splits adjacent, the batch's last tile first
//                               (the longest tile of a prompt starts, and merges, early). Unset:
//                               0 on the list path, 1 on the select path; =0 forces the 3-D grid.
//   SIEVE_PREFILL_V2_SELECT=2   (default) the select path (below) with the selection in its own
//                               kernel after the scoring kernel (prefill_select_kernel, launched
//                               with PDL unless SIEVE_PREFILL_V2_SELECT_PDL=0); =1: the select
//                               path with the selection by each tile's last split; =0: the list
//                               path (split lists + merge, described above).
//   SIEVE_PREFILL_V2_ROWS=256   select path, bf16 cache: prefill_wide_kernel, 256 query rows per
//                               CTA (two m64 halves per warpgroup), 1 CTA per SM (see there).
//   SIEVE_PREFILL_V2_WIDE_PIPE=0  prefill_wide_kernel without its cross-block pipeline.
//   SIEVE_PREFILL_V2_KB=n       blocks per split (list path: 1..24; select path on the (tile,
//                               split) grid: 1..2048; the stream-K grid has no splits).
//   SIEVE_PREFILL_TRACE=1       eager calls only (stream not capturing): thread 0 of each CTA
//                               stores %globaltimer at start, q issued, first key block ready,
//                               loop end, lists (select: scores) written, merge (select) start /
//                               end, end; the host syncs and prints per-phase percentiles (stderr).
// The knobs are swept with `sieve bench kernels --filter prefill` run under these environment
// variables (with SIEVE_PREFILL_TRACE=1 for the phase breakdown); the tests force every path through
// the hook set_indexer_prefill_v2_knobs (internal.h), which overrides the environment.
//
// Stream-K grid (select path with the selection kernel, the default; SIEVE_PREFILL_V2_STREAMK=0
// for the (tile, split) grid above): 2 CTAs per SM per index head, each taking an equal share of
// the head's causal work counted in units (per tile: a.sk_setup, 1 by default, for its query tile
// and pipeline fill, then one per key block), possibly several tiles in a row; see sk_find. The split's
// block ids are cached in shared memory (s_bt) so the loop's copies never wait on a global load.
// SIEVE_PREFILL_DIAG=1|2|3 (development timing, wrong outputs): no key loads | no MMA | no
// score stores.
//
// Select path (the default; the kSelect instantiations, so the list path's code is unchanged). Measured on the H200 with the list path at 8192 prompt tokens: the last split's merge
// of 32 lists x 128 rows ran ~70-85 us and was the critical path, and ranking / writing the split
// lists cost ~7 us a CTA. The select path has neither: the epilogue stores each row's block score
// (sentinels applied, -inf where the row does not see the block) straight into a global score row,
// [num_tokens, H, stride] fp32 -- block_scores itself when requested (stride max_blocks_per_seq), else
// the workspace (stride max_blocks: 2 MB at 8192 tokens, 32 MB at 32768) -- so a split has no table
// and any width (no 24-block or 64-split limit); the tile's last split (the same atomic counter per
// (tile, head), reset by that CTA) selects every row's top-k from its full score row (select_tile:
// batches of rows staged as order keys in shared memory by the whole CTA, then per row a warp
// finds a lower bound of the k-th largest score key from the 32 lane maxima, compacts the
// candidates above it by ballots and ranks them by counting; no per-slot rounds). Grid order 1 by
// default there (the longest tile starts, and selects, first), and kb so that the working CTAs
// fit one wave where they can (4..32 blocks; see the host). Rows longer than 2048 blocks: the
// list path. With 128-row tiles a
// CTA moves 32 KB from L2 per 4.2 MFLOP (~4 TB/s at the measured ~2 us per block per CTA over 264
// CTAs, near what L2 gives): SIEVE_PREFILL_V2_ROWS=256 halves that (prefill_wide_kernel).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer_common.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/wgmma.cuh"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kRows = 128;  // query rows per CTA (2 warpgroups x 64)
constexpr int kThreads = 256;
constexpr int kMaxKb = 24;      // key blocks per split (table columns)
constexpr int kMaxSplits = 64;  // splits per tile (the merge holds 2 list heads per lane)
constexpr int kTblStride = kMaxKb + 1;
constexpr int kChunkBytes = kSwzHalfBytes;      // one 64-dim chunk of 128 rows (swz): 16 KB
constexpr int kTileBytes = 2 * kChunkBytes;     // 128 rows x 128 dims bf16: 32 KB
constexpr int kQOff = 0;
constexpr int kKOff = kTileBytes;
constexpr int kTblOff = kKOff + 2 * kTileBytes;
constexpr int kSmemUsed = kTblOff + kRows * kTblStride * 4;
constexpr int kSmemBytes = kSmemUsed + 1024;  // + alignment slack
// Select mode: longest row (blocks) it takes (262144 positions; longer: the list path), and the
// candidates per row of the fast selection (more: topk rounds); see select_tile.
constexpr int kSelMaxBlocks = 2048;
static_assert((kSmemUsed - kThreads / 32 * (kCandCap * 8 + 128)) / 4 >= kSelMaxBlocks, "select staging");

struct Args {
  const void* q;
  bool q_bf16;
  bool q_fp8_round;
  bool q_async;  // bf16 q, no fp8 rounding, 16-byte aligned rows: cp.async straight into the tile
  int64_t q_stride;
  int H;
  float scale;
  const uint8_t* cache;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps;
  int num_seqs;
  int topk, init_blocks, local_blocks;
  int kb, max_splits;
  int list_len;  // entries per split list: min(topk, kb)
  int32_t* topk_idx;
  float* block_scores;
  float* part_s;  // [tiles_upper, H, kRows, max_splits, list_len]
  int32_t* part_i;
  int32_t* counters;  // [tiles_upper, H]
  int merge_rank;     // 1: rank merge (binary searches, no per-row rounds); 0: topk rounds
  int order;          // 0: grid (tiles, splits, H); 1: grid (tiles * splits, 1, H), last tile first
  // Select mode (1, 2): the epilogue writes each row's block scores straight to sbuf (no table,
  // no split lists); 1: the tile's last split selects every row's top-k from its full score row;
  // 2: prefill_select_kernel does, after the scoring kernel (no counters).
  int select;
  float* sbuf;      // [num_tokens, H, sstride]: block_scores when requested, else the workspace
  int64_t sstride;  // elements per (token, head) row of sbuf
  int max_blocks;   // blocks a row of sbuf holds (a tile reaching further exits: contract violation)
  // Select mode 2 only: 1 = stream-K grid (gridDim.x CTAs per head share the head's causal work
  // evenly; see sk_find), 0 = one (tile, split) per CTA.
  int streamk;
  int sk_setup;  // stream-K units of a tile's setup (a key block is one; see SkRequest)
  // Stream-K with the selection kernel overlapped (SIEVE_PREFILL_V2_SELECT_OVERLAP, default on;
  // null otherwise): the scoring CTA adds each segment's key blocks to tile_done[(first token of
  // the tile) * H + h] once the segment's scores are stored; prefill_select_kernel, launched
  // with PDL while the scoring grid runs, selects a row once its tile's count is complete, its
  // warps count the tile's rows in sel_done (the last returns both to zero), and the last
  // selection CTA (sel_ctas) waits for the scoring grid before it exits.
  int32_t* tile_done;
  int32_t* sel_done;
  int32_t* sel_ctas;
  int diag;  // development (SIEVE_PREFILL_DIAG): 1 = no key loads, 2 = no MMA, 3 = no score stores
  unsigned long long* trace;  // optional (SIEVE_PREFILL_TRACE): [CTAs][kTracePoints] timestamps
};

constexpr int kTracePoints = 9;  // 8 timestamps + (smid << 32 | key blocks)

// ---------------------------------------------------------------------------------------------
// PTX wrappers

__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_2() { asm volatile("cp.async.wait_group 2;\n" ::: "memory"); }
__device__ __forceinline__ float load_q_rounded(const Args& a, int64_t tok, int h, int d) {
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
__device__ __forceinline__ float row_score(const Args& a, float m, int b, int pos) {
  const int nblk = pos / kBlock + 1;
  if (b >= nblk) return kNegInf;
  return forced_score(m * a.scale, b, nblk, a.init_blocks, a.local_blocks);
}

// ---------------------------------------------------------------------------------------------
// Select path: top-k of full score rows (select_row: indexer_common.cuh)

// The tile's rows r < rows (all threads of the CTA): row r sees n_r = (pos_first + r) / 128 + 1
// <= n_max blocks, scores at sbuf[((row0 + r) * H + h) * sstride + j]. Batches of rows are staged
// as order keys in shared memory by the whole CTA (many loads in flight: one L2 latency per
// batch, not per row), then one warp per row runs select_row. smem_bytes from smem are free.
__device__ void select_tile(const Args& a, uint8_t* smem, int smem_bytes, int64_t row0, int h, int rows, int pos_first,
                            int n_max) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, nwarps = blockDim.x / 32;
  unsigned long long* cand = reinterpret_cast<unsigned long long*>(smem) + warp * kCandCap;
  uint32_t* mk = reinterpret_cast<uint32_t*>(smem + nwarps * kCandCap * 8) + warp * 32;  // lane bests
  uint32_t* stg = reinterpret_cast<uint32_t*>(smem + nwarps * (kCandCap * 8 + 128));
  const int words = (smem_bytes - nwarps * (kCandCap * 8 + 128)) / 4;
  const int batch = max(1, min(rows, words / n_max));
  for (int rb = 0; rb < rows; rb += batch) {
    const int nr = min(batch, rows - rb);
    __syncthreads();  // shared memory free (the previous batch consumed)
#pragma unroll 4
    for (int e = tid; e < nr * n_max; e += blockDim.x) {
      const int rr = e / n_max, j = e - rr * n_max;
      if (j <= (pos_first + rb + rr) / kBlock)
        stg[e] = order_key(__ldcg(a.sbuf + ((row0 + rb + rr) * a.H + h) * a.sstride + j));
    }
    __syncthreads();
    for (int rr = warp; rr < nr; rr += nwarps) {
      const int r = rb + rr;
      select_row(stg + rr * n_max, (pos_first + r) / kBlock + 1, a.topk, cand, mk,
                 a.topk_idx + ((row0 + r) * a.H + h) * a.topk, lane);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel

// kMode: kSS (wgmma, A and B from shared memory), kRS (wgmma, A in registers), kSync (mma.sync).
// kRS3 (bf16 cache only): kRS with a 3-stage key ring whose third stage is the query tile's
// shared memory (free once the query fragments are in registers): two blocks in flight.
// kRSP (bf16 cache only): kRS with each key block as two halves of 64 keys (wgmma m64n64k16, one
// commit group each), software-pipelined so that the tensor pipe has the next half queued while a
// warpgroup takes the maxima of the previous one (prefill_v2_kernel's kRSP loop).
enum Mode { kSS = 0, kRS = 1, kSync = 2, kRS3 = 3, kRSP = 4 };

// Stream-K work of one index head (select mode 2): the batch's tiles in order (requests in
// order, a request's tiles in order), tile t of a request = `setup` units (its query tile and
// pipeline fill; a.sk_setup: 1 unless SIEVE_PREFILL_V2_SK_SETUP says otherwise) then one unit
// per key block it sees; CTA c of G takes the blocks whose units lie in [T c / G, T (c + 1) / G),
// T = all units. Every block belongs to exactly one CTA, and the select path's blocks are
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
__device__ __forceinline__ SkRequest sk_request(const Args& a, int s) {
  const int L = a.qsl[s + 1] - a.qsl[s];
  return sk_shape(L, a.seq_lens[s] - L, a.sk_setup);
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
__device__ void sk_find(const Args& a, int c, int G, long long* sk, int* ski) {
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

template <bool kFp8, int kMode, bool kSelect>
__global__ void __launch_bounds__(kThreads, 2) prefill_v2_kernel(Args a) {
  constexpr bool kWgmma = kMode != kSync;
  constexpr bool kRegA = kMode == kRS || kMode == kRS3 || kMode == kRSP;
  constexpr int kStages = kMode == kRS3 ? 3 : 2;
  static_assert(!(kFp8 && (kMode == kRS3 || kMode == kRSP)), "kRS3, kRSP: bf16 cache only");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int s_last;
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem + kQOff;
  uint8_t* ks = smem + kKOff;
  float* tbl = reinterpret_cast<float*>(smem + kTblOff);

  const int h = blockIdx.z;
  // Tile index over the batch's concatenated tiles (also the counter / workspace slot) and split.
  const int tile_g = a.order ? int(gridDim.x / a.max_splits) - 1 - int(blockIdx.x / a.max_splits) : int(blockIdx.x);
  const int split = a.order ? int(blockIdx.x % a.max_splits) : int(blockIdx.y);
  // Trace slot of this CTA, recomputed at each point (a.trace lives in parameter space: no
  // register is held across the key loop).
#define SIEVE_TRACE_AT(i) \
  a.trace[((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * kTracePoints + (i)]
#define SIEVE_TRACE(i) \
  if (a.trace && threadIdx.x == 0) SIEVE_TRACE_AT(i) = global_ns()
  SIEVE_TRACE(0);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int wg = warp / 4;
  const int K = a.topk;
  // Physical blocks of the split's first kBtCache key blocks (the loop's copies then wait on no
  // global load), and the stream-K cursor (select mode 2 with a.streamk): request, tile, the
  // tile's first unit, the next unit, the end of this CTA's units.
  constexpr int kBtCache = 64;
  __shared__ int s_bt[kBtCache];
  __shared__ long long s_sk[3];
  __shared__ int s_ski[2];
  int sk_s = 0, sk_t = 0;
  long long sk_U = 0, sk_u0 = 0, sk_u1 = 0;
  if (kSelect && a.streamk) {
    // The selection kernel may launch now (with tile_done it selects each tile once scored;
    // else it waits for this grid to complete).
    pdl_trigger();
    if (warp == 0) sk_find(a, blockIdx.x, gridDim.x, s_sk, s_ski);
    __syncthreads();
    sk_U = s_sk[0], sk_u0 = s_sk[1], sk_u1 = s_sk[2], sk_s = s_ski[0], sk_t = s_ski[1];
  }
  int total_nb = 0;
  for (int seg = 0;; ++seg) {
  int s = 0, tile = 0, b_begin = 0, b_end = 0, nsplit = 1;
  if (kSelect && a.streamk) {
    // The next tile holding blocks of this CTA's units (contract-violating tiles are skipped).
    bool got = false;
    while (!got && sk_s < a.num_seqs && sk_U + a.sk_setup < sk_u1) {
      const SkRequest r = sk_request(a, sk_s);
      if (sk_t >= r.nt) {
        ++sk_s, sk_t = 0;
        continue;
      }
      const int n = r.blocks(sk_t);
      s = sk_s, tile = sk_t;
      b_begin = int(max(0ll, sk_u0 - sk_U - a.sk_setup));
      b_end = int(min((long long)n, sk_u1 - sk_U - a.sk_setup));
      got = b_end > b_begin && n <= a.max_blocks;
      sk_U += a.sk_setup + n, sk_u0 = sk_U, ++sk_t;
    }
    if (!got) break;
  } else {
    if (seg > 0) break;
    tile = tile_g, s = 0;
    for (; s < a.num_seqs; ++s) {
      const int qlen = a.qsl[s + 1] - a.qsl[s];
      const int nt = (qlen + kRows - 1) / kRows;
      if (tile < nt) break;
      tile -= nt;
    }
    if (s >= a.num_seqs) {
      SIEVE_TRACE(7);
      return;
    }
  }
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int r0 = tile * kRows;
  const int rows = min(kRows, qlen - r0);
  const int pos_first = seq_len - qlen + r0;
  const int pos_last = pos_first + rows - 1;
  const int n_blocks = pos_last / kBlock + 1;
  if (!(kSelect && a.streamk)) {
    nsplit = (n_blocks + a.kb - 1) / a.kb;
    // (nsplit > max_splits only if batch.max_seq_len understates a length: contract violation.)
    if (split >= nsplit || nsplit > a.max_splits || (kSelect && n_blocks > a.max_blocks)) {
      SIEVE_TRACE(7);
      return;
    }
    b_begin = split * a.kb, b_end = min(n_blocks, b_begin + a.kb);
  }
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
  // Stage j of the key ring: the two key buffers, then (kRS3) the query tile's buffer.
  auto stage_of = [&](int i) -> uint8_t* {
    const int j = kStages == 3 ? i % 3 : (i & 1);
    return j < 2 ? ks + j * kTileBytes : qs;
  };
  // Unit l of this thread: 16 bytes at tid * 16 + l * 4096 of the block, i.e. (bf16) key
  // tid / 16 + 16 l, dims (tid % 16) * 8 ..: swz of key tid / 16 + 16 l is swz of key tid / 16
  // plus 16 l rows (l * 2048 B; the swizzle depends on the key mod 8 only).
  auto fetch = [&](int i) {
    if (a.diag == 1) return;
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
    // kRS3: block 1 into stage 1 now; block 2 goes into the query buffer after the loop's first
    // barrier (every warp has its fragments by then).
    if (kMode == kRS3 && nb > 1) fetch(1);
  }

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;

  const int wrow = warp * 16;  // this warp's first row (warpgroup wg: rows 64wg .. 64wg+63)
  const int rA = wrow + g, rB = rA + 8;
  const int posA = pos_first + rA, posB = pos_first + rB;
  // kSelect: this thread's score row of row rA (row rB = rA + 8 lies 8 * H * sstride further).
  float* const srowA = kSelect ? a.sbuf + (int64_t(tok0 + r0 + rA) * a.H + h) * a.sstride : nullptr;
  // Last valid row of this warpgroup (wgmma) or warp (mma.sync); -1 when none.
  const int unit_lo = kWgmma ? wg * 64 : wrow, unit_n = kWgmma ? 64 : 16;
  const int unit_last = min(rows - 1, unit_lo + unit_n - 1);
  // Block i's scores of rows rA, rB from their maxima mA, mB (quad-reduced; lanes q == 0 store):
  // straight to the score rows (kSelect; rows past the tile have none), else to the CTA table.
  auto store_scores = [&](int i, float mA, float mB) {
    const int b = b_begin + i;
    if (q == 0 && a.diag != 3) {
      if constexpr (kSelect) {
        if (rA < rows) srowA[b] = row_score(a, mA, b, posA);
        if (rB < rows) srowA[int64_t(8 * a.H) * a.sstride + b] = row_score(a, mB, b, posB);
      } else {
        tbl[rA * kTblStride + i] = row_score(a, mA, b, posA);
        tbl[rB * kTblStride + i] = row_score(a, mB, b, posB);
      }
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
      if (kMode == kRS3 && i + 1 < nb) {
        cp_async_wait_1();  // block i; block i + 1 may stay in flight
      } else {
        cp_async_wait_all();  // bf16: block i (and at i = 0 the cp.async query tile)
      }
      fence_proxy_async();
      __syncthreads();  // block i in its stage for all; every warp is done with block i - 1
      if (i == 0 && seg == 0) SIEVE_TRACE(2);
      if constexpr (kMode == kRS3) {
        if (i + 2 < nb) fetch(i + 2);  // into the stage of block i - 1 (at i = 0: the query buffer)
      } else {
        if (i + 1 < nb) fetch(i + 1);
      }
      const uint8_t* stage = stage_of(i);
      const bool active = unit_last >= unit_lo && b * kBlock <= pos_first + unit_last;
      float mA = kNegInf, mB = kNegInf;
      if (active) {
        if (kWgmma && a.diag == 2) {
          // development timing: no MMA (acc keeps its last values)
        } else if constexpr (kWgmma) {
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
        } else {
          const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
          for (int j = 0; j < 64; ++j) acc[j] = 0.f;
#pragma unroll
          for (int st = 0; st < 8; ++st) {
            uint32_t af[4];
            ldmatrix_x4(af, qs + swz(wrow + rr + (mi & 1) * 8, st * 16 + (mi >> 1) * 8));
#pragma unroll
            for (int jp = 0; jp < 8; ++jp) {
              uint32_t bf[4];
              ldmatrix_x4(bf, stage + swz(jp * 16 + rr + (mi >> 1) * 8, st * 16 + (mi & 1) * 8));
              mma_bf16_4(&acc[8 * jp], af, bf[0], bf[1]);
              mma_bf16_4(&acc[8 * jp + 4], af, bf[2], bf[3]);
            }
          }
        }
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
  __syncthreads();  // table complete
  SIEVE_TRACE(3);  // (stream-K: the last segment's loop end)
  if (a.trace && threadIdx.x == 0) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    SIEVE_TRACE_AT(8) = (uint64_t(smid) << 32) | uint32_t(total_nb);
  }

  if constexpr (kSelect) {
    // The CTA holding the tile's last block writes -inf past it in block_scores (which is sbuf).
    if (a.block_scores && b_end == n_blocks) {
      const int w = a.mbps - b_end;
      for (int e = tid; e < rows * w; e += kThreads) {
        const int r = e / w, i = e % w;
        a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b_end + i] = kNegInf;
      }
    }
    SIEVE_TRACE(4);
    if (a.select == 2) {  // prefill_select_kernel selects after this kernel
      if (a.streamk) {
        if (a.tile_done) {
          // This segment's scores are stored (and fenced): count its blocks for the tile.
          __threadfence();
          __syncthreads();
          if (tid == 0) {
            __threadfence();
            atomicAdd(a.tile_done + (int64_t(tok0 + r0) * a.H + h), nb);
          }
        }
        continue;
      }
      SIEVE_TRACE(7);
      return;
    }
    __threadfence();
    __syncthreads();
    if (nsplit > 1) {
      if (tid == 0) {
        int32_t* ctr = a.counters + int64_t(tile_g) * a.H + h;
        s_last = atomicAdd(ctr, 1) == nsplit - 1;
        if (s_last) *ctr = 0;  // every split has arrived: ready for the next launch
      }
      __syncthreads();
      if (!s_last) {
        SIEVE_TRACE(7);
        return;
      }
      __threadfence();
    }
    SIEVE_TRACE(5);
    select_tile(a, smem, kSmemUsed, tok0 + r0, h, rows, pos_first, n_blocks);
    SIEVE_TRACE(6);
    SIEVE_TRACE(7);
    return;
  }

  if (a.block_scores) {
    for (int e = tid; e < rows * nb; e += kThreads) {
      const int r = e / nb, i = e % nb;
      a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b_begin + i] = tbl[r * kTblStride + i];
    }
    if (split == nsplit - 1) {
      const int w = a.mbps - b_end;
      for (int e = tid; e < rows * w; e += kThreads) {
        const int r = e / w, i = e % w;
        a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b_end + i] = kNegInf;
      }
    }
  }

  // Rank the split's candidates of each row (one warp per row, one candidate per lane). A split
  // list holds L = min(topk, kb) entries (a split has at most kb candidates).
  const int L = a.list_len;
  const int64_t tile_rows = (int64_t(tile_g) * a.H + h) * kRows;  // row index base
  for (int r = warp; r < rows; r += kThreads / 32) {
    const int nbr = max(0, min(nb, (pos_first + r) / kBlock + 1 - b_begin));
    const float* trow = tbl + r * kTblStride;
    const float sc = lane < nbr ? trow[lane] : kNegInf;
    const int id = b_begin + lane;
    int rank = 0;
    for (int j = 0; j < nbr; ++j) rank += beats(trow[j], b_begin + j, sc, id);
    if (nsplit == 1) {
      int32_t* out = a.topk_idx + ((tok0 + r0 + r) * int64_t(a.H) + h) * K;
      if (lane < nbr && rank < K) out[rank] = id;
      for (int k = min(K, nbr) + lane; k < K; k += 32) out[k] = -1;
    } else {
      // [tile, head, row, split, L]: a row's lists are contiguous for the merge.
      const int64_t o = ((tile_rows + r) * a.max_splits + split) * L;
      if (lane < nbr && rank < L) {
        a.part_s[o + rank] = sc;
        a.part_i[o + rank] = id;
      }
      for (int k = min(L, nbr) + lane; k < L; k += 32) {
        a.part_s[o + k] = kNegInf;
        a.part_i[o + k] = -1;
      }
    }
  }
  SIEVE_TRACE(4);
  if (nsplit == 1) {
    SIEVE_TRACE(7);
    return;
  }

  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int32_t* ctr = a.counters + int64_t(tile_g) * a.H + h;
    s_last = atomicAdd(ctr, 1) == nsplit - 1;
    if (s_last) *ctr = 0;  // every split has arrived: ready for the next launch
  }
  __syncthreads();
  if (!s_last) {
    SIEVE_TRACE(7);
    return;
  }
  __threadfence();
  SIEVE_TRACE(5);

  // Merge the nsplit sorted lists of each row: batches of rows are staged in the (now unused)
  // shared memory by the whole CTA (one latency per batch), then one warp per row runs topk
  // rounds: lane c offers the heads of lists c and c + 32; the warp picks the highest score by
  // a max-reduction of an order-preserving integer key, ties to the lowest block id by a
  // min-reduction (the "beats" rule); the winning list advances.
  const int per_row = nsplit * L;
  const int batch_rows = min(rows, int(kSmemUsed / (size_t(per_row) * 8)));
  float* ms = reinterpret_cast<float*>(smem);
  int* mi = reinterpret_cast<int*>(ms + batch_rows * per_row);
  for (int rb = 0; rb < rows; rb += batch_rows) {
    const int nr = min(batch_rows, rows - rb);
    for (int e = tid; e < nr * per_row; e += kThreads) {
      const int rr = e / per_row, w = e % per_row;
      const int64_t o = (tile_rows + rb + rr) * a.max_splits * L + w;
      ms[e] = __ldcg(a.part_s + o);
      mi[e] = __ldcg(a.part_i + o);
    }
    __syncthreads();
    if (a.merge_rank) {
      // Rank merge: every staged candidate (one per thread at a time) finds its final rank =
      // its position in its own (sorted) list + the number of entries of each other list that
      // beat it (a prefix of that sorted list: binary search; empty slots, id -1, never beat).
      for (int e = tid; e < nr * per_row; e += kThreads) {
        const int rr = e / per_row, w = e % per_row, c = w / L;
        const int id = mi[e];
        if (id < 0) continue;
        const float sc = ms[e];
        const float* ls = ms + rr * per_row;
        const int* li = mi + rr * per_row;
        int rank = w - c * L;
        for (int c2 = 0; c2 < nsplit && rank < K; ++c2) {
          if (c2 == c) continue;
          int lo = 0, hi = L;  // entries [0, lo) beat the candidate, [hi, L) do not
          while (lo < hi) {
            const int m = (lo + hi) >> 1;
            const int im = li[c2 * L + m];
            if (im >= 0 && beats(ls[c2 * L + m], im, sc, id)) lo = m + 1;
            else hi = m;
          }
          rank += lo;
        }
        if (rank < K) a.topk_idx[((tok0 + r0 + rb + rr) * int64_t(a.H) + h) * K + rank] = id;
      }
      // Slots past the row's candidate count: -1.
      for (int rr = warp; rr < nr; rr += kThreads / 32) {
        int cnt = 0;
        for (int w = lane; w < per_row; w += 32) cnt += mi[rr * per_row + w] >= 0;
        cnt = __reduce_add_sync(0xffffffffu, cnt);
        for (int k = cnt + lane; k < K; k += 32) a.topk_idx[((tok0 + r0 + rb + rr) * int64_t(a.H) + h) * K + k] = -1;
      }
      __syncthreads();
      continue;
    }
    for (int rr = warp; rr < nr; rr += kThreads / 32) {
      const float* ls = ms + rr * per_row;
      const int* li = mi + rr * per_row;
      int head0 = 0, head1 = 0, mine = -1;
      for (int k = 0; k < K; ++k) {
        uint32_t key0 = 0, key1 = 0;  // 0: no candidate
        int id0 = -1, id1 = -1;
        if (lane < nsplit && head0 < L) {
          id0 = li[lane * L + head0];
          if (id0 >= 0) key0 = order_key(ls[lane * L + head0]);
        }
        if (lane + 32 < nsplit && head1 < L) {
          id1 = li[(lane + 32) * L + head1];
          if (id1 >= 0) key1 = order_key(ls[(lane + 32) * L + head1]);
        }
        const bool use1 = key1 > key0 || (key1 == key0 && key1 != 0 && id1 < id0);
        const uint32_t key = use1 ? key1 : key0;
        const int idl = use1 ? id1 : id0;
        const uint32_t best = __reduce_max_sync(0xffffffffu, key);
        if (best == 0) break;  // every list is exhausted: the remaining slots stay -1
        const uint32_t win = __reduce_min_sync(0xffffffffu, key == best ? uint32_t(idl) : 0xffffffffu);
        if (lane == k) mine = int(win);
        if (key == best && uint32_t(idl) == win) {
          if (use1) ++head1;
          else ++head0;
        }
      }
      if (lane < K) a.topk_idx[((tok0 + r0 + rb + rr) * int64_t(a.H) + h) * K + lane] = mine;
    }
    __syncthreads();
  }
  SIEVE_TRACE(6);
  SIEVE_TRACE(7);
  return;
  }  // segments (stream-K: until the CTA's units end; else one)
  SIEVE_TRACE(7);
#undef SIEVE_TRACE
#undef SIEVE_TRACE_AT
}

// ---------------------------------------------------------------------------------------------
// Wide variant of the select path (SIEVE_PREFILL_V2_ROWS=256; bf16 cache): 256 query rows per CTA,
// each warpgroup owning 128 rows as two m64 halves (two 64-register accumulators), so a key block
// read from L2 into shared memory feeds twice the MMAs of the 128-row kernel (that kernel moves
// 32 KB per 4.2 MFLOP; ~4 TB/s from L2 at its measured ~2 us per block per CTA, 264 CTAs). Shared
// memory: the query tile as two 128-row tiles (64 KB, warpgroup w reads tile w) + a 3-stage key
// ring (96 KB): one CTA (2 warpgroups) per SM, 255 registers allowed. Per block: one CTA barrier
// (block i landed: cp.async.wait_group 1 leaves only block i + 1 in flight; every warp is done with
// block i - 1), then per warpgroup both halves' 8 wgmma each in two commit groups, block i + 2
// issued into the stage of block i - 1 behind them; wait_group 1 -> the first half's epilogue
// runs while the tensor cores work on the second half; wait_group 0 -> the second half's
// epilogue. Epilogue, score rows, counter and selection as in the select path of
// prefill_v2_kernel (select_tile over 256 rows).
constexpr int kWRows = 256;
constexpr int kWStages = 3;
constexpr int kWKOff = 2 * kTileBytes;
constexpr int kWSmemUsed = kWKOff + kWStages * kTileBytes;  // 160 KB
constexpr int kWSmemBytes = kWSmemUsed + 1024;
constexpr int kWPipeStages = 4;  // kPipe: 4-stage ring (192 KB with the query tile)
constexpr int kWPipeSmemUsed = kWKOff + kWPipeStages * kTileBytes;
constexpr int kWPipeSmemBytes = kWPipeSmemUsed + 1024;
static_assert(kWPipeSmemBytes <= 227 * 1024, "wide pipelined kernel: shared memory");
static_assert((kWSmemUsed - kThreads / 32 * (kCandCap * 8 + 128)) / 4 >= kSelMaxBlocks, "wide select staging");

// Max over the visible keys of rows rA = rbase + g and rB = rA + 8 of one m64 accumulator (rbase:
// the warp's first row of the half), then the score rows (rows of the tile only).
__device__ __forceinline__ void wide_epilogue(const Args& a, const float (&acc)[64], bool act, int b, int rbase, int g,
                                              int q, int rows, int pos_first, int64_t row0, int h) {
  const int rA = rbase + g, rB = rA + 8;
  const int posA = pos_first + rA, posB = pos_first + rB;
  float mA = kNegInf, mB = kNegInf;
  if (act) {
    rows_max<16>(acc, b * kBlock + kBlock - 1 <= pos_first + rbase, q, posA - b * kBlock, posB - b * kBlock, mA, mB);
    quad_max2(mA, mB);
  }
  if (q == 0) {
    if (rA < rows) a.sbuf[((row0 + rA) * a.H + h) * a.sstride + b] = row_score(a, mA, b, posA);
    if (rB < rows) a.sbuf[((row0 + rB) * a.H + h) * a.sstride + b] = row_score(a, mB, b, posB);
  }
}

// kPipe (SIEVE_PREFILL_V2_WIDE_PIPE, default 1): the CTA barrier of block i + 1 (its keys landed)
// sits between block i's first-half epilogue and the wait for its second half, so the barrier and
// the warps' skew hide under the second half's MMAs; the next issue needs no barrier. A 4-stage
// ring (192 KB with the query tile): block i + 3 goes into the stage of block i - 1 right after
// that barrier (every warp retired block i - 1 before it), two blocks ahead as in kPipe 0.
// (Issuing block i + 1's first half before block i's second-half epilogue would overlap that
// epilogue too, but touching one accumulator while the other's wgmma is pending between two
// issues makes ptxas serialise the wgmmas, C7514: two accumulators allow one overlapped epilogue.)
// kPipe 0: the loop described above.
template <bool kPipe>
__global__ void __launch_bounds__(kThreads, 1) prefill_wide_kernel(Args a) {
  constexpr int kStages = kPipe ? kWPipeStages : kWStages;
  constexpr int kSmemUsedW = kPipe ? kWPipeSmemUsed : kWSmemUsed;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int s_last;
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* qs = smem;
  uint8_t* ks = smem + kWKOff;

  const int h = blockIdx.z;
  const int tile_g = a.order ? int(gridDim.x / a.max_splits) - 1 - int(blockIdx.x / a.max_splits) : int(blockIdx.x);
  const int split = a.order ? int(blockIdx.x % a.max_splits) : int(blockIdx.y);
#define SIEVE_TRACE_AT(i) \
  a.trace[((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * kTracePoints + (i)]
#define SIEVE_TRACE(i) \
  if (a.trace && threadIdx.x == 0) SIEVE_TRACE_AT(i) = global_ns()
  SIEVE_TRACE(0);
  int tile = tile_g, s = 0;
  for (; s < a.num_seqs; ++s) {
    const int qlen = a.qsl[s + 1] - a.qsl[s];
    const int nt = (qlen + kWRows - 1) / kWRows;
    if (tile < nt) break;
    tile -= nt;
  }
  if (s >= a.num_seqs) {
    SIEVE_TRACE(7);
    return;
  }
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int r0 = tile * kWRows;
  const int rows = min(kWRows, qlen - r0);
  const int pos_first = seq_len - qlen + r0;
  const int pos_last = pos_first + rows - 1;
  const int n_blocks = pos_last / kBlock + 1;
  const int nsplit = (n_blocks + a.kb - 1) / a.kb;
  if (split >= nsplit || nsplit > a.max_splits || n_blocks > a.max_blocks) {
    SIEVE_TRACE(7);
    return;
  }
  const int b_begin = split * a.kb, b_end = min(n_blocks, b_begin + a.kb), nb = b_end - b_begin;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int wg = warp / 4, wiw = warp % 4;
  const int32_t* btab = a.block_tables + int64_t(s) * a.mbps;
  const int64_t row0 = int64_t(tok0) + r0;

  // Block b_begin + i (i < nb) into stage i % 3; always one commit group (empty past the split).
  auto fetch = [&](int i) {
    if (i < nb) {
      const uint8_t* src = a.cache + int64_t(btab[b_begin + i]) * (kBlock * kDim * 2);
      uint8_t* stage = ks + (i % kStages) * kTileBytes;
#pragma unroll
      for (int l = 0; l < 8; ++l) {
        const int c = tid + l * kThreads;
        const int n = c >> 4, j = c & 15;  // key, 16-byte unit (8 dims) of its 256-byte row
        cp_async16(stage + swz(n, j * 8), src + c * 16);
      }
    }
    cp_async_commit();
  };

  fetch(0);
  // Query rows r < 256: tile r >> 7, row r & 127 of its swizzled layout; rows past the tile zero.
  if (a.q_async) {
    const uint16_t* qb = static_cast<const uint16_t*>(a.q);
#pragma unroll 4
    for (int e = tid; e < kWRows * (kDim / 8); e += kThreads) {
      const int r = e / (kDim / 8), d = (e % (kDim / 8)) * 8;
      uint8_t* dst = qs + (r >> 7) * kTileBytes + swz(r & 127, d);
      if (r < rows) {
        cp_async16(dst, qb + (row0 + r) * a.q_stride + int64_t(h) * kDim + d);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  } else {
#pragma unroll 2
    for (int e = tid; e < kWRows * (kDim / 8); e += kThreads) {
      const int r = e / (kDim / 8), d = (e % (kDim / 8)) * 8;
      float x[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] = r < rows ? load_q_rounded(a, row0 + r, h, d + j) : 0.f;
      *reinterpret_cast<uint4*>(qs + (r >> 7) * kTileBytes + swz(r & 127, d)) =
          make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]), pack_bf16x2(x[4], x[5]),
                     pack_bf16x2(x[6], x[7]));
    }
  }
  cp_async_commit();  // the query group (empty when stored synchronously)
  fetch(1);
  if constexpr (kPipe) fetch(2);
  SIEVE_TRACE(1);

  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc0[i] = 0.f, acc1[i] = 0.f;
  // Halves of this warpgroup: rows [lo, lo + 64), lo = 128 wg + 64 hh; last valid row (or -1).
  const int lo0 = wg * 128, lo1 = lo0 + 64;
  const int last0 = min(rows - 1, lo0 + 63), last1 = min(rows - 1, lo1 + 63);
  const uint32_t qa = smem_u32(qs) + wg * kTileBytes;

  if constexpr (kPipe) {
    auto act_of = [&](int lo, int last, int b) { return last >= lo && b * kBlock <= pos_first + last; };
    // The 8 MMAs of one half (A at q row offset aoff) with the keys of block i, one commit group.
    auto issue = [&](float (&acc)[64], uint32_t aoff, int i) {
      const uint32_t kbase = smem_u32(ks + (i % kStages) * kTileBytes);
      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        const uint32_t off = (st >> 2) * kChunkBytes + (st & 3) * 32;
        wgmma_m64n128k16(acc, make_desc(qa + aoff + off), make_desc(kbase + off), st > 0);
      }
      wgmma_commit();
    };
    cp_async_wait_2();  // groups: block 0, query, block 1, block 2 -> block 0 and the query landed
    fence_proxy_async();
    __syncthreads();
    SIEVE_TRACE(2);
    if (a.trace && threadIdx.x == 0) {
      uint32_t smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      SIEVE_TRACE_AT(8) = (uint64_t(smid) << 32) | uint32_t(nb);
    }
    for (int i = 0; i < nb; ++i) {
      const int b = b_begin + i;
      issue(acc0, 0, i);
      issue(acc1, 64 * 128, i);
      wgmma_wait_1();  // the first half of block i (the second stays in flight)
      fence_acc(acc0);
      wide_epilogue(a, acc0, act_of(lo0, last0, b), b, lo0 + wiw * 16, g, q, rows, pos_first, row0, h);
      if (i + 1 < nb) {  // (no wgmma in here)
        cp_async_wait_1();  // groups: ..., block i + 1, block i + 2 -> block i + 1 landed
        fence_proxy_async();
        __syncthreads();  // block i + 1 in its stage for all; every warp's MMAs of block i - 1 retired
        fetch(i + 3);     // into the stage of block i - 1
      }
      wgmma_wait_all();  // the second half of block i
      fence_acc(acc1);
      wide_epilogue(a, acc1, act_of(lo1, last1, b), b, lo1 + wiw * 16, g, q, rows, pos_first, row0, h);
    }
  }
  for (int i = 0; i < (kPipe ? 0 : nb); ++i) {
    const int b = b_begin + i;
    cp_async_wait_1();  // groups so far: ..., block i, block i + 1 (i = 0: block 0, query, block 1)
    fence_proxy_async();
    __syncthreads();  // block i in its stage for all; every warp is done with block i - 1
    if (i == 0) {
      SIEVE_TRACE(2);
      if (a.trace && threadIdx.x == 0) {
        uint32_t smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        SIEVE_TRACE_AT(8) = (uint64_t(smid) << 32) | uint32_t(nb);
      }
    }
    const uint32_t kbase = smem_u32(ks + (i % kStages) * kTileBytes);
    const bool act0 = last0 >= lo0 && b * kBlock <= pos_first + last0;
    const bool act1 = last1 >= lo1 && b * kBlock <= pos_first + last1;
    // Both halves always run (no wgmma on a divergent path, which ptxas serialises): a half whose
    // rows all precede the block (act false) only wastes its MMAs; its epilogue stores -inf.
    fence_acc(acc0);
    fence_acc(acc1);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const uint32_t off = (st >> 2) * kChunkBytes + (st & 3) * 32;
      wgmma_m64n128k16(acc0, make_desc(qa + off), make_desc(kbase + off), st > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const uint32_t off = (st >> 2) * kChunkBytes + (st & 3) * 32;
      wgmma_m64n128k16(acc1, make_desc(qa + 64 * 128 + off), make_desc(kbase + off), st > 0);
    }
    wgmma_commit();
    fetch(i + 2);  // into the stage of block i - 1 (no warp reads it now), while the MMAs run
    wgmma_wait_1();
    fence_acc(acc0);
    wide_epilogue(a, acc0, act0, b, lo0 + wiw * 16, g, q, rows, pos_first, row0, h);
    wgmma_wait_all();
    fence_acc(acc1);
    wide_epilogue(a, acc1, act1, b, lo1 + wiw * 16, g, q, rows, pos_first, row0, h);
  }
  __syncthreads();
  SIEVE_TRACE(3);
  if (a.block_scores && split == nsplit - 1) {
    const int w = a.mbps - b_end;
    for (int e = tid; e < rows * w; e += kThreads) {
      const int r = e / w, i = e % w;
      a.block_scores[((row0 + r) * a.H + h) * a.mbps + b_end + i] = kNegInf;
    }
  }
  SIEVE_TRACE(4);
  if (a.select == 2) {  // prefill_select_kernel selects after this kernel
    SIEVE_TRACE(7);
    return;
  }
  __threadfence();
  __syncthreads();
  if (nsplit > 1) {
    if (tid == 0) {
      int32_t* ctr = a.counters + int64_t(tile_g) * a.H + h;
      s_last = atomicAdd(ctr, 1) == nsplit - 1;
      if (s_last) *ctr = 0;  // every split has arrived: ready for the next launch
    }
    __syncthreads();
    if (!s_last) {
      SIEVE_TRACE(7);
      return;
    }
    __threadfence();
  }
  SIEVE_TRACE(5);
  select_tile(a, smem, kSmemUsedW, row0, h, rows, pos_first, n_blocks);
  SIEVE_TRACE(6);
  SIEVE_TRACE(7);
#undef SIEVE_TRACE
#undef SIEVE_TRACE_AT
}

// ---------------------------------------------------------------------------------------------
// SIEVE_PREFILL_V2_SELECT=2: the selection as its own kernel after the scoring kernel, one warp per
// (token, head) row over the whole GPU, instead of 128 (256) rows by the tile's last split at the
// end of the scoring kernel (the tail of the fused select path). Dynamic shared memory per warp:
// cand + lane bests + the row's keys (n_max words).
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One (token, head) row of prefill_select_kernel (one warp). With a.tile_done: first waits until
// the scoring kernel has counted every key block of the row's tile (mirroring which tiles the
// stream-K grid scores: requests with a prefix >= 0, tiles of at most n_max blocks), and after
// the selection counts the row for its tile.
__device__ __forceinline__ void select_kernel_row(const Args& a, int64_t row, int n_max, unsigned long long* cand,
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
  const SkRequest r = sk_shape(L, P, a.sk_setup);
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

// SIEVE_PREFILL_V2_SELECT=2: the selection as its own kernel after the scoring kernel, one warp per
// (token, head) row over the whole GPU, instead of 128 (256) rows by the tile's last split at the
// end of the scoring kernel (the tail of the fused select path). Dynamic shared memory per warp:
// cand + lane bests + the row's keys (n_max words). Launched with programmatic stream
// serialisation (SIEVE_PREFILL_V2_SELECT_PDL, default on): without a.tile_done it waits for the
// scoring grid to complete and its writes to be visible; with it, rows of finished tiles are
// selected while the scoring grid still runs (on the SMs its CTAs have left), and the last CTA
// to finish waits for the scoring grid, so this grid never completes before it.
__global__ void __launch_bounds__(kThreads) prefill_select_kernel(Args a, int64_t nrows, int n_max) {
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

// Test-hook overrides of the knobs below (set_indexer_prefill_v2_knobs; -1 = environment).
std::atomic<int> g_mma{-1}, g_kb{-1}, g_order{-1}, g_merge{-1}, g_select{-1}, g_rows{-1}, g_pipe{-1}, g_streamk{-1},
    g_overlap{-1};

// An on/off knob: on unless the variable is set to 0; and a test-hook override of one (>= 0).
int env_on(const char* name) { return env_int(name, 1) == 0 ? 0 : 1; }
int hook_or(const std::atomic<int>& g, int v) {
  const int f = g.load(std::memory_order_relaxed);
  return f >= 0 ? (f ? 1 : 0) : v;
}

// Tuning override of the blocks per split: SIEVE_PREFILL_V2_KB = 1..24 for the list path, up to
// kSelMaxBlocks for the select path (0 or unset = automatic). Clamped by the caller.
int kb_override() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_KB");
    return e ? std::clamp(std::atoi(e), 0, kSelMaxBlocks) : 0;
  }();
  const int f = g_kb.load(std::memory_order_relaxed);
  return f >= 0 ? std::min(f, kSelMaxBlocks) : v;
}

// SIEVE_PREFILL_V2_MMA = ss | rs | rs3 | rsp | sync, read once; unset (-1): rs or rsp on the stream-K select
// path with a bf16 cache, else ss (see the host). rs3 with an fp8 cache runs rs.
int mma_mode() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_MMA");
    if (e && std::strcmp(e, "rs3") == 0) return int(kRS3);
    if (e && std::strcmp(e, "rsp") == 0) return int(kRSP);
    if (e && std::strcmp(e, "sync") == 0) return int(kSync);
    if (e && std::strcmp(e, "rs") == 0) return int(kRS);
    if (e && std::strcmp(e, "ss") == 0) return int(kSS);
    return -1;
  }();
  const int f = g_mma.load(std::memory_order_relaxed);
  return f >= 0 && f <= 4 ? f : v;
}

// SIEVE_PREFILL_V2_MERGE = rank: the last split's merge ranks every candidate by binary searches
// in the other sorted lists (all threads, no per-row rounds); rounds or unset: topk rounds.
int merge_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_MERGE");
    return e && std::strcmp(e, "rank") == 0 ? 1 : 0;
  }();
  return hook_or(g_merge, v);
}

// SIEVE_PREFILL_V2_ORDER = 1: one-dimensional grid, a tile's splits adjacent, the batch's last
// tile (the longest of a single prompt) first; 0: grid (tiles, splits, heads); unset (-1): 1 with
// the select path, else 0. Read once.
int order_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_ORDER");
    return e && *e ? (std::atoi(e) == 1 ? 1 : 0) : -1;
  }();
  const int f = g_order.load(std::memory_order_relaxed);
  return f >= 0 ? (f == 1 ? 1 : 0) : v;
}

// SIEVE_PREFILL_V2_SELECT = 1: the select path (global score rows, per-row selection by the
// tile's last split); 2 or unset: the same scores, selection by prefill_select_kernel launched
// after the scoring kernel (the default: 45 us against the list path's 125 us at 8192 prompt
// tokens on the H200); 0: split lists + merge. Read once.
int select_knob() {
  static const int v = [] {
    const int x = env_int("SIEVE_PREFILL_V2_SELECT", 2);
    return x == 1 || x == 2 ? x : 0;
  }();
  const int f = g_select.load(std::memory_order_relaxed);
  return f >= 0 ? (f == 1 || f == 2 ? f : 0) : v;
}

// SIEVE_PREFILL_V2_SELECT_PDL = 0: prefill_select_kernel (select 2) launched plainly; 1 or unset:
// with programmatic stream serialisation (its launch overlaps the scoring grid's end). Read once.
bool select_pdl() {
  static const bool v = env_on("SIEVE_PREFILL_V2_SELECT_PDL");
  return v;
}

// SIEVE_PREFILL_V2_SELECT_OVERLAP = 0: the selection kernel waits for the whole stream-K scoring
// grid; 1 or unset: it selects each tile once scored, overlapping the scoring grid's tail (needs
// the selection kernel's PDL launch). Read once.
int overlap_knob() {
  static const int v = env_on("SIEVE_PREFILL_V2_SELECT_OVERLAP");
  return hook_or(g_overlap, v);
}

// SIEVE_PREFILL_V2_STREAMK = 0: select mode 2 with one (tile, split) per CTA; 1 or unset: the
// stream-K grid (2 CTAs per SM per head sharing the causal work evenly). Read once.
int streamk_knob() {
  static const int v = env_on("SIEVE_PREFILL_V2_STREAMK");
  return hook_or(g_streamk, v);
}

// SIEVE_PREFILL_V2_SK_SETUP = 0..64: the stream-K cost of a tile's setup in key blocks (default
// 1). Read once.
int sk_setup_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_SK_SETUP");
    return e && *e ? std::clamp(std::atoi(e), 0, 64) : 1;
  }();
  return v;
}

// SIEVE_PREFILL_DIAG = 1: no key loads; 2: no MMA; 3: no score stores (development timing of
// the 128-row kernel: the outputs are wrong). Read once.
int diag_knob() {
  static const int v = env_int("SIEVE_PREFILL_DIAG");
  return v;
}

// SIEVE_PREFILL_V2_WIDE_PIPE = 0: prefill_wide_kernel without the cross-block pipeline (kPipe);
// 1 or unset: with it. Read once.
int pipe_knob() {
  static const int v = env_on("SIEVE_PREFILL_V2_WIDE_PIPE");
  return hook_or(g_pipe, v);
}

// SIEVE_PREFILL_V2_ROWS = 256: the select path with a bf16 cache runs prefill_wide_kernel (256
// query rows per CTA); 128 or unset: prefill_v2_kernel. Read once.
int rows_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_ROWS");
    return e && std::atoi(e) == 256 ? 256 : 128;
  }();
  const int f = g_rows.load(std::memory_order_relaxed);
  return f >= 0 ? (f == 256 ? 256 : 128) : v;
}

// SIEVE_PREFILL_TRACE=1: every call on a stream that is not capturing is synchronised and prints
// where its CTAs spent their time (global timer): a development aid, never on in serving.
bool trace_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SIEVE_PREFILL_TRACE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

double pct(const std::vector<double>& v, int p) { return v[std::min(v.size() - 1, v.size() * size_t(p) / 100)]; }

void print_trace(const Args& a, dim3 grid, int mode, const std::vector<unsigned long long>& tr, int64_t ctas) {
  unsigned long long t0 = ~0ull, t1 = 0;
  int64_t early = 0, merged = 0, started = 0;
  for (int64_t c = 0; c < ctas; ++c) {
    const unsigned long long* p = &tr[size_t(c * kTracePoints)];
    if (!p[0]) continue;
    ++started;
    t0 = std::min(t0, p[0]);
    t1 = std::max(t1, p[7]);
    if (!p[1]) ++early;
    if (p[5]) ++merged;
  }
  if (!started) return;
  static const char* names[8] = {"start", "q issued", "first K ready", "loop end",
                                            "lists written", "merge start", "merge end", "end"};
  std::fprintf(stderr,
               "prefill trace: grid %u x %u x %u = %lld CTAs (%lld started), kb %d max_splits %d mode %d order %d "
               "merge %s, early exits %lld, merging CTAs %lld, span %.2f us\n",
               grid.x, grid.y, grid.z, (long long)ctas, (long long)started, a.kb, a.max_splits, mode, a.order,
               a.select ? "select" : a.merge_rank ? "rank" : "rounds",
               (long long)early, (long long)merged, double(t1 - t0) / 1000.0);
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
    std::fprintf(stderr, "  early exits start (from first start): min %.2f med %.2f max %.2f\n", d.front(), pct(d, 50),
                 d.back());
  }
}

template <bool kFp8, int kMode, bool kSelect>
void launch(const Args& a, dim3 grid, cudaStream_t stream) {
  set_smem(prefill_v2_kernel<kFp8, kMode, kSelect>, kSmemBytes);
  prefill_v2_kernel<kFp8, kMode, kSelect><<<grid, kThreads, kSmemBytes, stream>>>(a);
}

template <bool kSelect>
void dispatch(const Args& a, dim3 grid, cudaStream_t stream, bool fp8, int mode) {
  switch (mode) {
    case kRS3:
      if (fp8) launch<true, kRS, kSelect>(a, grid, stream);
      else launch<false, kRS3, kSelect>(a, grid, stream);
      break;
    case kRSP:
      if (fp8) launch<true, kRS, kSelect>(a, grid, stream);
      else launch<false, kRSP, kSelect>(a, grid, stream);
      break;
    case kRS:
      if (fp8) launch<true, kRS, kSelect>(a, grid, stream);
      else launch<false, kRS, kSelect>(a, grid, stream);
      break;
    case kSync:
      if (fp8) launch<true, kSync, kSelect>(a, grid, stream);
      else launch<false, kSync, kSelect>(a, grid, stream);
      break;
    default:
      if (fp8) launch<true, kSS, kSelect>(a, grid, stream);
      else launch<false, kSS, kSelect>(a, grid, stream);
  }
}

}  // namespace

void set_indexer_prefill_v2_knobs(const PrefillV2Knobs& k) {
  g_mma.store(k.mma, std::memory_order_relaxed);
  g_kb.store(k.kb, std::memory_order_relaxed);
  g_order.store(k.order, std::memory_order_relaxed);
  g_merge.store(k.merge, std::memory_order_relaxed);
  g_select.store(k.select, std::memory_order_relaxed);
  g_rows.store(k.rows, std::memory_order_relaxed);
  g_pipe.store(k.pipe, std::memory_order_relaxed);
  g_streamk.store(k.streamk, std::memory_order_relaxed);
  g_overlap.store(k.overlap, std::memory_order_relaxed);
}

bool run_indexer_prefill_v2(const ops::IndexerParams& p, void* stream_v) {
  if (!indexer_supported(p)) return false;
  if (reinterpret_cast<uintptr_t>(p.cache.k) % 16 != 0) return false;
  const ops::BatchView& bv = p.batch;
  if (bv.num_seqs == 0 || bv.num_tokens == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);

  const int max_blocks = std::max(1, std::min((bv.max_seq_len + kBlock - 1) / kBlock, bv.max_blocks_per_seq));
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;
  // The select path keeps [num_tokens, H, max_blocks] fp32 scores in the workspace unless
  // block_scores is requested: at most 512 MB of it (else the list path).
  const bool select = select_knob() && max_blocks <= kSelMaxBlocks &&
                      (p.block_scores || int64_t(bv.num_tokens) * p.num_index_heads * max_blocks * 4 <= (int64_t(512) << 20));
  const bool wide = select && !fp8 && rows_knob() == kWRows;  // prefill_wide_kernel: 256-row tiles
  const int tile_rows = wide ? kWRows : kRows;
  const int64_t full_tiles = (bv.num_tokens + tile_rows - 1) / tile_rows;
  const int64_t tiles_upper = full_tiles + bv.num_seqs;
  // Causal work estimate in (tile, block) units, as for one request whose new tokens end at
  // max_seq_len (tile i of n sees the prefix and blocks up to its own: max_blocks - n / 2 on
  // average); resident CTA slots: 2 per SM (the wide kernel: 1 per SM).
  const int64_t work = std::max<int64_t>(1, full_tiles * std::max<int64_t>(1, max_blocks - full_tiles / 2));
  const int64_t slots = int64_t(wide ? 1 : 2) * num_sms();
  int kb;
  if (select) {
    // No table and no lists: any split width. One wave where it fits: a split of kb blocks
    // gives about work / kb + tiles / 2 working CTAs (the last split of each tile is partial),
    // so kb = work / (slots - tiles / 2) (8192 prompt tokens: 9 blocks, 260 CTAs for 264
    // slots). At least 4 blocks (the query tile and the pipeline fill are paid once per CTA),
    // at most 32 (a long prompt: several waves of equal CTAs, the longest tiles first, so the
    // short last tiles fill the tail).
    const int64_t room = std::max(slots - full_tiles / 2, slots / 2);
    kb = int(std::clamp<int64_t>((work + room - 1) / room, 4, 32));
    if (kb_override() > 0) kb = kb_override();
  } else {
    kb = int(std::clamp<int64_t>((work + 6 * slots - 1) / (6 * slots), 2, kMaxKb));
    if (kb_override() > 0) kb = std::min(kb_override(), kMaxKb);
    kb = std::max(kb, (max_blocks + kMaxSplits - 1) / kMaxSplits);
    if (kb > kMaxKb) return false;  // context too long for the split merge: first kernel
  }
  // Stream-K (select mode 2, 128-row kernel): 2 CTAs per SM per head, whatever the lengths.
  const bool streamk = select && !wide && select_knob() == 2 && streamk_knob();
  const int max_splits = streamk ? 1 : (max_blocks + kb - 1) / kb;
  if (tiles_upper > 0x7fffffff || max_splits > 65535 || p.num_index_heads > 65535) return false;

  Args a{};
  fill_indexer_args(a, p);
  a.q_async = a.q_bf16 && !a.q_fp8_round && (p.q_stride * 2) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(p.index_q) % 16 == 0;
  a.num_seqs = bv.num_seqs;
  a.kb = kb;
  a.max_splits = max_splits;
  a.list_len = std::min(p.topk, kb);
  a.block_scores = p.block_scores;
  a.select = select ? select_knob() : 0;
  a.max_blocks = max_blocks;
  if (select) {
    if (p.block_scores) {
      a.sbuf = p.block_scores;
      a.sstride = bv.max_blocks_per_seq;
    } else {
      a.sbuf = static_cast<float*>(workspace(stream, size_t(bv.num_tokens) * p.num_index_heads * max_blocks * 4));
      a.sstride = max_blocks;
    }
    if (max_splits > 1 && a.select == 1) {
      a.counters = zeroed_counters(stream, size_t(tiles_upper) * p.num_index_heads);
    }
  } else if (max_splits > 1) {
    const size_t n = size_t(tiles_upper) * p.num_index_heads * max_splits * kRows * a.list_len;
    char* ws = static_cast<char*>(workspace(stream, n * 8));
    a.part_s = reinterpret_cast<float*>(ws);
    a.part_i = reinterpret_cast<int32_t*>(ws + n * 4);
    a.counters = zeroed_counters(stream, size_t(tiles_upper) * p.num_index_heads);
  }
  a.order = order_knob() >= 0 ? order_knob() : (select ? 1 : 0);
  a.merge_rank = merge_knob();
  a.streamk = streamk ? 1 : 0;
  a.sk_setup = sk_setup_knob();
  if (streamk && select_pdl() && overlap_knob()) {
    const size_t n = size_t(bv.num_tokens) * p.num_index_heads;
    int32_t* ctr = zeroed_counters(stream, 2 * n + 1);
    a.tile_done = ctr;
    a.sel_done = ctr + n;
    a.sel_ctas = ctr + 2 * n;
  }
  a.diag = diag_knob();
  if (a.order && int64_t(tiles_upper) * max_splits > 0x7fffffff) a.order = 0;
  const unsigned sk_ctas = unsigned(std::max<int64_t>(1, 2 * num_sms() / p.num_index_heads));
  const dim3 grid = streamk  ? dim3(sk_ctas, 1u, unsigned(p.num_index_heads))
                    : a.order ? dim3(unsigned(tiles_upper * max_splits), 1u, unsigned(p.num_index_heads))
                              : dim3(unsigned(tiles_upper), unsigned(max_splits), unsigned(p.num_index_heads));
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  a.trace = trace_alloc(trace_enabled(), size_t(ctas) * kTracePoints, stream);
  if (wide && pipe_knob()) {
    set_smem(prefill_wide_kernel<true>, kWPipeSmemBytes);
    prefill_wide_kernel<true><<<grid, kThreads, kWPipeSmemBytes, stream>>>(a);
  } else if (wide) {
    set_smem(prefill_wide_kernel<false>, kWSmemBytes);
    prefill_wide_kernel<false><<<grid, kThreads, kWSmemBytes, stream>>>(a);
  } else if (select) {
    // Default MMA on the stream-K grid with a bf16 cache: rs (query fragments in registers;
    // 32768 prompt tokens on the H200: 296 vs 307 us with ss), as rsp (half blocks, pipelined)
    // where a CTA's share is at least 16 key blocks (32768 prompt tokens: 264-268 vs 288-292 us;
    // 8192 after 57344: 237 vs 256; at 8192 prompt tokens, 8 blocks a CTA, no clear difference in
    // the run-to-run spread). ss otherwise (the fp8 rs instantiation spills).
    const int dflt = !streamk || fp8 ? int(kSS) : work >= 16 * int64_t(sk_ctas) ? int(kRSP) : int(kRS);
    dispatch<true>(a, grid, stream, fp8, mma_mode() >= 0 ? mma_mode() : dflt);
  } else {
    dispatch<false>(a, grid, stream, fp8, std::max(mma_mode(), int(kSS)));
  }
  if (a.select == 2) {
    SIEVE_LAUNCH_CHECK("indexer prefill v2");
    const int64_t nrows = int64_t(bv.num_tokens) * p.num_index_heads;
    const int nw = kThreads / 32;
    const size_t smem = size_t(nw) * (kCandCap * 8 + 128) + size_t(nw) * max_blocks * 4;
    set_smem(prefill_select_kernel, smem);
    launch_pdl(select_pdl(), prefill_select_kernel, dim3(unsigned((nrows + nw - 1) / nw)), dim3(kThreads), smem, stream,
               "indexer prefill select launch", a, nrows, max_blocks);
  }
  SIEVE_LAUNCH_CHECK("indexer prefill v2");
  if (a.trace)
    print_trace(a, grid, wide ? 256 + pipe_knob() : mma_mode(),
                trace_collect(a.trace, size_t(ctas) * kTracePoints, stream), ctas);
  return true;
}

}  // namespace sieve::cuda
