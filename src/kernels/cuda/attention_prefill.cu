// Paged GQA attention for prefill batches (ops::AttentionParams, block-sparse or dense, bf16 or
// fp8 KV, 16 or 8 q heads per kv head, head_dim and block_size 128): query tiles that share K/V
// blocks.
//
// The decode kernel (attention.cu) gives every (query token, kv head) row its own CTAs, which
// stream the row's blocks from L2; at 8192 prompt tokens that is ~8.6 GB of L2 reads for 148
// GFLOP. Here one CTA takes a tile of 8 consecutive new tokens of one request (one kv head) and
// walks the union of the blocks they attend to (sparse: the union of their topk_idx entries;
// dense: blocks 0 .. the last token's block), loading each block once for all 8 tokens.
// That is for G = 16 q heads per kv head (one TP4 rank of MiniMax-M3); with G = 8 (one TP8 rank)
// the tile is 16 tokens and a warp's 16 MMA rows are two tokens' 8 heads (below: G = 8).
//
// CTA = 256 threads = two warpgroups, each owning 4 of the tile's tokens; which 4 is chosen per
// tile: of the 35 ways to split the 8 tokens in two, the one with the fewest (warpgroup, block)
// passes (the consecutive split wins ties).
//  - Warp j of a warpgroup holds one token's 16 q heads (the wgmma rows 16j .. 16j+15: rows g
//    and g + 8 of each lane) and that token's online-softmax state (m, l, O: 64 fp32
//    accumulators a thread) for the whole tile.
//  - Per union block and warpgroup (skipped when none of its tokens attends to the block):
//    S = Q K^T with 8 wgmma.m64n128k16 (Q and K from shared memory, K-major 128-byte-swizzled
//    descriptors), scaled to base 2 and masked: a warp whose token does not attend to the block
//    gives P = 0 without touching its state; the token's own block masks keys past its
//    position. Base-2 online softmax in registers, P rounded to bf16 as the register A operand
//    of 8 wgmma.m64n128k16 with V from shared memory as an MN-major B (the cache block's own
//    [key][dim] layout: 64-dim halves 16 KB apart, 8-key groups 1 KB apart).
//  - "Solo" blocks (bf16, sparse): a block that exactly one token of a warpgroup attends to runs
//    on that token's warp alone, with mma.sync.m16n8k16 and ldmatrix (.trans for V) over the same
//    swizzled tiles (its accumulators have the wgmma layout), while the other three warps go on
//    with their own blocks; the warps of a warpgroup meet at a named barrier before each wgmma.
//  - bf16 KV: thread 0 issues per block two 2-D TMA copies of K (dims 0-63, 64-127: boxes of 128
//    rows x 128 B, 128-byte swizzle) and two of V into a ring of 3 stages (64 KB each), one
//    mbarrier (transaction count) per stage; the last of the 8 warps done with a stage (a
//    shared-memory counter) refills it, so the two warpgroups run apart by up to the ring's
//    depth. Tensor maps over the whole cache ([num_blocks * kv_heads * 128 rows, 128 dims]) are
//    built on the host per call. fp8 KV: the CTA reads block i + 1 into registers (16-byte
//    loads) before block i's math and stores it converted exactly to bf16 after it, into a ring
//    of 2 stages that also holds the block's 128 k and 128 v scales (one CTA barrier a block).
//  - Staged fp8 (AttentionTuning::prefill_fp8_stage; by default dense and sparse calls): before the
//    tiles, a kernel converts every fp8 block the call reads (sparse: those marked from topk_idx
//    by a first kernel; dense: every block up to each request's length; a block's slot is its
//    table entry, or where the copy has fewer slots, taken from a counter by the mark kernel
//    after a memset) exactly to bf16 into the workspace, with a block table of its own and
//    its k and v scales beside it (v scales past the request's length zero), one CTA a (request,
//    block, 16 rows, kv head); the tiles follow it by programmatic dependent launch
//    (prefill_fp8_stage_pdl) and wait (griddepcontrol.wait) before they read the copy's table.
//    The bf16 path (TMA, tensor maps over the copy) then runs over it, applying k_scale to the
//    fp32 scores and v_scale to P as the fp8 ring does, so the results are the same bit for bit.
//    The scales come per key from global memory (L1) beside the 3-stage ring, or
//    (prefill_fp8_stage_scales = 1) by two bulk copies with each block into a 2-stage ring (3
//    stages with scales do not fit). The copy's
//    size is bounded from the call's shapes (slots: requests x max blocks, sparse also tokens x
//    kv heads x topk); a call whose bound passes prefill_fp8_stage_max_mib converts in the
//    tiles. Sparse calls are staged only with prefill_fp8_stage = 2 (docs/kernels.md).
//    With prefill_fp8_stage_fold = 1 (the default; 0 is the exact copy above) the copy holds K
//    and V already multiplied by their scales (rounded to bf16) and the tiles run the plain bf16
//    path over it (no scales, solo blocks as for bf16): one more bf16 rounding of each K and V
//    element than the CPU reference.
//    With prefill_fp8_qk = 1, S = Q K^T runs on fp8 tensor cores (4 wgmma.m64n128k32 e4m3
//    instead of 8 bf16 k16 steps): the copy keeps K as fp8 (one TMA box of 128 rows x 128 B a
//    block, 128-byte swizzle) with its k scales (a 512-byte bulk copy into the stage, in the
//    stage's transaction bytes) and V folded to bf16; the CTA quantizes its Q tile once to e4m3,
//    each (token, head) row with its own scale amax / 448, into the swizzled K-major layout of
//    the A operand, and S = acc * q_scale[row] * k_scale[key] * scale_log2 (q scale a register).
//    P V is the bf16 path's, over the folded V. Q's 3 mantissa bits are a real loss (tests:
//    Fp8QkMatchesCpu*).
//  - Keys past the request's length in its last block may hold anything (NaN included): S
//    masks them by selection, and the V rows of that block past the length (and their v scales)
//    are zeroed in shared memory before use (0 * NaN would poison P V).
// Union of a tile's selections: the (block, token) pairs of its topk_idx entries (entries < 0
// or past the token's own block dropped) are ranked by the CTA (tile tokens x topk <= 256
// pairs), and a block's tokens become an 8-bit (G = 16) or 16-bit (G = 8) mask. Blocks are
// visited in ascending order.
// G = 8: tile of 16 tokens; warpgroup w takes tokens 8 w .. 8 w + 7 (the consecutive split, no
// search), its warp j tokens 8 w + 2 j (rows g of each lane: wgmma rows 16 j + g) and
// 8 w + 2 j + 1 (rows g + 8), head g in both. The two rows of a lane keep their own m, l and O
// as for G = 16, but masks are per row: a row whose token does not attend to the block (the
// other row's token does) gets P = 0 and keeps its state (a row that has seen no key yet
// subtracts 0 for its m = -inf), and the causal mask uses each row's own position. No solo
// blocks (they take a whole warp for one token).
// Grid: x = ceil(num_tokens / tile tokens) + num_seqs (an upper bound on the tiles; CTAs past
// the last tile exit), taken in reverse so the longest tiles of a prompt start first; y = kv
// head. One CTA per SM (~226 KB of shared memory with bf16, ~162 KB with fp8).
// Precision: as the decode kernel's bf16 path: Q rounded to bf16, bf16 MMA with fp32
// accumulation, P rounded to bf16 for P V (fp8: P * v_scale rounded to bf16; k_scale applied
// to the fp32 scores; a folded staged copy: k * k_scale and v * v_scale rounded to bf16 instead),
// softmax and the running sums in fp32.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_common.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"
#include "kernels/cuda/wgmma.cuh"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kThreads = 256;               // two warpgroups
constexpr int kChunk = kSwzHalfBytes;       // bytes: one 64-dim half of a 128-row bf16 tile (swz)
constexpr int kTileBytes = 2 * kChunk;      // a 128 x 128 bf16 tile (Q, K or V)
constexpr int kMaxPairs = 256;  // tile tokens * topk
// The rule's smallest prompt chunk (use_prefill_attention), whatever the tile's size.
constexpr int kRuleMinChunk = 8;

// The tile's tokens for G q heads per kv head: the CTA's 128 wgmma rows are tokens x heads.
constexpr int tile_tokens(int g) { return 128 / g; }

// Ring geometry: bf16 KV (and staged fp8 with scales from global memory), 3 stages of K and V
// tiles filled by TMA; fp8 KV, 2 stages of the converted tiles plus the block's 128 k and 128 v
// scales (kScaleStage), filled by the CTA's threads (or, staged fp8, by TMA and bulk copies);
// fp8 S (kK8), 3 stages of K as fp8 (128 rows x 128 B, one swizzled box), V as bf16 and the 128
// k scales (padded to 1 KB: the stages stay 1024-byte aligned). Union masks take kMaskBytes a
// block (a bit per tile token).
template <bool kScaleStage, int kMaskBytes, bool kK8 = false>
struct PfGeo {
  static_assert(!(kScaleStage && kK8), "fp8 S: k scales in a 3-stage ring");
  static constexpr int kStages = kScaleStage ? 2 : 3;
  static constexpr int kVOff = kK8 ? kChunk : kTileBytes;       // V tile in a stage
  static constexpr int kSclOff = kVOff + kTileBytes;             // k scales (then v scales)
  static constexpr int kStageBytes = kK8 ? kSclOff + 1024 : 2 * kTileBytes + (kScaleStage ? 2 * kBlock * 4 : 0);
  // Bytes the copies of one block deliver to the stage's barrier (TMA and bulk copies).
  static constexpr int kTxBytes = kK8 ? kSclOff + kBlock * 4 : kStageBytes;
  // Shared memory: [Q tile][kStages x (K, V[, scales])][full barriers][union blocks][their
  // physical blocks][union masks][misc].
  static constexpr size_t kBarOffset = size_t(kTileBytes) + size_t(kStages) * kStageBytes;
  static constexpr size_t kSmemBytes =
      kBarOffset + kStages * 8 + kMaxPairs * 8 + kMaxPairs * kMaskBytes + 32 * 4;
};

struct PfArgs {
  const void* q;
  bool q_bf16;
  bool q_vec;  // 16-byte (bf16) / 32-byte (f32) aligned rows: vector loads of 8 elements
  int64_t q_stride;
  void* out;
  bool out_bf16;
  bool out_vec;  // 4-byte (bf16) / 8-byte (f32) aligned pairs: one store per two dims
  int64_t out_stride;
  int nkv;
  float scale_log2;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps, num_seqs;
  const int32_t* topk_idx;  // null: dense
  int topk;
  // fp8 KV: the caches and their per-(token, kv head) scales (bf16 KV: read through the maps;
  // staged fp8: the staged copy's scales, in the staged blocks' order).
  const uint8_t* k8;
  const uint8_t* v8;
  const float* k_scale;
  const float* v_scale;
};

// Staged fp8 (AttentionTuning::prefill_fp8_stage): where the k / v scales of a block come from.
enum StagedScales : int {
  kNoScales = 0,      // bf16 cache, or fp8 converted by the tile (its own ring holds the scales)
  kScalesGlobal = 1,  // read per key from global memory (L1) beside the bf16 path's 3 stages
  kScalesStaged = 2,  // bulk-copied with the block into a 2-stage ring
  // S on fp8 tensor cores (AttentionTuning::prefill_fp8_qk): the staged copy holds K as fp8 with
  // its k scales (bulk-copied into the stage beside it) and V folded to bf16 (no v scales); Q is
  // quantized per (token, head) row to e4m3 in shared memory.
  kQkFp8 = 3,
};

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// G: q heads per kv head, 16 or 8 (G = 8: a warp's 16 rows are two tokens' 8 heads, rows g and
// g + 8 of a lane belonging to different tokens, so masks and softmax state are per row).
// kScl (StagedScales): the bf16 path over a staged bf16 copy of an fp8 cache, with its scales.
template <int G, bool kFp8, bool kSolo, int kScl = kNoScales>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_kernel(PfArgs a, const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv) {
  static_assert(G == 16 || G == 8, "tiles of 8 tokens x 16 heads or 16 tokens x 8 heads");
  static_assert(!kSolo || G == 16, "solo blocks run a whole warp's rows for one token");
  static_assert(!(kFp8 && kScl != kNoScales) && !(kSolo && kScl != kNoScales), "staged: the plain TMA path");
  constexpr bool kQ8 = kScl == kQkFp8;                  // S = Q K^T in e4m3
  constexpr bool kScaled = kFp8 || kScl != kNoScales;  // k_scale on S
  constexpr bool kVScaled = kScaled && !kQ8;           // v_scale on P (kQ8: folded into V)
  constexpr int kTileTokens = tile_tokens(G);
  constexpr int kTokBits = G == 16 ? 3 : 4;          // log2(kTileTokens)
  constexpr int kAllSlots = (1 << kTileTokens) - 1;  // a tile's token slots as a bit set
  using Mask = std::conditional_t<G == 16, uint8_t, uint16_t>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kvh = blockIdx.y;

  // The tile: CTAs in reverse order over the requests' tiles of kTileTokens new tokens.
  const int64_t r = int64_t(gridDim.x) - 1 - blockIdx.x;
  int seq = -1;
  int64_t tile = 0;
  {
    int64_t acc = 0;
    for (int s = 0; s < a.num_seqs; ++s) {
      const int qlen = a.qsl[s + 1] - a.qsl[s];
      const int64_t n = (qlen + kTileTokens - 1) / kTileTokens;
      if (r < acc + n) {
        seq = s;
        tile = r - acc;
        break;
      }
      acc += n;
    }
  }
  // Behind the staged copy's conversion (programmatic dependent launch; a no-op otherwise) the
  // copy and its table are read only after griddepcontrol.wait (pdl_wait below); every thread
  // passes one before it exits.
  if (seq < 0) {
    pdl_wait();
    return;
  }
  if ((smem_u32(smem) & 1023u) != 0) __trap();  // the swizzled tiles need 1024-byte alignment
  const int qlen = a.qsl[seq + 1] - a.qsl[seq];
  const int seq_len = a.seq_lens[seq];
  const int64_t tok0 = a.qsl[seq] + tile * kTileTokens;
  const int ntok = min(kTileTokens, qlen - int(tile) * kTileTokens);
  const int pos0 = seq_len - qlen + int(tile) * kTileTokens;  // position of the tile's first token
  const int last_own = (pos0 + ntok - 1) / kBlock;
  using Geo = PfGeo<kFp8 || kScl == kScalesStaged, int(sizeof(Mask)), kQ8>;
  constexpr int kStages = Geo::kStages;
  constexpr int kStageBytes = Geo::kStageBytes;
  constexpr int kVOff = Geo::kVOff, kSclOff = Geo::kSclOff;
  constexpr size_t kBarOffset = Geo::kBarOffset;

  uint8_t* qs = smem;
  uint8_t* stages = smem + kTileBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffset);
  int* ublk = reinterpret_cast<int*>(full + kStages);
  int* uphys = ublk + kMaxPairs;
  Mask* umask = reinterpret_cast<Mask*>(uphys + kMaxPairs);
  // [0..7] per-warp scratch, [8] union size, [9] the first warpgroup's token slots (bit set),
  // [10] the tile runs solo blocks,
  // [12 .. 12 + kStages) warps done with a stage's block
  int* misc = reinterpret_cast<int*>(umask + kMaxPairs);
  const bool dense = a.topk_idx == nullptr;

  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      misc[12 + i] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }

  // Union of the tile's blocks, and the warpgroups' token slots.
  // Sparse: rank the (block, slot) pairs of the tile's topk_idx entries (scratch: the Q tile's
  // space); a block's slots become its mask.
  if (!dense) {
    int* keys = reinterpret_cast<int*>(qs);
    int* sorted = keys + kMaxPairs;
    const int n = kTileTokens * a.topk;
    int key = INT_MAX;
    if (tid < n) {
      const int slot = tid / a.topk, k = tid - slot * a.topk;
      if (slot < ntok) {
        const int b = a.topk_idx[((tok0 + slot) * a.nkv + kvh) * a.topk + k];
        if (b >= 0 && b <= (pos0 + slot) / kBlock) key = (b << kTokBits) + slot;
      }
    }
    keys[tid] = key;
    consumers_sync();
    int rank = 0;
    for (int j = 0; j < n; ++j) {
      const int kj = keys[j];
      rank += kj < key || (kj == key && j < tid);
    }
    if (tid < n) sorted[rank] = key;
    else sorted[tid] = INT_MAX;
    consumers_sync();
    const int kc = sorted[tid];
    const bool head = kc != INT_MAX && (tid == 0 || (sorted[tid - 1] >> kTokBits) != (kc >> kTokBits));
    const unsigned bal = __ballot_sync(0xffffffffu, head);
    if (lane == 0) misc[warp] = __popc(bal);
    consumers_sync();
    int u = __popc(bal & ((1u << lane) - 1));
    for (int w = 0; w < warp; ++w) u += misc[w];
    pdl_wait();  // the staged copy's table
    if (head) {
      const int b = kc >> kTokBits;
      int mask = 0;
      for (int j = tid; j < n && (sorted[j] >> kTokBits) == b; ++j) mask |= 1 << (sorted[j] & (kTileTokens - 1));
      ublk[u] = b;
      uphys[u] = a.block_tables[int64_t(seq) * a.mbps + b];
      umask[u] = Mask(mask);
    }
    int total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += misc[w];
    consumers_sync();  // union written; misc[0..7] read
    if constexpr (G == 8) {
      // 16 tokens: the consecutive split (the search over the C(16, 8) / 2 splits would cost
      // more than it saves), no solo blocks.
      if (tid == 0) misc[8] = total, misc[9] = 0x00FF, misc[10] = 0;
    } else {
      // The split of the tile's tokens over the two warpgroups with the fewest (warpgroup, block)
      // passes: slot set m (slot 0 in it, 4 slots) for the first warpgroup, the lowest m among the
      // cheapest (the consecutive split, m = 15, wins ties). Warp w tries the sets m = 2 w + 1 + 16 k,
      // its lanes summing over the union's entries.
      int best = INT_MAX;
      for (int m = 2 * warp + 1; m < 256; m += 16) {
        if (__popc(m) != 4) continue;
        int part = 0;
        for (int i = lane; i < total; i += 32) part += ((umask[i] & m) != 0) + ((umask[i] & ~m & 0xFF) != 0);
        best = min(best, __reduce_add_sync(0xffffffffu, part) * 256 + m);
      }
      if (lane == 0) misc[warp] = best;
      consumers_sync();
      if (warp == 0) {
        int m = INT_MAX;
        for (int w = 0; w < kThreads / 32; ++w) m = min(m, misc[w]);
        const int w0 = m == INT_MAX ? 0x0F : (m & 255);
        int solo = 0;
        if (kSolo) {
          // Solo blocks pay off in tiles whose passes mostly serve one token (long prefixes: 8192
          // tokens after 57344 1331 -> 1095 us); where most serve several (8192-token prompts) they
          // only add variance (526-547 us without, 547-682 with), so a tile uses them only when its
          // single-token passes are more than twice its shared ones.
          const int w1 = ~w0 & 0xFF;
          int single = 0, shared = 0;
          for (int i = lane; i < total; i += 32)
            for (int set : {w0, w1}) {
              const int n = __popc(umask[i] & set);
              single += n == 1;
              shared += n > 1;
            }
          solo = __reduce_add_sync(0xffffffffu, single) > 2 * __reduce_add_sync(0xffffffffu, shared);
        }
        if (lane == 0) misc[8] = total, misc[9] = w0, misc[10] = solo;
      }
    }
  } else {
    pdl_wait();  // the staged copy's table
    for (int b = tid; b <= min(last_own, kMaxPairs - 1); b += kThreads)
      uphys[b] = a.block_tables[int64_t(seq) * a.mbps + b];
    if (tid == 0) misc[8] = last_own + 1, misc[9] = kAllSlots >> (kTileTokens / 2);
  }
  __syncthreads();  // union, slot split and barriers ready; the sort's scratch is free again
  const int nu = misc[8];
  const int wg0_slots = misc[9];
  const bool solo_tile = kSolo && misc[10] != 0;
  // Slot at position p (G = 16: warp p of the consumers; G = 8: warp p / 2's rows 8 (p % 2) ..
  // 8 (p % 2) + 7 of each lane): the first warpgroup's slots, then the others.
  auto slot_of = [&](int p) {
    if constexpr (G == 8) return p;  // the consecutive split
    const int set = p < 4 ? wg0_slots : (~wg0_slots & 0xFF);
    int k = p & 3;
    for (int sl = 0; sl < kTileTokens; ++sl)
      if ((set >> sl) & 1) {
        if (k == 0) return sl;
        --k;
      }
    return 0;
  };
  const int last_blk = (seq_len - 1) / kBlock;
  const int tail = seq_len - last_blk * kBlock;  // valid keys of the request's last block
  auto entry = [&](int i, int& b, int& mask) {
    if (dense) {
      b = i;
      mask = 0;
#pragma unroll
      for (int s = 0; s < kTileTokens; ++s)
        if (s < ntok && (pos0 + s) / kBlock >= i) mask |= 1 << s;
    } else {
      b = ublk[i];
      mask = umask[i];
    }
  };

  // Copies of union block i into its stage: two 2-D TMA boxes of K, two of V, on full[stage].
  const int32_t* bt = a.block_tables + int64_t(seq) * a.mbps;
  auto issue = [&](int i) {
    const int st = i % kStages;
    const int phys = i < kMaxPairs ? uphys[i] : bt[i];  // (past kMaxPairs: dense, block i)
    uint8_t* kd = stages + st * kStageBytes;
    const int row = (phys * a.nkv + kvh) * kBlock;
    mbar_expect_tx(&full[st], Geo::kTxBytes);
    tma_load_2d(kd, &tk, 0, row, &full[st]);  // kQ8: the whole fp8 K block (128 rows x 128 B)
    if constexpr (!kQ8) tma_load_2d(kd + kChunk, &tk, 64, row, &full[st]);
    tma_load_2d(kd + kVOff, &tv, 0, row, &full[st]);
    tma_load_2d(kd + kVOff + kChunk, &tv, 64, row, &full[st]);
    if constexpr (kQ8) bulk_copy(kd + kSclOff, a.k_scale + row, kBlock * 4, &full[st]);
    if constexpr (kScl == kScalesStaged) {
      bulk_copy(kd + 2 * kTileBytes, a.k_scale + row, kBlock * 4, &full[st]);
      bulk_copy(kd + 2 * kTileBytes + kBlock * 4, a.v_scale + row, kBlock * 4, &full[st]);
    }
  };
  if (!kFp8 && tid == 0)
    for (int i = 0; i < min(nu, kStages); ++i) issue(i);

  // fp8: block j's bytes and scales, read into registers ahead of the block before it
  // (fp8_load), then converted exactly to bf16 into its stage (fp8_store), V rows and scales past
  // the request's length as zeros. Thread tid takes 16-byte units tid + 256 k of K (k < 4) and
  // of V (k >= 4), and key tid's k scale (tid < 128) or key tid - 128's v scale.
  uint4 xr[8];
  float xs = 0.f;
  auto fp8_load = [&](int j) {
    int b, mask;
    entry(j, b, mask);
    const int phys = j < kMaxPairs ? uphys[j] : bt[j];
    const int64_t row0 = (int64_t(phys) * a.nkv + kvh) * kBlock;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int e = tid + kThreads * (k & 3);
      xr[k] = ldg_stream((k < 4 ? a.k8 : a.v8) + (row0 + (e >> 3)) * kDim + (e & 7) * 16);
    }
    xs = tid < kBlock ? a.k_scale[row0 + tid] : a.v_scale[row0 + tid - kBlock];
  };
  auto fp8_store = [&](int j) {
    int b, mask;
    entry(j, b, mask);
    const int valid = b == last_blk ? tail : kBlock;
    uint8_t* kd = stages + (j % kStages) * kStageBytes;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int e = tid + kThreads * (k & 3), row = e >> 3, c = e & 7;
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (k < 4 || row < valid) {
        const uint4 x = xr[k];
        lo = make_uint4(fp8x2_to_bf16x2(uint16_t(x.x)), fp8x2_to_bf16x2(uint16_t(x.x >> 16)),
                        fp8x2_to_bf16x2(uint16_t(x.y)), fp8x2_to_bf16x2(uint16_t(x.y >> 16)));
        hi = make_uint4(fp8x2_to_bf16x2(uint16_t(x.z)), fp8x2_to_bf16x2(uint16_t(x.z >> 16)),
                        fp8x2_to_bf16x2(uint16_t(x.w)), fp8x2_to_bf16x2(uint16_t(x.w >> 16)));
      }
      uint8_t* tile = kd + (k < 4 ? 0 : kTileBytes);
      *reinterpret_cast<uint4*>(tile + swz(row, 16 * c)) = lo;
      *reinterpret_cast<uint4*>(tile + swz(row, 16 * c + 8)) = hi;
    }
    reinterpret_cast<float*>(kd + 2 * kTileBytes)[tid] = tid >= kBlock && tid - kBlock >= valid ? 0.f : xs;
    fence_proxy_async();
  };

  // kQ8: Q tile as e4m3, 128 rows x 128 B swizzled as an fp8 K-major operand, each row (token,
  // head) scaled by its own amax / 448 (qscl: the 128 rows' scales, after the fp8 tile).
  float* qscl = reinterpret_cast<float*>(qs + kChunk);
  if constexpr (kQ8) {
    // 16 consecutive threads take a row's 16 units of 8 elements (every thread runs every
    // iteration: the row's amax comes by shuffles within the 16).
    for (int e = tid; e < 128 * 16; e += kThreads) {
      const int row = e >> 4, u = e & 15, slot = slot_of(row >> (kTokBits == 3 ? 4 : 3)), h = row & (G - 1);
      float x[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = 0.f;
      if (slot < ntok) {
        const int64_t base = (tok0 + slot) * a.q_stride + int64_t(kvh * G + h) * kDim + u * 8;
        if (a.q_bf16 && a.q_vec) {
          const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + base);
          const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) x[2 * i] = __uint_as_float(ws[i] << 16), x[2 * i + 1] = __uint_as_float(ws[i] & 0xFFFF0000u);
        } else if (!a.q_bf16 && a.q_vec) {
          const float4 x0 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + base);
          const float4 x1 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + base + 4);
          x[0] = x0.x, x[1] = x0.y, x[2] = x0.z, x[3] = x0.w, x[4] = x1.x, x[5] = x1.y, x[6] = x1.z, x[7] = x1.w;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = load_act(a.q, base + i, a.q_bf16);
        }
      }
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float inv = amax > 0.f ? __fdiv_rn(448.f, amax) : 0.f;
      uint32_t c[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        c[i] = __nv_cvt_float2_to_fp8x2(make_float2(x[2 * i] * inv, x[2 * i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
      *reinterpret_cast<uint2*>(qs + row * 128 + (((u >> 1) ^ (row & 7)) << 4) + (u & 1) * 8) =
          make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
      if (u == 0) qscl[row] = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
    }
  }
  // Q tile: row G * (the slot's position) + h, bf16, swizzled; rows of absent tokens are zero.
  for (int e = tid; e < (kQ8 ? 0 : 128 * 16); e += kThreads) {
    const int row = e >> 4, u = e & 15, slot = slot_of(row >> (kTokBits == 3 ? 4 : 3)), h = row & (G - 1);
    uint4 w = make_uint4(0, 0, 0, 0);
    if (slot < ntok) {
      const int64_t base = (tok0 + slot) * a.q_stride + int64_t(kvh * G + h) * kDim + u * 8;
      if (a.q_bf16 && a.q_vec) {
        w = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + base);
      } else if (!a.q_bf16 && a.q_vec) {
        const float4 x0 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + base);
        const float4 x1 = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + base + 4);
        w = make_uint4(pack_bf16x2(x0.x, x0.y), pack_bf16x2(x0.z, x0.w), pack_bf16x2(x1.x, x1.y),
                       pack_bf16x2(x1.z, x1.w));
      } else {
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = load_act(a.q, base + i, a.q_bf16);
        w = make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]), pack_bf16x2(x[4], x[5]),
                       pack_bf16x2(x[6], x[7]));
      }
    }
    *reinterpret_cast<uint4*>(qs + swz(row, u * 8)) = w;
  }
  fence_proxy_async();
  if (kFp8 && nu > 0) {
    fp8_load(0);
    fp8_store(0);
  }
  __syncthreads();  // Q tile ready

  // Consumers. A lane's rows g and g + 8: slots slot and slot1 (G = 16: both the warp's token).
  const int wg = warp >> 2;
  const int slot = G == 16 ? slot_of(warp) : slot_of(2 * warp), slot1 = G == 16 ? slot : slot_of(2 * warp + 1);
  const int wg_slots = wg == 0 ? wg0_slots : (~wg0_slots & kAllSlots);
  const int g = lane >> 2, t4 = lane & 3;
  const int own = (pos0 + slot) / kBlock, lim = (pos0 + slot) - own * kBlock;
  const int own1 = (pos0 + slot1) / kBlock, lim1 = (pos0 + slot1) - own1 * kBlock;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
  const uint32_t qa = smem_u32(qs) + wg * 64 * 128;
  const uint32_t st0 = smem_u32(stages);
  // kQ8: the lane's rows' q scales times the softmax scale (wgmma rows 16 warp + g and + 8).
  float rq0 = 0.f, rq1 = 0.f;
  if constexpr (kQ8) rq0 = qscl[16 * warp + g] * a.scale_log2, rq1 = qscl[16 * warp + g + 8] * a.scale_log2;

  for (int i = 0; i < nu; ++i) {
    int b, mask;
    entry(i, b, mask);
    const int st = i % kStages;
    uint8_t* kd = stages + st * kStageBytes;
    // fp8: the block's k scales, then its v scales (in the stage, or staged in global memory).
    const float* scl = reinterpret_cast<const float*>(kd + kSclOff);
    const float* vscl = scl + kBlock;
    if constexpr (kScl == kScalesGlobal) {
      const int64_t row0 = (int64_t(i < kMaxPairs ? uphys[i] : bt[i]) * a.nkv + kvh) * kBlock;
      scl = a.k_scale + row0;
      vscl = a.v_scale + row0;
    }
    if constexpr (kFp8) {
      if (i + 1 < nu) fp8_load(i + 1);
      __syncthreads();  // block i in its stage; every warp done with block i - 1
    } else {
      mbar_wait(&full[st], (i / kStages) & 1);
    }
    if (!kFp8 && b == last_blk && tail < kBlock) {
      // Zero the V rows past the request's length (both warpgroups, whatever they use).
      consumers_sync();
      for (int e = tid; e < (kBlock - tail) * 16; e += kThreads) {
        const int row = tail + (e >> 4), u = e & 15;
        *reinterpret_cast<uint4*>(kd + kVOff + swz(row, u * 8)) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async();
      consumers_sync();
    }
    const int wbits = mask & wg_slots;
    // bf16: a block that one token of the warpgroup attends to runs on that token's warp alone
    // (mma.sync over the same shared-memory tiles; the accumulator layouts are the same), so
    // the other three warps go on with their own blocks.
    const bool solo = solo_tile && wbits != 0 && (wbits & (wbits - 1)) == 0;
    if (wbits != 0 && (!solo || wbits == (1 << slot))) {
      const uint32_t ka = st0 + st * kStageBytes, va = ka + kVOff;
      float s[64];
      if (solo) {
#pragma unroll
        for (int x = 0; x < 64; ++x) s[x] = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          uint32_t qf[4];
          ldmatrix_x4(qf, qs + swz(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 16 * k + (lane >> 4) * 8));
#pragma unroll
          for (int jp = 0; jp < 8; ++jp) {
            uint32_t bf[4];
            ldmatrix_x4(bf, kd + swz(16 * jp + (lane & 7) + (lane >> 4) * 8, 16 * k + ((lane >> 3) & 1) * 8));
            mma_bf16_4(&s[8 * jp], qf, bf[0], bf[1]);
            mma_bf16_4(&s[8 * jp + 4], qf, bf[2], bf[3]);
          }
        }
      } else {
        // With solo blocks the warps of a warpgroup drift apart; they meet before each wgmma.
        if (solo_tile) asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
        wgmma_fence();
        if constexpr (kQ8) {
          // 4 k32 steps over the 128-byte fp8 rows of Q and K.
#pragma unroll
          for (int k = 0; k < 4; ++k) WgmmaFp8<128>::mma(s, make_desc(qa + k * 32), make_desc(ka + k * 32), k > 0);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const uint32_t off = (k >> 2) * kChunk + (k & 3) * 32;
            wgmma_m64n128k16(s, make_desc(qa + off), make_desc(ka + off), k > 0);
          }
        }
        wgmma_commit();
        wgmma_wait_all();
        fence_acc(s);
      }
      uint32_t pf[8][4];
      // G = 8: a row whose token does not attend to the block gets P = 0 and keeps its state.
      const bool att0 = (mask >> slot) & 1, att1 = G == 16 ? att0 : ((mask >> slot1) & 1) != 0;
      if (att0 || att1) {
        const bool causal = b == own, causal1 = G == 16 ? causal : b == own1;
        float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          // kQ8: the lane's two keys' scales by one 8-byte load from the stage.
          float2 ks2 = make_float2(0.f, 0.f);
          if constexpr (kQ8) ks2 = *reinterpret_cast<const float2*>(scl + 8 * c + 2 * t4);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = 8 * c + 2 * t4 + e;
            const bool ok = G == 16 ? !causal || key <= lim : att0 && (!causal || key <= lim);
            const bool ok1 = G == 16 ? ok : att1 && (!causal1 || key <= lim1);
            float sc0, sc1;
            if constexpr (kQ8) sc0 = (e ? ks2.y : ks2.x) * rq0, sc1 = (e ? ks2.y : ks2.x) * rq1;
            else sc0 = sc1 = kScaled ? scl[key] * a.scale_log2 : a.scale_log2;
            const float v0 = ok ? s[4 * c + e] * sc0 : kNegInf;
            const float v1 = ok1 ? s[4 * c + 2 + e] * sc1 : kNegInf;
            s[4 * c + e] = v0;
            s[4 * c + 2 + e] = v1;
            mx0 = fmaxf(mx0, v0);
            mx1 = fmaxf(mx1, v1);
          }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        // G = 8: a row that has attended to no key yet and skips this block keeps m = -inf; it
        // subtracts 0 instead (alpha = 0 on its zero state, P = 0) rather than -inf - -inf.
        const float z0 = G == 16 || n0 != kNegInf ? n0 : 0.f, z1 = G == 16 || n1 != kNegInf ? n1 : 0.f;
        const float al0 = ex2_approx(m0 - z0), al1 = ex2_approx(m1 - z1);
        m0 = n0, m1 = n1;
        float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
        for (int c = 0; c < 16; ++c) {
          s[4 * c + 0] = ex2_approx(s[4 * c + 0] - z0);
          s[4 * c + 1] = ex2_approx(s[4 * c + 1] - z0);
          s[4 * c + 2] = ex2_approx(s[4 * c + 2] - z1);
          s[4 * c + 3] = ex2_approx(s[4 * c + 3] - z1);
          ls0 += s[4 * c + 0] + s[4 * c + 1];
          ls1 += s[4 * c + 2] + s[4 * c + 3];
          o[4 * c + 0] *= al0;
          o[4 * c + 1] *= al0;
          o[4 * c + 2] *= al1;
          o[4 * c + 3] *= al1;
        }
        l0 = l0 * al0 + ls0;
        l1 = l1 * al1 + ls1;
        if constexpr (kVScaled) {
          // P V with V's scales folded into P (p * v_scale rounded to bf16).
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float2 va0 = *reinterpret_cast<const float2*>(vscl + 16 * j + 2 * t4);
            const float2 va1 = *reinterpret_cast<const float2*>(vscl + 16 * j + 8 + 2 * t4);
            s[8 * j + 0] *= va0.x, s[8 * j + 1] *= va0.y, s[8 * j + 2] *= va0.x, s[8 * j + 3] *= va0.y;
            s[8 * j + 4] *= va1.x, s[8 * j + 5] *= va1.y, s[8 * j + 6] *= va1.x, s[8 * j + 7] *= va1.y;
          }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          pf[j][0] = pack_bf16x2(s[8 * j + 0], s[8 * j + 1]);
          pf[j][1] = pack_bf16x2(s[8 * j + 2], s[8 * j + 3]);
          pf[j][2] = pack_bf16x2(s[8 * j + 4], s[8 * j + 5]);
          pf[j][3] = pack_bf16x2(s[8 * j + 6], s[8 * j + 7]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) pf[j][0] = pf[j][1] = pf[j][2] = pf[j][3] = 0u;
      }
      if (solo) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int dp = 0; dp < 8; ++dp) {
            uint32_t bf[4];
            ldmatrix_x4_trans(bf, kd + kTileBytes +
                                      swz(16 * j + (lane & 7) + ((lane >> 3) & 1) * 8, 16 * dp + (lane >> 4) * 8));
            mma_bf16_4(&o[8 * dp], pf[j], bf[0], bf[1]);
            mma_bf16_4(&o[8 * dp + 4], pf[j], bf[2], bf[3]);
          }
        }
      } else {
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 8; ++j) wgmma_m64n128k16_rs<1>(o, pf[j], smem_desc(va + j * 2048, kChunk, 1024), 1);
        wgmma_commit();
        wgmma_wait_all();
        fence_acc(o);
      }
    }
    if constexpr (kFp8) {
      if (i + 1 < nu) fp8_store(i + 1);
      continue;
    }
    // The last warp done with the stage refills it with block i + kStages.
    __syncwarp();
    if (lane == 0) {
      __threadfence_block();
      if (atomicAdd(&misc[12 + st], 1) == kThreads / 32 - 1) {
        misc[12 + st] = 0;
        if (i + kStages < nu) issue(i + kStages);
      }
    }
  }

  if (slot >= ntok && slot1 >= ntok) return;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int sl = hh ? slot1 : slot;
    if (G == 8 && sl >= ntok) continue;
    const int64_t tok = tok0 + sl;
    const int h = kvh * G + (G == 16 ? g + 8 * hh : g);
    const float inv = hh ? i1 : i0;
    const int64_t base = tok * a.out_stride + int64_t(h) * kDim + 2 * t4;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const float x = o[4 * c + 2 * hh] * inv, y = o[4 * c + 2 * hh + 1] * inv;
      if (a.out_bf16) {
        uint16_t* po = static_cast<uint16_t*>(a.out) + base + 8 * c;
        if (a.out_vec) {
          *reinterpret_cast<uint32_t*>(po) = pack_bf16x2(x, y);
        } else {
          po[0] = f32_to_bf16_bits(x);
          po[1] = f32_to_bf16_bits(y);
        }
      } else {
        float* po = static_cast<float*>(a.out) + base + 8 * c;
        if (a.out_vec) {
          *reinterpret_cast<float2*>(po) = make_float2(x, y);
        } else {
          po[0] = x;
          po[1] = y;
        }
      }
    }
  }
}

// ---- Staged fp8 (AttentionTuning::prefill_fp8_stage): the fp8 blocks the call reads, converted
// exactly to bf16 into the workspace, where the bf16 path reads them through tensor maps.
// Workspace: [table: num_seqs x mbps int32 (the staged copy's block table: -1 not read, else the
// block's slot)][slot counter][K: cap slots x kv heads x 128 rows x 128 bf16][V: the same][k
// scales: cap x kv heads x 128 f32][v scales: the same]. A slot's rows are laid out as a bf16
// cache block's; the v scales past the request's length are zero (as the tile's own fp8 ring
// makes them), so P V reads 0 there. Where cap == entries (every dense call; sparse calls whose
// tokens x kv heads x topk reach the table's size) a block's slot is its table entry: no counter
// and no memset, the conversion kernel writes the whole table (sparse: from the mark kernel's
// bit sets, [request][chunk of 256 tokens][mbps bits], each written whole by its CTA). Otherwise
// (sparse) one memset resets the table and the counter, and the mark kernel writes the slots.
struct StageLayout {
  size_t table = 0, counter = 0, bits = 0, k = 0, v = 0, ks = 0, vs = 0, bytes = 0;
  int64_t entries = 0;  // the table's: requests x max blocks a request
  int64_t cap = 0;      // slots
  int chunks = 0;  // sparse: chunks of 256 tokens a request (the mark kernels' grid y)
  int words = 0;   // the bit sets' 32-bit words a chunk
  bool direct() const { return cap == entries; }
};

StageLayout stage_layout(const ops::AttentionParams& p) {
  auto up = [](size_t x) { return (x + 1023) / 1024 * 1024; };
  StageLayout l;
  l.entries = int64_t(p.batch.num_seqs) * p.batch.max_blocks_per_seq;
  // Slots: every (request, block) the call reads at most once; sparse, at most one a selection.
  l.cap = l.entries;
  if (p.topk_idx) l.cap = std::min<int64_t>(l.cap, p.batch.num_tokens * p.num_kv_heads * p.topk);
  const size_t rows = size_t(l.cap) * size_t(p.num_kv_heads) * kBlock;
  l.counter = up(size_t(l.entries) * 4);
  l.bits = up(l.counter + 4);
  size_t bits = 0;
  if (p.topk_idx) {
    const int64_t qmax = p.batch.max_query_len > 0 ? p.batch.max_query_len : p.batch.num_tokens;
    l.chunks = int((qmax + 255) / 256);
  }
  if (p.topk_idx && l.direct()) {
    l.words = (p.batch.max_blocks_per_seq + 31) / 32;
    bits = size_t(p.batch.num_seqs) * size_t(l.chunks) * size_t(l.words) * 4;
  }
  l.k = up(l.bits + bits);
  l.v = l.k + rows * kDim * 2;
  l.ks = l.v + rows * kDim * 2;
  l.vs = l.ks + rows * 4;
  l.bytes = l.vs + rows * 4;
  return l;
}

// The blocks token i (of the request's qlen at q0) selects that the tiles keep (0 <= block <= the
// token's own block): f(block) for each, in topk_idx order.
template <class F>
__device__ __forceinline__ void for_each_kept_block(const PfArgs& a, int seq, int q0, int qlen, int i, F&& f) {
  const int own = (a.seq_lens[seq] - qlen + i) / kBlock;
  const int32_t* sel = a.topk_idx + (int64_t(q0) + i) * a.nkv * a.topk;
  for (int k = 0; k < a.nkv * a.topk; ++k) {
    const int b = sel[k];
    if (b >= 0 && b <= own) f(b);
  }
}

// Sparse, slots from the counter (cap < entries): gives each block the call's tokens select
// (those the tiles keep: 0 <= block <= the token's own block) its slot in the table, which the
// host reset to -1 (and the counter to -1, one memset): the first thread to claim the entry (-1
// -> -2) takes the next slot from the counter and writes it (the conversion kernel, launched
// after this one, reads only slots). The L2 load before the claim keeps the atomics to about one
// an entry. Grid: x = request, y = chunks of 256 tokens.
__global__ void __launch_bounds__(256) stage_mark_kernel(PfArgs a, int32_t* table, int32_t* counter) {
  const int seq = blockIdx.x;
  const int q0 = a.qsl[seq], qlen = a.qsl[seq + 1] - q0;
  const int i = int(blockIdx.y) * 256 + int(threadIdx.x);
  if (i >= qlen) return;
  for_each_kept_block(a, seq, q0, qlen, i, [&](int b) {
    int32_t* t = table + int64_t(seq) * a.mbps + b;
    if (__ldcg(t) == -1 && atomicCAS(t, -1, -2) == -1) *t = atomicAdd(counter, 1) + 1;
  });
}

// Sparse, slot = entry (cap == entries): the blocks a chunk of 256 tokens selects (0 <= block <=
// the token's own block), as a bit set over the request's blocks built in shared memory and
// written whole (zeros too: no reset needed) to bits[request][chunk]. Grid: x = request, y =
// chunk; dynamic shared memory: words x 4 bytes.
__global__ void __launch_bounds__(256) stage_mark_bits_kernel(PfArgs a, uint32_t* bits, int words) {
  extern __shared__ uint32_t set[];
  const int seq = blockIdx.x;
  const int q0 = a.qsl[seq], qlen = a.qsl[seq + 1] - q0;
  const int i = int(blockIdx.y) * 256 + int(threadIdx.x);
  for (int w = threadIdx.x; w < words; w += 256) set[w] = 0;
  __syncthreads();
  if (i < qlen) for_each_kept_block(a, seq, q0, qlen, i, [&](int b) { atomicOr(&set[b >> 5], 1u << (b & 31)); });
  __syncthreads();
  uint32_t* out = bits + (int64_t(seq) * gridDim.y + blockIdx.y) * words;
  for (int w = threadIdx.x; w < words; w += 256) out[w] = set[w];
}

// Two packed e4m3 times a scale, rounded to bf16x2: the fp32 product is the CPU reference's K or
// V element (fp8 * scale), so the copy differs from it by one bf16 rounding.
__device__ __forceinline__ uint32_t fp8x2_scaled_bf16x2(uint16_t v, float s) {
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3)));
  return pack_bf16x2(f.x * s, f.y * s);
}

// What the conversion kernel writes (AttentionTuning::prefill_fp8_stage_fold).
enum StageMode : int {
  kStageExact = 0,   // K and V exactly as bf16, their scales beside them
  kStageFolded = 1,  // K as bf16(k * k_scale), V as bf16(v * v_scale); no scales
  kStageK8 = 2,      // K as it is (fp8, 128 B a row) with its k scales, V as bf16(v * v_scale)
};

// 16 fp8 bytes (one 16-byte unit of a row) as 16 bf16, exactly or times a scale.
__device__ __forceinline__ void fp8x16_to_bf16(const uint4 x, bool scaled, float sc, uint4& lo, uint4& hi) {
  if (scaled) {
    lo = make_uint4(fp8x2_scaled_bf16x2(uint16_t(x.x), sc), fp8x2_scaled_bf16x2(uint16_t(x.x >> 16), sc),
                    fp8x2_scaled_bf16x2(uint16_t(x.y), sc), fp8x2_scaled_bf16x2(uint16_t(x.y >> 16), sc));
    hi = make_uint4(fp8x2_scaled_bf16x2(uint16_t(x.z), sc), fp8x2_scaled_bf16x2(uint16_t(x.z >> 16), sc),
                    fp8x2_scaled_bf16x2(uint16_t(x.w), sc), fp8x2_scaled_bf16x2(uint16_t(x.w >> 16), sc));
  } else {
    lo = make_uint4(fp8x2_to_bf16x2(uint16_t(x.x)), fp8x2_to_bf16x2(uint16_t(x.x >> 16)),
                    fp8x2_to_bf16x2(uint16_t(x.y)), fp8x2_to_bf16x2(uint16_t(x.y >> 16)));
    hi = make_uint4(fp8x2_to_bf16x2(uint16_t(x.z)), fp8x2_to_bf16x2(uint16_t(x.z >> 16)),
                    fp8x2_to_bf16x2(uint16_t(x.w)), fp8x2_to_bf16x2(uint16_t(x.w >> 16)));
  }
}

// The conversion's grid: a CTA of kStageThreads converts kStageRows rows of K and of V of one
// (request, block, kv head), so a one-request 8192-token call (64 blocks, one kv head) runs 512
// CTAs, ~4 an SM on 132 SMs, each thread with its K and V loads (16 bytes each) in flight at once.
constexpr int kStageThreads = 128;
constexpr int kStageRows = kStageThreads / 8;  // 8 threads a row: 16 bytes of fp8 each
constexpr int kStageParts = kBlock / kStageRows;

// Which blocks the conversion kernel converts, and where their slots come from.
enum StageSelect : int {
  kStageDense = 0,     // every block up to the request's length; slot = entry, table written here
  kStageBits = 1,      // sparse: blocks in the mark kernel's bit sets; slot = entry, table written here
  kStageCounter = 2,   // sparse: the slots the mark kernel wrote into the table
};

// One (request, block, kv head, kStageRows rows) a CTA (grid x = entry * kStageParts + part, y =
// kv head): if the call reads the block (StageSelect; where the slot is the entry, the (part 0,
// head 0) CTA writes the table: the entry, or -1 for a block not read), converts its rows of K and V (kStageExact: e4m3 -> bf16 exactly, and copies their
// scales, v scales past the length 0; kStageFolded: each row times its scale, rounded to bf16;
// kStageK8: K's bytes and k scales as they are, V folded). V rows past the request's length are
// zeros in every mode. The tiles may be launched behind it with programmatic dependent launch:
// it lets them become resident at once (their griddepcontrol.wait holds them until this grid has
// completed and its stores are visible).
__global__ void __launch_bounds__(kStageThreads)
    stage_convert_kernel(PfArgs a, int32_t* table, const uint32_t* bits, int chunks, int words, uint16_t* k16,
                         uint16_t* v16, float* ks, float* vs, int select, int mode) {
  pdl_trigger();
  const int64_t e = blockIdx.x / kStageParts;
  const int part = int(blockIdx.x % kStageParts), h = int(blockIdx.y);
  const int seq = int(e / a.mbps), b = int(e % a.mbps);
  const int seq_len = a.seq_lens[seq];
  const int last = (seq_len - 1) / kBlock;
  bool in = seq_len > 0 && b <= last;
  if (select == kStageBits) {
    // Any of the request's chunks selected the block (the bit sets of chunks past the request's
    // tokens are zeros). Uniform per CTA: every thread reaches the barrier.
    bool hit = false;
    if (in)
      for (int y = threadIdx.x; y < chunks; y += kStageThreads)
        hit |= (bits[(int64_t(seq) * chunks + y) * words + (b >> 5)] >> (b & 31)) & 1u;
    in = __syncthreads_or(hit) != 0;
  }
  if (select != kStageCounter && part == 0 && h == 0 && threadIdx.x == 0) table[e] = in ? int32_t(e) : -1;
  if (!in) return;
  // kStageCounter: the table holds slots only (the mark kernel has completed), so every thread
  // reads it.
  const int slot = select == kStageCounter ? table[e] : int(e);
  if (slot < 0) return;
  const int valid = b == last ? seq_len - last * kBlock : kBlock;
  const int phys = a.block_tables[e];
  const int64_t src = (int64_t(phys) * a.nkv + h) * kBlock, dst = (int64_t(slot) * a.nkv + h) * kBlock;
  const int row = part * kStageRows + int(threadIdx.x >> 3), c = int(threadIdx.x & 7);
  const bool v_in = row < valid;
  // Both loads (and the scales) first: each thread has its 32 bytes in flight together.
  const uint4 xk = ldg_stream(a.k8 + (src + row) * kDim + c * 16);
  uint4 xv = make_uint4(0, 0, 0, 0);
  if (v_in) xv = ldg_stream(a.v8 + (src + row) * kDim + c * 16);
  const float sk = a.k_scale[src + row];
  const float sv = v_in ? a.v_scale[src + row] : 0.f;
  if (mode == kStageK8) {
    *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(k16) + (dst + row) * kDim + c * 16) = xk;
  } else {
    // K rows past the length keep their (possibly NaN) products: S masks those keys by selection.
    uint4 lo, hi;
    fp8x16_to_bf16(xk, mode != kStageExact, sk, lo, hi);
    uint4* d = reinterpret_cast<uint4*>(k16 + (dst + row) * kDim + c * 16);
    d[0] = lo;
    d[1] = hi;
  }
  {
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (v_in) fp8x16_to_bf16(xv, mode != kStageExact, sv, lo, hi);
    uint4* d = reinterpret_cast<uint4*>(v16 + (dst + row) * kDim + c * 16);
    d[0] = lo;
    d[1] = hi;
  }
  if (mode != kStageFolded && c == 0) ks[dst + row] = sk;
  if (mode == kStageExact && c == 1) vs[dst + row] = sv;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// [num_blocks * kv_heads * 128 rows, 128 dims] bf16, boxes of 128 rows x 64 dims, 128-byte swizzle.
bool cache_map(CUtensorMap* map, const void* base, int64_t rows) {
  auto fn = encode_fn();
  if (!fn || reinterpret_cast<uintptr_t>(base) % 16) return false;
  const cuuint64_t dims[2] = {cuuint64_t(kDim), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kDim) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(kBlock)};
  const cuuint32_t estr[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A kernel instance's template arguments, as a value for the launcher.
template <int G, bool F, bool S, int C = kNoScales>
struct PfKernel {
  static constexpr int kG = G, kScl = C;
  static constexpr bool kFp8 = F, kSolo = S;
};

}  // namespace

bool prefill_attention_supported(const ops::AttentionParams& p) {
  const bool fp8 = p.kv.dtype == DType::FP8_E4M3;
  if (fp8 ? !p.kv.k_scale || !p.kv.v_scale : p.kv.dtype != DType::BF16) return false;
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  const int group = p.num_q_heads / p.num_kv_heads;
  return (group == 16 || group == 8) && p.head_dim == kDim && p.kv.head_dim == kDim &&
         p.kv.block_size == kBlock && (p.q_dtype == DType::BF16 || p.q_dtype == DType::F32) &&
         (p.out_dtype == DType::BF16 || p.out_dtype == DType::F32) &&
         (!p.topk_idx || (p.topk > 0 && tile_tokens(group) * p.topk <= kMaxPairs)) &&
         (fp8 || encode_fn() != nullptr);
}

bool use_prefill_attention(const ops::AttentionParams& p) {
  const int forced = tuning().attention.prefill_tiles;
  if (forced == 0 || !prefill_attention_supported(p)) return false;
  if (forced > 0) return true;
  // Batches with a prompt chunk of at least 8 tokens and at least 512 new tokens in all.
  return p.batch.max_query_len >= kRuleMinChunk && p.batch.num_tokens >= 512;
}

bool run_attention_prefill(const ops::AttentionParams& p, void* stream_v) {
  if (!prefill_attention_supported(p)) return false;
  if (p.batch.num_tokens == 0 || p.batch.num_seqs == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  PfArgs a{};
  fill_attention_args(a, p);
  {
    const size_t esz = a.q_bf16 ? 2 : 4;
    a.q_vec = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && (p.q_stride * esz) % 16 == 0;
  }
  {
    const size_t esz = a.out_bf16 ? 2 : 4;
    a.out_vec = reinterpret_cast<uintptr_t>(p.out) % (2 * esz) == 0 && p.out_stride % 2 == 0;
  }
  const int group = p.num_q_heads / p.num_kv_heads;
  const AttentionTuning& tu = tuning().attention;
  CUtensorMap tk{}, tv{};
  const bool fp8 = p.kv.dtype == DType::FP8_E4M3;
  // Staged fp8: the copy's size is bounded from the call's shapes alone (graph-safe); calls whose
  // bound passes prefill_fp8_stage_max_mib (long contexts of many requests) convert in the tiles.
  const StageLayout stage = fp8 ? stage_layout(p) : StageLayout{};
  const bool staged = fp8 && tu.prefill_fp8_stage >= (p.topk_idx ? 2 : 1) && p.batch.max_blocks_per_seq > 0 &&
                      encode_fn() != nullptr &&
                      stage.bytes <= (size_t(std::max(tu.prefill_fp8_stage_max_mib, 0)) << 20);
  // S on fp8 tensor cores: K stays fp8 in the copy, V folded (the same tile path otherwise).
  const bool qk = staged && tu.prefill_fp8_qk == 1;
  // Folded scales: the copy is a plain bf16 cache, and the tiles take the bf16 path over it.
  const bool fold = staged && !qk && tu.prefill_fp8_stage_fold == 1;
  if (fp8) {
    a.k8 = static_cast<const uint8_t*>(p.kv.k);
    a.v8 = static_cast<const uint8_t*>(p.kv.v);
    a.k_scale = p.kv.k_scale;
    a.v_scale = p.kv.v_scale;
  }
  // The tiles behind the staging by programmatic dependent launch (not on the legacy default
  // stream, as everywhere here): they become resident as the conversion's CTAs leave the SMs and
  // run their prologue (barriers, the tile's bounds, sparse: its selections and their union)
  // until griddepcontrol.wait, before the first read of the copy's table.
  const bool tiles_pdl = staged && tu.prefill_fp8_stage_pdl == 1 && stream != nullptr;
  if (staged) {
    uint8_t* ws = static_cast<uint8_t*>(workspace(stream, stage.bytes));
    int32_t* table = reinterpret_cast<int32_t*>(ws + stage.table);
    int32_t* counter = reinterpret_cast<int32_t*>(ws + stage.counter);
    // Dense: the conversion kernel writes the whole table (slot = entry), one launch in all.
    // Sparse with slot = entry: the mark kernel's bit sets, then the conversion (which writes
    // the table). Sparse with the counter: one memset (the table and the counter to -1: they are
    // adjacent), the mark kernel (slots into the table), the conversion.
    uint32_t* bits = reinterpret_cast<uint32_t*>(ws + stage.bits);
    const int select = !p.topk_idx ? kStageDense : stage.direct() ? kStageBits : kStageCounter;
    if (select == kStageBits) {
      const dim3 g(unsigned(p.batch.num_seqs), unsigned(stage.chunks));
      const size_t smem = size_t(stage.words) * 4;
      if (smem > 48 * 1024) set_smem(stage_mark_bits_kernel, smem);
      stage_mark_bits_kernel<<<g, 256, smem, stream>>>(a, bits, stage.words);
      SIEVE_LAUNCH_CHECK("prefill fp8 stage mark launch");
    } else if (select == kStageCounter) {
      cuda_check(cudaMemsetAsync(ws + stage.table, 0xFF, stage.counter + 4, stream), "prefill fp8 stage table");
      const dim3 g(unsigned(p.batch.num_seqs), unsigned(stage.chunks));
      stage_mark_kernel<<<g, 256, 0, stream>>>(a, table, counter);
      SIEVE_LAUNCH_CHECK("prefill fp8 stage mark launch");
    }
    const dim3 cg(unsigned(stage.entries * kStageParts), unsigned(p.num_kv_heads));
    stage_convert_kernel<<<cg, kStageThreads, 0, stream>>>(
        a, table, bits, stage.chunks, stage.words, reinterpret_cast<uint16_t*>(ws + stage.k),
        reinterpret_cast<uint16_t*>(ws + stage.v), reinterpret_cast<float*>(ws + stage.ks),
        reinterpret_cast<float*>(ws + stage.vs), select, qk ? kStageK8 : fold ? kStageFolded : kStageExact);
    SIEVE_LAUNCH_CHECK("prefill fp8 stage convert launch");
    // The staging's own time (bench only): the tiles are not run and the output is not written.
    if (tu.prefill_fp8_stage_only == 1) return true;
    a.block_tables = table;
    a.k_scale = reinterpret_cast<const float*>(ws + stage.ks);
    a.v_scale = reinterpret_cast<const float*>(ws + stage.vs);
    const int64_t rows = stage.cap * p.num_kv_heads * kBlock;
    if (qk) tk = fp8_tensor_map(ws + stage.k, rows, kDim, kDim, kBlock);  // boxes of a whole fp8 block
    if ((!qk && !cache_map(&tk, ws + stage.k, rows)) || !cache_map(&tv, ws + stage.v, rows))
      throw Error("prefill attention: tensor maps over the staged fp8 blocks");
  } else if (!fp8) {
    const int64_t rows = p.kv.num_blocks * p.num_kv_heads * kBlock;
    if (!cache_map(&tk, p.kv.k, rows) || !cache_map(&tv, p.kv.v, rows)) return false;
  }
  auto launch = [&](auto kernel_tag) {
    constexpr int G = decltype(kernel_tag)::kG, kScl = decltype(kernel_tag)::kScl;
    constexpr bool kFp8 = decltype(kernel_tag)::kFp8, kSolo = decltype(kernel_tag)::kSolo;
    constexpr int kTile = tile_tokens(G);
    constexpr size_t smem = PfGeo<kFp8 || kScl == kScalesStaged, G == 16 ? 1 : 2, kScl == kQkFp8>::kSmemBytes;
    const dim3 grid(unsigned((p.batch.num_tokens + kTile - 1) / kTile + p.batch.num_seqs), unsigned(p.num_kv_heads));
    set_smem(prefill_attention_kernel<G, kFp8, kSolo, kScl>, smem);
    launch_pdl(tiles_pdl, prefill_attention_kernel<G, kFp8, kSolo, kScl>, grid, dim3(kThreads), smem, stream,
               "prefill attention launch", a, tk, tv);
  };
  // Solo blocks: bf16 (or a folded fp8 copy) and sparse only (in a dense tile a block has one
  // token of a warpgroup only at the warpgroup's last token's block edge), 16 heads a token only.
  const bool solo = tu.prefill_solo && p.topk_idx && (!fp8 || fold);
  const bool scales_staged = tu.prefill_fp8_stage_scales == 1;
  auto launch_group = [&](auto group_tag) {
    constexpr int G = decltype(group_tag)::value;
    if (qk) launch(PfKernel<G, false, false, kQkFp8>{});
    else if (staged && !fold && scales_staged) launch(PfKernel<G, false, false, kScalesStaged>{});
    else if (staged && !fold) launch(PfKernel<G, false, false, kScalesGlobal>{});
    else if (fp8 && !fold) launch(PfKernel<G, true, false>{});
    else if constexpr (G == 16) solo ? launch(PfKernel<G, false, true>{}) : launch(PfKernel<G, false, false>{});
    else launch(PfKernel<G, false, false>{});
  };
  if (group == 16) launch_group(std::integral_constant<int, 16>{});
  else launch_group(std::integral_constant<int, 8>{});
  SIEVE_LAUNCH_CHECK("prefill attention launch");
  return true;
}

}  // namespace sieve::cuda
