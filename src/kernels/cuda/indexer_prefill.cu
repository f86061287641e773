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
//                               (the longest tile of a prompt starts, and merges, early).
//   SIEVE_PREFILL_TRACE=1       eager calls only (stream not capturing): thread 0 of each CTA
//                               stores %globaltimer at start, q issued, first key block ready,
//                               loop end, lists written, merge start / end, end; the host syncs
//                               and prints per-phase percentiles (stderr). scripts/dev-prefill-sweep
//                               runs the tests, traces and a knob sweep.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kRows = 128;  // query rows per CTA (2 warpgroups x 64)
constexpr int kThreads = 256;
constexpr int kMaxTopk = 32;
constexpr int kMaxKb = 24;      // key blocks per split (table columns)
constexpr int kMaxSplits = 64;  // splits per tile (the merge holds 2 list heads per lane)
constexpr int kTblStride = kMaxKb + 1;
constexpr int kChunkBytes = kRows * 128;        // one 64-dim chunk of 128 rows: 16 KB
constexpr int kTileBytes = 2 * kChunkBytes;     // 128 rows x 128 dims bf16: 32 KB
constexpr int kQOff = 0;
constexpr int kKOff = kTileBytes;
constexpr int kTblOff = kKOff + 2 * kTileBytes;
constexpr int kSmemUsed = kTblOff + kRows * kTblStride * 4;
constexpr int kSmemBytes = kSmemUsed + 1024;  // + alignment slack
constexpr float kInitScore = 1e30f, kLocalScore = 1e29f, kNanScore = -1e30f;
// Select mode: the selecting CTA stages one score row per warp in shared memory as order keys.
constexpr int kSelMaxBlocks = 2048;  // longest row (blocks) the select mode takes: 262144 positions
static_assert(kThreads / 32 * kSelMaxBlocks * 4 <= kSmemUsed, "select staging exceeds shared memory");

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
  // Select mode (1): the epilogue writes each row's block scores straight to sbuf (no table, no
  // split lists); the tile's last split selects every row's top-k from its full score row.
  int select;
  float* sbuf;      // [num_tokens, H, sstride]: block_scores when requested, else the workspace
  int64_t sstride;  // elements per (token, head) row of sbuf
  int max_blocks;   // blocks a row of sbuf holds (a tile reaching further exits: contract violation)
  unsigned long long* trace;  // optional (SIEVE_PREFILL_TRACE): [CTAs][kTracePoints] timestamps
};

constexpr int kTracePoints = 9;  // 8 timestamps + (smid << 32 | key blocks)
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// ---------------------------------------------------------------------------------------------
// PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
// Generic-proxy shared-memory writes (st.shared, cp.async) -> visible to wgmma (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Pins the accumulators around the asynchronous MMAs (no register move crosses the fences).
__device__ __forceinline__ void fence_acc(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr) {
  uint64_t d = uint64_t((saddr & 0x3FFFFu) >> 4);  // start address
  d |= uint64_t(1) << 16;                           // leading byte offset (unused: K fits the swizzle)
  d |= uint64_t(1024 >> 4) << 32;                   // stride byte offset
  d |= uint64_t(1) << 62;                           // 128B swizzle
  return d;
}

// D[64 x 128] (+)= A[64 x 16] . B[128 x 16]^T, A and B from shared memory, fp32 accumulate.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
      "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
      "%58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

// The same with A from registers (the mma.sync m16n8k16 A fragment of the warp's 16 rows).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&af)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, "
      "%39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
      "%58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void mma_bf16_4(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of (row, dim) in a swizzled [2 chunks][128 rows][128 B] bf16 tile; dim % 8 == 0
// gives the start of a 16-byte unit.
__device__ __forceinline__ int swz(int row, int dim) {
  const int u = (dim & 63) >> 3;
  return (dim >> 6) * kChunkBytes + row * 128 + ((u ^ (row & 7)) << 4) + (dim & 7) * 2;
}

__device__ __forceinline__ float load_q(const Args& a, int64_t tok, int h, int d) {
  float v = load_act(a.q, tok * a.q_stride + int64_t(h) * kDim + d, a.q_bf16);
  if (a.q_fp8_round) v = fp8_to_f32(f32_to_fp8_bits(round_bf16(v)));
  return v;
}

// Block score of a row at position pos for block b (max of its visible dots m).
__device__ __forceinline__ float row_score(const Args& a, float m, int b, int pos) {
  const int nblk = pos / kBlock + 1;
  if (b >= nblk) return kNegInf;
  if (b >= nblk - a.local_blocks) return kLocalScore;
  if (b < a.init_blocks) return kInitScore;
  const float s = m * a.scale;
  return s != s ? kNanScore : s;
}

// Order-preserving unsigned key of a non-NaN score (-0 taken as +0, as the float compare
// does); never 0, so 0 can mean "no candidate".
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}

// ---------------------------------------------------------------------------------------------
// Kernel

// kMode: kSS (wgmma, A and B from shared memory), kRS (wgmma, A in registers), kSync (mma.sync).
// kRS3 (bf16 cache only): kRS with a 3-stage key ring whose third stage is the query tile's
// shared memory (free once the query fragments are in registers): two blocks in flight.
enum Mode { kSS = 0, kRS = 1, kSync = 2, kRS3 = 3 };

template <bool kFp8, int kMode, bool kSelect>
__global__ void __launch_bounds__(kThreads, 2) prefill_v2_kernel(Args a) {
  constexpr bool kWgmma = kMode != kSync;
  constexpr bool kRegA = kMode == kRS || kMode == kRS3;
  constexpr int kStages = kMode == kRS3 ? 3 : 2;
  static_assert(!(kFp8 && kMode == kRS3), "kRS3: bf16 cache only");
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int s_last;
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
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
  int tile = tile_g, s = 0;
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
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int r0 = tile * kRows;
  const int rows = min(kRows, qlen - r0);
  const int pos_first = seq_len - qlen + r0;
  const int pos_last = pos_first + rows - 1;
  const int n_blocks = pos_last / kBlock + 1;
  const int nsplit = (n_blocks + a.kb - 1) / a.kb;
  // (nsplit > max_splits only if batch.max_seq_len understates a length: contract violation.)
  if (split >= nsplit || nsplit > a.max_splits || (kSelect && n_blocks > a.max_blocks)) {
    SIEVE_TRACE(7);
    return;
  }
  const int b_begin = split * a.kb, b_end = min(n_blocks, b_begin + a.kb), nb = b_end - b_begin;
  const int K = a.topk;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int wg = warp / 4;
  const int32_t* btab = a.block_tables + int64_t(s) * a.mbps;

  // Keys of block b_begin + i into stage i & 1.
  constexpr int kRowBytes = kFp8 ? kDim : kDim * 2;
  constexpr int kLoads = kFp8 ? 4 : 8;  // 16-byte units per thread per block
  uint4 kreg[kFp8 ? 4 : 1];
  // Stage j of the key ring: the two key buffers, then (kRS3) the query tile's buffer.
  auto stage_of = [&](int i) -> uint8_t* {
    const int j = kStages == 3 ? i % 3 : (i & 1);
    return j < 2 ? ks + j * kTileBytes : qs;
  };
  auto fetch = [&](int i) {
    const uint8_t* src = a.cache + int64_t(btab[b_begin + i]) * (kBlock * kRowBytes);
    uint8_t* stage = stage_of(i);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int c = tid + l * kThreads;
      if constexpr (kFp8) {
        kreg[l] = ldg_stream(src + c * 16);
      } else {
        const int n = c >> 4, j = c & 15;  // key, 16-byte unit (8 dims) of its 256-byte row
        cp_async16(stage + swz(n, j * 8), src + c * 16);
      }
    }
    if constexpr (!kFp8) cp_async_commit();
  };
  // fp8: the registers of block i, converted exactly to bf16, into stage i & 1.
  auto store_fp8 = [&](int i) {
    if constexpr (kFp8) {
      uint8_t* stage = ks + (i & 1) * kTileBytes;
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const int c = tid + l * kThreads;
        const int n = c >> 3, j = c & 7;  // key, 16 dims j*16 .. j*16+15
        const uint32_t w[4] = {kreg[l].x, kreg[l].y, kreg[l].z, kreg[l].w};
        uint32_t o[8];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          o[2 * t] = fp8x2_to_bf16x2(uint16_t(w[t] & 0xffffu));
          o[2 * t + 1] = fp8x2_to_bf16x2(uint16_t(w[t] >> 16));
        }
        *reinterpret_cast<uint4*>(stage + swz(n, j * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(stage + swz(n, j * 16 + 8)) = make_uint4(o[4], o[5], o[6], o[7]);
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
      for (int j = 0; j < 8; ++j) x[j] = r < rows ? load_q(a, tok0 + r0 + r, h, d + j) : 0.f;
      *reinterpret_cast<uint4*>(qs + swz(r, d)) = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                                                             pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7]));
    }
  }
  if constexpr (kFp8) store_fp8(0);
  SIEVE_TRACE(1);
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

  for (int i = 0; i < nb; ++i) {
    const int b = b_begin + i;
    if (kMode == kRS3 && i + 1 < nb) {
      cp_async_wait_1();  // block i; block i + 1 may stay in flight
    } else {
      cp_async_wait_all();  // bf16: block i (and at i = 0 the cp.async query tile)
    }
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
    if constexpr (kMode == kRS3) {
      if (i + 2 < nb) fetch(i + 2);  // into the stage of block i - 1 (at i = 0: the query buffer)
    } else {
      if (i + 1 < nb) fetch(i + 1);
    }
    const uint8_t* stage = stage_of(i);
    const bool active = unit_last >= unit_lo && b * kBlock <= pos_first + unit_last;
    float mA = kNegInf, mB = kNegInf;
    if (active) {
      if constexpr (kWgmma) {
        const uint32_t qa = smem_addr(qs) + wg * 64 * 128, kbase = smem_addr(stage);
        fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          const uint32_t off = (st >> 2) * kChunkBytes + (st & 3) * 32;
          if constexpr (kRegA) {
            wgmma_m64n128k16_rs(acc, qf[st], make_desc(kbase + off), st > 0);
          } else {
            wgmma_m64n128k16(acc, make_desc(qa + off), make_desc(kbase + off), st > 0);
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
      if (b * kBlock + kBlock - 1 <= pos_first + wrow) {
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          mA = fmaxf(mA, fmaxf(acc[4 * n], acc[4 * n + 1]));
          mB = fmaxf(mB, fmaxf(acc[4 * n + 2], acc[4 * n + 3]));
        }
      } else {
        const int limA = posA - b * kBlock, limB = posB - b * kBlock;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int key = 8 * n + 2 * q + j;
            mA = fmaxf(mA, key <= limA ? acc[4 * n + j] : kNegInf);
            mB = fmaxf(mB, key <= limB ? acc[4 * n + 2 + j] : kNegInf);
          }
        }
      }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        mA = fmaxf(mA, __shfl_xor_sync(0xffffffffu, mA, o));
        mB = fmaxf(mB, __shfl_xor_sync(0xffffffffu, mB, o));
      }
    }
    if (q == 0) {
      if constexpr (kSelect) {
        // Straight to the score rows (rows past the tile have none).
        if (rA < rows) srowA[b] = row_score(a, mA, b, posA);
        if (rB < rows) srowA[int64_t(8 * a.H) * a.sstride + b] = row_score(a, mB, b, posB);
      } else {
        tbl[rA * kTblStride + i] = row_score(a, mA, b, posA);
        tbl[rB * kTblStride + i] = row_score(a, mB, b, posB);
      }
    }
    if constexpr (kFp8) {
      if (i + 1 < nb) store_fp8(i + 1);
    }
  }
  __syncthreads();  // table complete
  SIEVE_TRACE(3);

  if constexpr (kSelect) {
    // The tile's last split writes -inf past its last block in block_scores (which is sbuf).
    if (a.block_scores && split == nsplit - 1) {
      const int w = a.mbps - b_end;
      for (int e = tid; e < rows * w; e += kThreads) {
        const int r = e / w, i = e % w;
        a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b_end + i] = kNegInf;
      }
    }
    SIEVE_TRACE(4);
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
    // One warp per row: the row's visible scores (blocks 0 .. pos / 128) as order keys in the
    // warp's slice of shared memory, lane l owning blocks l, l + 32, ...; each lane keeps its best
    // (highest key, then lowest block: ascending scan, strict compare). topk rounds: the warp's
    // best key by __reduce_max_sync, the lowest block among the lanes holding it by
    // __reduce_min_sync (the contract's rule; block ids unique), the owning lane clears it (key 0
    // = taken) and rescans its own blocks. Every lane touches only its own blocks.
    uint32_t* wk = reinterpret_cast<uint32_t*>(smem) + warp * kSelMaxBlocks;
    for (int r = warp; r < rows; r += kThreads / 32) {
      const int64_t row = (tok0 + r0 + r) * int64_t(a.H) + h;
      const float* srow = a.sbuf + row * a.sstride;
      const int nvis = (pos_first + r) / kBlock + 1;
      uint32_t bk = 0, bi = 0xffffffffu;
      for (int j = lane; j < nvis; j += 32) {
        const uint32_t k = order_key(__ldcg(srow + j));
        wk[j] = k;
        if (k > bk) bk = k, bi = uint32_t(j);
      }
      int mine = -1;
      for (int k = 0; k < K; ++k) {
        const uint32_t best = __reduce_max_sync(0xffffffffu, bk);
        if (best == 0) break;  // fewer visible blocks than topk: the remaining slots stay -1
        const uint32_t win = __reduce_min_sync(0xffffffffu, bk == best ? bi : 0xffffffffu);
        if (lane == k) mine = int(win);
        if (bi == win) {  // the owning lane (bk == best: ids are unique)
          wk[win] = 0;
          bk = 0, bi = 0xffffffffu;
          for (int j = lane; j < nvis; j += 32) {
            const uint32_t kj = wk[j];
            if (kj > bk) bk = kj, bi = uint32_t(j);
          }
        }
      }
      if (lane < K) a.topk_idx[row * K + lane] = mine;
      __syncwarp();
    }
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
#undef SIEVE_TRACE
#undef SIEVE_TRACE_AT
}

// ---------------------------------------------------------------------------------------------
// Host

template <class Kernel>
void set_smem(Kernel k, size_t bytes) {
  static std::mutex mu;
  static std::map<const void*, size_t> limit;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = limit[reinterpret_cast<const void*>(k)];
  if (bytes <= have) return;
  cuda_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute");
  have = bytes;
}

// Test-hook overrides of the knobs below (set_indexer_prefill_v2_knobs; -1 = environment).
std::atomic<int> g_mma{-1}, g_kb{-1}, g_order{-1}, g_merge{-1}, g_select{-1};

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

// SIEVE_PREFILL_V2_MMA = ss | rs | rs3 | sync (default ss), read once. rs3 with an fp8 cache runs rs.
int mma_mode() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_MMA");
    if (e && std::strcmp(e, "rs3") == 0) return int(kRS3);
    if (e && std::strcmp(e, "sync") == 0) return int(kSync);
    if (e && std::strcmp(e, "rs") == 0) return int(kRS);
    return int(kSS);
  }();
  const int f = g_mma.load(std::memory_order_relaxed);
  return f >= 0 && f <= 3 ? f : v;
}

// SIEVE_PREFILL_V2_MERGE = rank: the last split's merge ranks every candidate by binary searches
// in the other sorted lists (all threads, no per-row rounds); rounds or unset: topk rounds.
int merge_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_MERGE");
    return e && std::strcmp(e, "rank") == 0 ? 1 : 0;
  }();
  const int f = g_merge.load(std::memory_order_relaxed);
  return f >= 0 ? (f ? 1 : 0) : v;
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
// tile's last split); 0 or unset: split lists + merge. Read once.
int select_knob() {
  static const int v = [] {
    const char* e = std::getenv("SIEVE_PREFILL_V2_SELECT");
    return e && std::atoi(e) == 1 ? 1 : 0;
  }();
  const int f = g_select.load(std::memory_order_relaxed);
  return f >= 0 ? (f ? 1 : 0) : v;
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
}

bool run_indexer_prefill_v2(const ops::IndexerParams& p, void* stream_v) {
  if (p.index_dim != kDim || p.cache.index_dim != kDim || p.cache.block_size != kBlock) return false;
  if (p.cache.dtype != DType::BF16 && p.cache.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.topk <= 0 || p.topk > kMaxTopk || p.num_index_heads <= 0) return false;
  if (reinterpret_cast<uintptr_t>(p.cache.k) % 16 != 0) return false;
  const ops::BatchView& bv = p.batch;
  if (bv.num_seqs == 0 || bv.num_tokens == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);

  const int max_blocks = std::max(1, std::min((bv.max_seq_len + kBlock - 1) / kBlock, bv.max_blocks_per_seq));
  const int64_t full_tiles = (bv.num_tokens + kRows - 1) / kRows;
  const int64_t tiles_upper = full_tiles + bv.num_seqs;
  // Causal work estimate in (tile, block) units; about 6 units per resident CTA (2 per SM).
  const int64_t work = std::max<int64_t>(1, full_tiles * max_blocks / 2);
  const int64_t slots = int64_t(2) * num_sms();
  const bool select = select_knob() && max_blocks <= kSelMaxBlocks;
  int kb;
  if (select) {
    // No table and no lists: any split width. About 8 waves of kb-block CTAs (at least 4 blocks
    // a CTA: the query tile and the pipeline fill are paid once per CTA).
    kb = int(std::clamp<int64_t>((work + 8 * slots - 1) / (8 * slots), 4, 64));
    if (kb_override() > 0) kb = kb_override();
  } else {
    kb = int(std::clamp<int64_t>((work + 6 * slots - 1) / (6 * slots), 2, kMaxKb));
    if (kb_override() > 0) kb = std::min(kb_override(), kMaxKb);
    kb = std::max(kb, (max_blocks + kMaxSplits - 1) / kMaxSplits);
    if (kb > kMaxKb) return false;  // context too long for the split merge: first kernel
  }
  const int max_splits = (max_blocks + kb - 1) / kb;
  if (tiles_upper > 0x7fffffff || max_splits > 65535 || p.num_index_heads > 65535) return false;

  Args a{};
  a.q = p.index_q;
  a.q_bf16 = p.q_dtype == DType::BF16;
  a.q_fp8_round = p.q_in_cache_dtype && p.cache.dtype == DType::FP8_E4M3;
  a.q_async = a.q_bf16 && !a.q_fp8_round && (p.q_stride * 2) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(p.index_q) % 16 == 0;
  a.q_stride = p.q_stride;
  a.H = p.num_index_heads;
  a.scale = p.score_scale;
  a.cache = static_cast<const uint8_t*>(p.cache.k);
  a.qsl = bv.query_start_loc;
  a.seq_lens = bv.seq_lens;
  a.block_tables = bv.block_tables;
  a.mbps = bv.max_blocks_per_seq;
  a.num_seqs = bv.num_seqs;
  a.topk = p.topk;
  a.init_blocks = p.init_blocks;
  a.local_blocks = p.local_blocks;
  a.kb = kb;
  a.max_splits = max_splits;
  a.list_len = std::min(p.topk, kb);
  a.topk_idx = p.topk_idx;
  a.block_scores = p.block_scores;
  a.select = select ? 1 : 0;
  a.max_blocks = max_blocks;
  if (select) {
    if (p.block_scores) {
      a.sbuf = p.block_scores;
      a.sstride = bv.max_blocks_per_seq;
    } else {
      a.sbuf = static_cast<float*>(workspace(stream, size_t(bv.num_tokens) * p.num_index_heads * max_blocks * 4));
      a.sstride = max_blocks;
    }
    if (max_splits > 1) a.counters = zeroed_counters(stream, size_t(tiles_upper) * p.num_index_heads);
  } else if (max_splits > 1) {
    const size_t n = size_t(tiles_upper) * p.num_index_heads * max_splits * kRows * a.list_len;
    char* ws = static_cast<char*>(workspace(stream, n * 8));
    a.part_s = reinterpret_cast<float*>(ws);
    a.part_i = reinterpret_cast<int32_t*>(ws + n * 4);
    a.counters = zeroed_counters(stream, size_t(tiles_upper) * p.num_index_heads);
  }
  a.order = order_knob() >= 0 ? order_knob() : (select ? 1 : 0);
  a.merge_rank = merge_knob();
  if (a.order && int64_t(tiles_upper) * max_splits > 0x7fffffff) a.order = 0;
  const dim3 grid = a.order ? dim3(unsigned(tiles_upper * max_splits), 1u, unsigned(p.num_index_heads))
                            : dim3(unsigned(tiles_upper), unsigned(max_splits), unsigned(p.num_index_heads));
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;
  unsigned long long* trace = nullptr;
  const int64_t ctas = int64_t(grid.x) * grid.y * grid.z;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (trace_enabled()) cuda_check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  if (trace_enabled() && capturing == cudaStreamCaptureStatusNone) {
    cuda_check(cudaMalloc(&trace, size_t(ctas) * kTracePoints * 8), "trace alloc");
    cuda_check(cudaMemsetAsync(trace, 0, size_t(ctas) * kTracePoints * 8, stream), "trace memset");
    a.trace = trace;
  }
  if (select) dispatch<true>(a, grid, stream, fp8, mma_mode());
  else dispatch<false>(a, grid, stream, fp8, mma_mode());
  SIEVE_LAUNCH_CHECK("indexer prefill v2");
  if (trace) {
    std::vector<unsigned long long> tr(size_t(ctas) * kTracePoints);
    cuda_check(cudaMemcpyAsync(tr.data(), trace, tr.size() * 8, cudaMemcpyDeviceToHost, stream), "trace copy");
    cuda_check(cudaStreamSynchronize(stream), "trace sync");
    print_trace(a, grid, mma_mode(), tr, ctas);
    cudaFree(trace);
  }
  return true;
}

}  // namespace sieve::cuda
