// Paged GQA attention, block-sparse (topk_idx) or dense (ops::AttentionParams).
//
// Work: one "row" per (query token, kv head). A row's units (sparse: its topk entries; dense:
// its key blocks 0..n_blk-1) are split over S CTAs. The S CTAs of a row form thread-block
// clusters of C CTAs (C <= 8), G = S / C clusters per row:
//  - each CTA has 4 consumer warps and 1 producer warp. The producer reads the unit list
//    (topk entries -> block table) 32 at a time and streams each unit's K block, then its V
//    block (fp8: + the 128 per-token scales), with bulk copies (cp.async.bulk) into a ring of
//    shared-memory slots, one mbarrier pair (full / empty) per slot. Copies start as soon as
//    the block table entries arrive; the ring keeps up to 6 (fp8, 16.5 KB) or 3 (bf16, 32 KB)
//    K/V halves in flight per CTA, two CTAs per SM. The kv group's Q rows come first, by one
//    bulk copy into shared memory (q_bulk), or by per-thread loads.
//  - consumer warp w takes keys 32w..32w+31 of every block: S = Q K^T with mma.sync m16n8k16
//    (the 16 q heads of the kv group are the 16 rows, so each K/V byte serves all heads),
//    base-2 online softmax, O += P V. K/V fragments come from shared memory; the reduction dims
//    of S are permuted so that each lane reads 16-byte runs (Q uses the same permutation) and
//    the output dims of P V are permuted (mma column n of n-tile j is dim 16 n + j) so that
//    each lane's V elements of a key are one run; with bf16 KV lanes alternate the order of
//    their runs so that the reads of a warp spread over all banks (fp8: see the consumers).
//  - the consumer warps merge in shared memory; the C CTAs of a cluster merge through distributed
//    shared memory (each CTA finishes 16 / C of the rows), with no global round trip. Only
//    when G > 1 (few rows, long contexts) do clusters write partials to global memory, and the
//    last CTA of the row to arrive (an atomic counter that it returns to zero) merges them.
// The unit list ends with a sentinel the producer posts in the next slot, so consumers never
// need the row's valid-unit count. S, C, G and the stage count come from shapes only (topk,
// num_tokens, batch.max_seq_len), so the grid is CUDA-graph safe.
// Precision: bf16 KV -> bf16 MMA (Q rounded to bf16); fp8 KV -> Q K^T in f16 (keys convert
// exactly; Q rounded to f16), k_scale applied to the fp32 scores; P V in f16 with V converted
// exactly and P * v_scale * 2^-k rounded to f16 (k per warp and row, see p_scale_exponent).
// Softmax and accumulation in fp32.
//
// Files: decode.cuh (geometry, arguments), merge.cuh (the merges across CTAs), this file (the
// kernel), planner.cu (the grid from shapes only, and the launch).
#include <cooperative_groups.h>

#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/attention/decode.cuh"
#include "kernels/cuda/attention/merge.cuh"
#include "kernels/cuda/common.cuh"

namespace sieve::cuda::attn {

namespace {

// Trace point i of this CTA (AttentionTuning::trace; `tr` is null otherwise).
#define SIEVE_TRACE(i) \
  if (tr) tr[i] = global_ns()

__device__ __forceinline__ uint32_t word_of(const uint4& u, int i) {
  return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// Request of token t: decode batches (one token per request) hit the first guess.
__device__ __forceinline__ int find_seq(const int32_t* qsl, int num_seqs, int t) {
  const int g = min(t, num_seqs - 1);
  if (qsl[g] <= t && t < qsl[g + 1]) return g;
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (qsl[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// fp8 P V scale exponent of a row for one block: b (>= 0) is the block's largest p * v_scale,
// lim the smallest exponent that keeps the earlier (rescaled) terms at or below 2^15. Returns kn
// with b * 2^-kn in [2^14, 2^15) unless lim is larger; never below -120 (b = 0: no new terms).
__device__ __forceinline__ float p_scale_exponent(float b, float lim) {
  const int e = int((__float_as_uint(b) >> 23) & 0xffu);
  const float kb = e > 0 ? float(e - 141) : kNegInf;
  return fmaxf(fmaxf(kb, lim), -120.f);
}

// Slot ring: the K (half 0) and V (half 1) copies of unit vi. With two consumer groups the ring
// is split in two halves, one per group (group vi % 2), so that each slot only ever passes
// between the producer and one group. A group then waits on a slot's full barrier only after
// it has consumed that slot's previous fill itself; were the two groups to share a slot, the
// faster group could wait on phase u + 1 while phase u (the other group's fill) is still open,
// and the parity wait, which tells only two phases apart, would let it through early.
struct SlotUse {
  int slot;
  uint32_t use;  // how many earlier fills the slot had
};
template <int kGroups>
__device__ __forceinline__ SlotUse slot_of(int vi, int half, int stages) {
  const int per_group = stages / kGroups;
  const int local = 2 * (vi / kGroups) + half;
  return {(vi % kGroups) * per_group + local % per_group, uint32_t(local / per_group)};
}

// The producer warp: the CTA's units (sparse: its top-k entries, 32 at a time, then their
// block-table entries; dense: its key blocks) as bulk copies of each unit's K, then V (fp8: and
// their scales) into the slot ring, then one sentinel per consumer group.
template <bool kFp8, int kGroups>
__device__ __forceinline__ void produce(const AttnArgs& a, uint8_t* smem, uint64_t* full, uint64_t* empty, int* blk_ring,
                                        const int32_t* sel, int s, int s_guess, int kvh, int e_begin, int e_end,
                                        int n_blk, int n_old, int bt_first, int b_first, int lane,
                                        unsigned long long* tr) {
  using G = Geo<kFp8>;
  const int NS = a.stages;
  // ---- Producer: unit list -> bulk copies into the slot ring.
  int vi = 0;
  // K/V (and scale) copies: with an L2 evict-first policy when each block is read by one row
  // (a.l2_first), so the stream does not push out what the grid and the next kernels read
  // again (metadata, Q, the merge records); docs/kernels.md.
  const uint64_t pol = a.l2_first ? l2_policy_evict_first() : 0;
  auto copy = [&](void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    bulk_copy_policy(dst, src, bytes, bar, a.l2_first, pol);
  };
  auto acquire = [&](int unit, int half) {
    const SlotUse u = slot_of<kGroups>(unit, half, NS);
    if (u.use > 0) mbar_wait(&empty[u.slot], (u.use - 1) & 1u);
    return u.slot;
  };
  // Unit u = block bj at physical block pj: its K, then its V copy.
  auto issue = [&](int u, int bj, int64_t pj) {
    if (bj >= n_old) pdl_wait();
    const int64_t base = pj * a.nkv + kvh;  // (block, kv head) index
    int slot = acquire(u, 0);
    blk_ring[u % kRing] = bj;
    uint8_t* dst = smem + size_t(slot) * G::kSlotBytes;
    mbar_expect_tx(&full[slot], G::kSlotBytes);
    copy(dst, a.k + base * G::kDataBytes, G::kDataBytes, &full[slot]);
    if constexpr (kFp8) copy(dst + G::kDataBytes, a.k_scale + base * kBlock, G::kScaleBytes, &full[slot]);
    slot = acquire(u, 1);
    dst = smem + size_t(slot) * G::kSlotBytes;
    mbar_expect_tx(&full[slot], G::kSlotBytes);
    copy(dst, a.v + base * G::kDataBytes, G::kDataBytes, &full[slot]);
    if constexpr (kFp8) copy(dst + G::kDataBytes, a.v_scale + base * kBlock, G::kScaleBytes, &full[slot]);
  };
  for (int e0 = e_begin; e0 < e_end; e0 += 32) {
    const int e = e0 + lane;
    int b = -1;
    int64_t phys = 0;
    if (e < e_end) {
      b = !sel ? e : e0 == e_begin ? b_first : __ldg(sel + e);
      if (b < 0 || b >= n_blk) b = -1;
      else if (!sel && e0 == e_begin && s == s_guess) phys = bt_first;
      else phys = __ldg(a.block_tables + int64_t(s) * a.mbps + b);
    }
    uint32_t valid = __ballot_sync(0xffffffffu, b >= 0);
    while (valid) {
      const int j = __ffs(valid) - 1;
      valid &= valid - 1;
      const int bj = __shfl_sync(0xffffffffu, b, j);
      const int64_t pj = __shfl_sync(0xffffffffu, phys, j);
      if (lane == 0) issue(vi, bj, pj);
      ++vi;
      __syncwarp();
    }
  }
  // Sentinels: the K slots of units vi and vi + 1 (one per consumer group) complete without
  // data and carry id -1.
  pdl_wait();
  if (lane == 0) SIEVE_TRACE(2);
  if (lane == 0) {
    for (int k = 0; k < kGroups; ++k) {
      const int slot = acquire(vi + k, 0);
      blk_ring[(vi + k) % kRing] = -1;
      mbar_arrive(&full[slot]);
    }
  }
  __syncwarp();
}

// A consumer warp: for each unit of its group (until the sentinel), S = Q K^T over its 32 keys,
// the base-2 online softmax (running maxima m, sums l; fp8: P's scale exponents kc) and O += P V.
template <bool kFp8, int kGroups>
__device__ __forceinline__ void consume(const AttnArgs& a, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                        const int* blk_ring, const uint32_t (&qa)[8][4], int pos, int warp, int lane,
                                        int g, int q, float (&o)[16][4], float& m0, float& m1, float& l0, float& l1,
                                        float& kc0, float& kc1, unsigned long long* tr) {
  using G = Geo<kFp8>;
  const int NS = a.stages;
  // ---- Consumers.
  constexpr int kKV = kFp8 ? 2 : 4;  // 16-byte runs per K row and lane
  constexpr int kVV = kFp8 ? 1 : 2;  // 16-byte runs per V row and lane
  // bf16: lanes of odd keys read a K row's 16-byte runs in the other order (conflict-free), and
  // select them back. fp8 reads them in order: a 2-way conflict on 8 loads a block costs less
  // than the 32 selects (the fp8 loop is bound by its instruction chains, not shared memory).
  const int flip = kFp8 ? 0 : g & 1;
  const int vflip = kFp8 ? 0 : (g >> 2) & 1;
  // Group gr takes units gr, gr + 2, ...; warp wg of the group keys 32 wg..32 wg + 31.
  const int gr = warp / kGroupWarps, wg = warp % kGroupWarps;
  for (int vi = gr;; vi += kGroups) {
    const SlotUse uK = slot_of<kGroups>(vi, 0, NS);
    const int sK = uK.slot;
    mbar_wait(&full[sK], uK.use & 1u);
    if (vi == 0 && threadIdx.x == 0) SIEVE_TRACE(3);
    const int b = blk_ring[vi % kRing];
    if (b < 0) break;
    const int key0 = b * kBlock + wg * 32;  // this warp's first key
    const bool active = key0 <= pos;
    const uint8_t* ks = smem + size_t(sK) * G::kSlotBytes + size_t(wg) * 32 * G::kRowBytes;
    float sacc[4][4];
    float2 ksc[4];
    if (active) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint4 kr[kKV];
        const uint8_t* row = ks + (nt * 8 + g) * G::kRowBytes;
#pragma unroll
        for (int i = 0; i < kKV; ++i) kr[i] = *reinterpret_cast<const uint4*>(row + (i ^ flip) * 64 + q * 16);
#pragma unroll
        for (int i = 0; i < kKV; i += 2) {
          const uint4 x0 = kr[i], x1 = kr[i + 1];
          kr[i] = flip ? x1 : x0;
          kr[i + 1] = flip ? x0 : x1;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) sacc[nt][j] = 0.f;
#pragma unroll
        for (int st = 0; st < 8; ++st) {
          if constexpr (kFp8) {
            const uint32_t w = word_of(kr[st / 4], st % 4);
            mma_f16(sacc[nt], qa[st], fp8x2_to_f16x2(uint16_t(w & 0xffff)), fp8x2_to_f16x2(uint16_t(w >> 16)));
          } else {
            mma_bf16(sacc[nt], qa[st], word_of(kr[st / 2], (st % 2) * 2), word_of(kr[st / 2], (st % 2) * 2 + 1));
          }
        }
        if constexpr (kFp8) {
          const float* sc = reinterpret_cast<const float*>(smem + size_t(sK) * G::kSlotBytes + G::kDataBytes);
          ksc[nt] = *reinterpret_cast<const float2*>(sc + wg * 32 + nt * 8 + 2 * q);
        }
      }
    }
    mbar_arrive(&empty[sK]);  // each thread releases its own reads of the slot

    const SlotUse uV = slot_of<kGroups>(vi, 1, NS);
    const int sV = uV.slot;
    mbar_wait(&full[sV], uV.use & 1u);
    if (active) {
      const uint8_t* vs = smem + size_t(sV) * G::kSlotBytes;
      // Every key of this warp is at or before the query (warp-uniform): no masking.
      const bool full_keys = key0 + 31 <= pos;
      // Scale, mask, online softmax (base 2).
      float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float f = a.scale_log2;
          if constexpr (kFp8) f *= (j ? ksc[nt].y : ksc[nt].x);
          sacc[nt][j] *= f;
          sacc[nt][2 + j] *= f;
        }
      }
      if (!full_keys) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            if (key0 + nt * 8 + 2 * q + j > pos) sacc[nt][j] = sacc[nt][2 + j] = kNegInf;
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        mx0 = fmaxf(mx0, fmaxf(sacc[nt][0], sacc[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(sacc[nt][2], sacc[nt][3]));
      }
      quad_max2(mx0, mx1);
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
      const float mu0 = mn0 == kNegInf ? 0.f : mn0, mu1 = mn1 == kNegInf ? 0.f : mn1;
      float p[4][4], ls0 = 0.f, ls1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          p[nt][j] = ex2_approx(sacc[nt][j] - mu0);
          p[nt][2 + j] = ex2_approx(sacc[nt][2 + j] - mu1);
          ls0 += p[nt][j];
          ls1 += p[nt][2 + j];
        }
      const float al0 = m0 - mu0, al1 = m1 - mu1;  // log2 of the factor that brings O and l to the new maxima
      const float la0 = ex2_approx(al0), la1 = ex2_approx(al1);
      l0 = l0 * la0 + ls0, l1 = l1 * la1 + ls1;
      float oa0 = la0, oa1 = la1;  // O's factor (fp8: with the change of P scale exponent)
      uint32_t pa[2][4];
      if constexpr (kFp8) {
        // P V in f16: P' = p * v_scale * 2^-kn, with kn per row chosen so that the block's
        // largest P' lies in [2^14, 2^15) (f16 keeps 29 binades of normal numbers below it)
        // unless an earlier block's terms, brought to the new maximum, are larger: then kn
        // keeps those at or below 2^15 (the scale never makes a stored term grow). O holds
        // O_true * 2^-kc; the merge multiplies by 2^kc.
        const float* vsc = reinterpret_cast<const float*>(vs + G::kDataBytes) + wg * 32;
        float b0 = 0.f, b1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          float2 vv = *reinterpret_cast<const float2*>(vsc + nt * 8 + 2 * q);
          if (!full_keys) {
            if (key0 + nt * 8 + 2 * q > pos) vv.x = 0.f;
            if (key0 + nt * 8 + 2 * q + 1 > pos) vv.y = 0.f;
          }
          p[nt][0] *= vv.x, p[nt][2] *= vv.x;
          p[nt][1] *= vv.y, p[nt][3] *= vv.y;
          b0 = fmaxf(b0, fmaxf(p[nt][0], p[nt][1]));
          b1 = fmaxf(b1, fmaxf(p[nt][2], p[nt][3]));
        }
        quad_max2(b0, b1);
        const float kn0 = p_scale_exponent(b0, kc0 + al0), kn1 = p_scale_exponent(b1, kc1 + al1);
        oa0 = ex2_approx(al0 + kc0 - kn0), oa1 = ex2_approx(al1 + kc1 - kn1);
        kc0 = kn0, kc1 = kn1;
        const float ps0 = ex2_approx(-kn0), ps1 = ex2_approx(-kn1);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          pa[nt / 2][(nt % 2) * 2 + 0] = pack_f16x2(p[nt][0] * ps0, p[nt][1] * ps0);
          pa[nt / 2][(nt % 2) * 2 + 1] = pack_f16x2(p[nt][2] * ps1, p[nt][3] * ps1);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          // n-tile nt holds keys 8 nt..: k-step nt / 2, low (even nt) or high (odd nt) k half.
          pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p[nt][0], p[nt][1]);
          pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p[nt][2], p[nt][3]);
        }
      }
      m0 = mn0, m1 = mn1;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[j][0] *= oa0, o[j][1] *= oa0;
        o[j][2] *= oa1, o[j][3] *= oa1;
      }
      // ---- O += P V over two k-steps of 16 keys; 16 n-tiles of 8 (permuted) dims.
      const uint8_t* vw = vs + size_t(wg) * 32 * G::kRowBytes;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // V rows of this lane: keys 16 i + 8 jj + 2 q + kk, dims g*16..+15.
        uint4 vr[2][2][kVV];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            const int kr = 16 * i + 8 * jj + 2 * q + kk;
            const uint8_t* row = vw + kr * G::kRowBytes;
            if constexpr (kFp8) {
              vr[jj][kk][0] = *reinterpret_cast<const uint4*>(row + g * 16);
            } else {
              const uint4 x0 = *reinterpret_cast<const uint4*>(row + g * 32 + vflip * 16);
              const uint4 x1 = *reinterpret_cast<const uint4*>(row + g * 32 + (vflip ^ 1) * 16);
              vr[jj][kk][0] = vflip ? x1 : x0;
              vr[jj][kk][1] = vflip ? x0 : x1;
            }
          }
        // Keys past the query (the tail of its own block) may hold anything, NaN included:
        // their probabilities are 0, so zero their V rows too.
        if (!full_keys) {
#pragma unroll
          for (int jj = 0; jj < 2; ++jj)
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
              if (key0 + 16 * i + 8 * jj + 2 * q + kk > pos)
#pragma unroll
                for (int u = 0; u < kVV; ++u) vr[jj][kk][u] = make_uint4(0, 0, 0, 0);
        }
        // P's A fragment for k-step i: a0/a1 = keys 16i + 2q.. (rows g, g+8), a2/a3 = 16i + 8 + 2q..
        const uint32_t af[4] = {pa[i][0], pa[i][1], pa[i][2], pa[i][3]};
#pragma unroll
        for (int nt = 0; nt < 16; ++nt) {
          uint32_t bb[2];
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            if constexpr (kFp8) {
              // Bytes nt % 4 of the two keys' words: one permute serves n-tiles nt and nt ^ 1.
              const uint32_t wa = word_of(vr[jj][0][0], nt / 4);
              const uint32_t wb = word_of(vr[jj][1][0], nt / 4);
              const uint32_t pr = __byte_perm(wa, wb, (nt % 4) < 2 ? 0x5140 : 0x7362);
              bb[jj] = fp8x2_to_f16x2(uint16_t((nt & 1) ? pr >> 16 : pr));
            } else {
              const uint32_t wa = word_of(vr[jj][0][nt / 8], (nt % 8) / 2);
              const uint32_t wb = word_of(vr[jj][1][nt / 8], (nt % 8) / 2);
              bb[jj] = __byte_perm(wa, wb, (nt % 2) ? 0x7632 : 0x5410);
            }
          }
          if constexpr (kFp8) mma_f16(o[nt], af, bb[0], bb[1]);
          else mma_bf16(o[nt], af, bb[0], bb[1]);
        }
      }
    }
    mbar_arrive(&empty[sV]);
  }
}

template <bool kFp8, int kGroups>
__global__ void __launch_bounds__(threads_of<kGroups>(), kGroups == 1 ? 2 : 1) attention_kernel(AttnArgs a) {
  constexpr int kConsumers = kGroupWarps * kGroups;
  constexpr int kThreads = threads_of<kGroups>();
  using G = Geo<kFp8>;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages], qbar;
  __shared__ int blk_ring[kRing];
  __shared__ float m_s[kConsumers][16], l_s[kConsumers][16];
  __shared__ bool took_s[kConsumers];  // consumer warp w took at least one unit
  __shared__ float cm_s[16], cl_s[16];  // the CTA's (max, sum) per row (read by the cluster)
  __shared__ int is_last;

  const int S = a.splits, NS = a.stages;
  unsigned long long* tr =
      a.trace ? a.trace + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kTraceSlots : nullptr;
  if (threadIdx.x == 0) SIEVE_TRACE(0);
  if (tr && threadIdx.x == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    tr[kTracePoints] = sm + 1;
  }
  pdl_trigger();
  const int t = blockIdx.x / S, split = blockIdx.x % S, kvh = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kGroupWarps * 32);  // every consumer thread of a group releases
    }
    mbar_init(&qbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // Everything below depends on t only or on one round of loads: the request is guessed as
  // t's own index (right for decode batches) and its bounds, length and the producer's first 32
  // unit ids (sparse) are all read at once; the block table entries follow, then the copies.
  // PDL (common.cuh): the metadata loads are issued before the wait; the unit ids (the
  // indexer's output), Q and every write after it; the producer of a dense row copies blocks
  // that hold only tokens before the request's first new token before it waits.
  const bool is_producer = warp == kConsumers;
  const int32_t* sel = a.topk_idx ? a.topk_idx + (int64_t(t) * a.nkv + kvh) * a.topk : nullptr;
  const int e_begin = split * a.per_split;
  const int q_begin = __ldg(a.qsl), q_end = __ldg(a.qsl + a.num_seqs);
  int s = min(t, a.num_seqs - 1);
  int qs0 = __ldg(a.qsl + s), qs1 = __ldg(a.qsl + s + 1), slen = __ldg(a.seq_lens + s);
  // Dense: the block-table entries of the CTA's first 32 units (of the guessed request) in the
  // same round of loads, not after it (no kernel before this one writes block tables, so before
  // pdl_wait). Sparse rows need the unit ids first; prefetching the row's first 256 entries
  // there measured slower (docs/performance.md).
  const int s_guess = s;
  int bt_first = 0;
  if (is_producer && !sel && e_begin + lane < a.mbps)
    bt_first = __ldg(a.block_tables + int64_t(s) * a.mbps + e_begin + lane);
  if (!is_producer || sel) pdl_wait();
  // Q by one bulk copy (q_bulk), issued before anything that needs the metadata: it is served
  // ahead of every K/V copy of the grid, and no Q loads share the SM's load path with the
  // producer's metadata and block-table loads (docs/performance.md).
  const size_t q_esz = a.q_bf16 ? 2 : 4;
  const uint8_t* q_s = smem + q_offset<kFp8>(NS);
  if (a.q_bulk && threadIdx.x == 0)
    bulk_load(const_cast<uint8_t*>(q_s),
              static_cast<const uint8_t*>(a.q) + (t * a.q_stride + int64_t(kvh) * a.gqa * kDim) * q_esz,
              uint32_t(a.gqa * kDim * q_esz), &qbar);
  // bf16 KV: the Q rows (bf16, vector loads) are issued here, before the request metadata, so
  // they are in flight before this CTA's (and most other CTAs') K/V copies. Issued after them
  // (as the fp8 kernels still do), they were served behind the copies under load, and no
  // consumer starts without Q: b32 ctx9216 traces put the first K block's use at 7.6 us after
  // the start, 4.0 with the early loads (docs/performance.md). The fp8 kernels measured slower
  // with the same change (their loop ran longer although Q arrived earlier), so they keep the
  // loads after the prologue.
  uint2 qraw[8][2];
  constexpr bool kQEarly = !kFp8;
  if (kQEarly && !is_producer && a.q_vec && a.q_bf16 && !a.q_bulk) {
    const int h0 = kvh * a.gqa + g, h1 = h0 + 8;
    const uint16_t* qp = static_cast<const uint16_t*>(a.q);
    const int64_t r0 = t * a.q_stride + int64_t(h0) * kDim, r1 = t * a.q_stride + int64_t(h1) * kDim;
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const int d = dbase<kFp8>(st, q);
      qraw[st][0] = g < a.gqa ? __ldg(reinterpret_cast<const uint2*>(qp + r0 + d)) : make_uint2(0, 0);
      qraw[st][1] = g + 8 < a.gqa ? __ldg(reinterpret_cast<const uint2*>(qp + r1 + d)) : make_uint2(0, 0);
    }
  }
  int b_first = -1;
  if (is_producer && sel && e_begin + lane < min(a.topk, e_begin + a.per_split)) b_first = __ldg(sel + e_begin + lane);
  // The CTA barrier that publishes the mbarrier initialisation. With the early Q loads it comes
  // before any loaded value is used: a consumer warp's wait for its metadata also waited for its
  // Q loads (they share scoreboards), which held the producer's first copies back by ~1 us.
  if constexpr (kQEarly) __syncthreads();
  // Tokens outside [query_start_loc[0], query_start_loc[num_seqs]) are not written (as on CPU).
  // The whole cluster shares t, so it leaves together.
  if (t < q_begin || t >= q_end) {
    pdl_wait();
    if (a.q_bulk && threadIdx.x == 0) mbar_wait(&qbar, 0);  // no copy into a CTA that has left
    return;
  }
  if (!(qs0 <= t && t < qs1)) {
    s = find_seq(a.qsl, a.num_seqs, t);
    qs0 = a.qsl[s], qs1 = a.qsl[s + 1], slen = a.seq_lens[s];
  }
  const int pos = slen - (qs1 - qs0) + (t - qs0);
  const int n_blk = pos / kBlock + 1;
  const int n_old = (slen - (qs1 - qs0)) / kBlock;  // blocks of tokens before the first new one
  const int e_end = min(sel ? a.topk : n_blk, e_begin + a.per_split);
  if (threadIdx.x == 0) SIEVE_TRACE(1);
  if constexpr (!kQEarly) __syncthreads();

  // Q fragments: rows g, g + 8 = heads of this kv group.
  uint32_t qa[8][4];
  if (!is_producer) {
    const int h0 = kvh * a.gqa + g, h1 = h0 + 8;
    const bool ok0 = g < a.gqa, ok1 = g + 8 < a.gqa;
    const int64_t r0 = t * a.q_stride + int64_t(h0) * kDim, r1 = t * a.q_stride + int64_t(h1) * kDim;
    if (a.q_bulk) mbar_wait(&qbar, 0);
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const int d = dbase<kFp8>(st, q);
      float x0[4] = {0.f, 0.f, 0.f, 0.f}, x1[4] = {0.f, 0.f, 0.f, 0.f};
      if (a.q_bulk) {
        // Rows g and g + 8 of the kv group in shared memory (the same layout as in global memory).
        if (a.q_bf16) {
          const uint16_t* qs = reinterpret_cast<const uint16_t*>(q_s);
          unpack_bf16x4(ok0 ? *reinterpret_cast<const uint2*>(qs + g * kDim + d) : make_uint2(0, 0), x0);
          unpack_bf16x4(ok1 ? *reinterpret_cast<const uint2*>(qs + (g + 8) * kDim + d) : make_uint2(0, 0), x1);
        } else {
          const float* qs = reinterpret_cast<const float*>(q_s);
          unpack_f32x4(ok0 ? *reinterpret_cast<const float4*>(qs + g * kDim + d) : make_float4(0.f, 0.f, 0.f, 0.f), x0);
          unpack_f32x4(ok1 ? *reinterpret_cast<const float4*>(qs + (g + 8) * kDim + d) : make_float4(0.f, 0.f, 0.f, 0.f), x1);
        }
      } else if (a.q_vec) {
        if (a.q_bf16) {
          uint2 u0 = make_uint2(0, 0), u1 = make_uint2(0, 0);
          if constexpr (kQEarly) {
            u0 = qraw[st][0], u1 = qraw[st][1];
          } else {
            const uint16_t* qp = static_cast<const uint16_t*>(a.q);
            if (ok0) u0 = __ldg(reinterpret_cast<const uint2*>(qp + r0 + d));
            if (ok1) u1 = __ldg(reinterpret_cast<const uint2*>(qp + r1 + d));
          }
          unpack_bf16x4(u0, x0);
          unpack_bf16x4(u1, x1);
        } else {
          const float* qp = static_cast<const float*>(a.q);
          float4 f0 = make_float4(0.f, 0.f, 0.f, 0.f), f1 = f0;
          if (ok0) f0 = __ldg(reinterpret_cast<const float4*>(qp + r0 + d));
          if (ok1) f1 = __ldg(reinterpret_cast<const float4*>(qp + r1 + d));
          unpack_f32x4(f0, x0);
          unpack_f32x4(f1, x1);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x0[i] = ok0 ? load_act(a.q, r0 + d + i, a.q_bf16) : 0.f;
          x1[i] = ok1 ? load_act(a.q, r1 + d + i, a.q_bf16) : 0.f;
        }
      }
      if constexpr (kFp8) {
        qa[st][0] = pack_f16x2(x0[0], x0[1]);
        qa[st][1] = pack_f16x2(x1[0], x1[1]);
        qa[st][2] = pack_f16x2(x0[2], x0[3]);
        qa[st][3] = pack_f16x2(x1[2], x1[3]);
      } else {
        qa[st][0] = pack_bf16x2(x0[0], x0[1]);
        qa[st][1] = pack_bf16x2(x1[0], x1[1]);
        qa[st][2] = pack_bf16x2(x0[2], x0[3]);
        qa[st][3] = pack_bf16x2(x1[2], x1[3]);
      }
    }
  }

  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.f, l1 = 0.f;
  float kc0 = 0.f, kc1 = 0.f;  // fp8: O holds O_true * 2^-kc (per row; see the P V step)

  if (is_producer) {
    produce<kFp8, kGroups>(a, smem, full, empty, blk_ring, sel, s, s_guess, kvh, e_begin, e_end, n_blk, n_old, bt_first,
                           b_first, lane, tr);
  } else {
    consume<kFp8, kGroups>(a, smem, full, empty, blk_ring, qa, pos, warp, lane, g, q, o, m0, m1, l0, l1, kc0, kc1, tr);
  }

  // ---- Merge the consumer warps. Row maxima and sums go to their own arrays at once; after one
  // barrier (the slot ring is then free: every copy was consumed) each warp's O, scaled to the
  // CTA's row maxima, goes to the ring's space in its fragment layout ([warp][n-tile][lane] of
  // float4: conflict-free 16-byte accesses); warps that took no unit are skipped. The CTA's O
  // is kept in a row layout skewed by one word per 32 dims so that the fragment-order writes
  // spread over all banks.
  if (threadIdx.x == 0) SIEVE_TRACE(4);
  float4* o_s = reinterpret_cast<float4*>(smem);               // [kConsumers][16][32]
  float* co_s = reinterpret_cast<float*>(smem + kWarpOBytes);  // [16][kCoStride]
  if (warp < kConsumers) {
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    if (q == 0) {
      m_s[warp][g] = m0, m_s[warp][g + 8] = m1;
      l_s[warp][g] = l0, l_s[warp][g + 8] = l1;
    }
    const bool took = __any_sync(0xffffffffu, m0 != kNegInf || m1 != kNegInf);
    if (lane == 0) took_s[warp] = took;
  }
  __syncthreads();
  if (warp < kConsumers) {
    if (took_s[warp]) {
      float M0 = kNegInf, M1 = kNegInf;
#pragma unroll
      for (int w = 0; w < kConsumers; ++w) M0 = fmaxf(M0, m_s[w][g]), M1 = fmaxf(M1, m_s[w][g + 8]);
      // fp8: O holds O_true * 2^-kc.
      const float f0 = exp2f(m0 - (M0 == kNegInf ? 0.f : M0) + kc0), f1 = exp2f(m1 - (M1 == kNegInf ? 0.f : M1) + kc1);
      float4* ow = o_s + warp * 16 * 32 + lane;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) ow[nt * 32] = make_float4(o[nt][0] * f0, o[nt][1] * f0, o[nt][2] * f1, o[nt][3] * f1);
    }
  } else if (lane < 16) {
    const int r = lane;
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) M = fmaxf(M, m_s[w][r]);
    const float Mu = M == kNegInf ? 0.f : M;
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < kConsumers; ++w) L += l_s[w][r] * exp2f(m_s[w][r] - Mu);
    cm_s[r] = M, cl_s[r] = L;
  }
  __syncthreads();
  if (warp < kConsumers) {
    // Warp w sums n-tiles w * kPer.. of every lane's fragment over the warps.
    constexpr int kPer = 16 / kConsumers;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int nt = warp * kPer + k;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kConsumers; ++w) {
        if (!took_s[w]) continue;
        const float4 x = o_s[(w * 16 + nt) * 32 + lane];
        acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w;
      }
      // Element j of n-tile nt: row g (+ 8 for j >= 2), dim (2 q + j % 2) * 16 + nt.
      co_s[co_index(g, 2 * q * 16 + nt)] = acc.x;
      co_s[co_index(g, (2 * q + 1) * 16 + nt)] = acc.y;
      co_s[co_index(g + 8, 2 * q * 16 + nt)] = acc.z;
      co_s[co_index(g + 8, (2 * q + 1) * 16 + nt)] = acc.w;
    }
  }

  // ---- Merge the cluster's CTAs through distributed shared memory: CTA `rank` finishes rows
  // rank, rank + C, ...
  cg::cluster_group cluster = cg::this_cluster();
  const int C = a.cluster, rank = C > 1 ? int(cluster.block_rank()) : 0;
  if (threadIdx.x == 0) SIEVE_TRACE(5);
  // C > 1: the barrier's wait is in cluster_merge (after the flagged merge's first record loads).
  if (C > 1) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  else __syncthreads();
  if (C == 1 && threadIdx.x == 0) SIEVE_TRACE(6);
  const int grp = split / C;
  const int64_t row_id = int64_t(t) * a.nkv + kvh;
  // This CTA's outputs: rows rank, rank + C, ...; as many dims a thread as it takes for one pass.
  // Clusters of 2 with 4 dims a thread (batch 32 on the H200, 16 q heads) get their own
  // instantiation: with C at run time the merge computed the addresses of 8 ranks' arrays and
  // ran all 8 ranks' loads and exponentials under predicates, ~570 instructions a warp in all
  // (Nsight Compute, docs/performance.md).
  const MergeAt at{t, kvh, C, rank, row_id * a.groups + grp, row_id, grp};
  const int my_rows = (a.gqa - rank + C - 1) / C;
  if (C == 2 && my_rows * kDim > 2 * kThreads) cluster_merge<4, kThreads, 2>(a, cluster, at, my_rows, cm_s, cl_s, co_s, tr);
  else if (my_rows * kDim <= kThreads) cluster_merge<1, kThreads, 0>(a, cluster, at, my_rows, cm_s, cl_s, co_s, tr);
  else if (my_rows * kDim <= 2 * kThreads) cluster_merge<2, kThreads, 0>(a, cluster, at, my_rows, cm_s, cl_s, co_s, tr);
  else cluster_merge<4, kThreads, 0>(a, cluster, at, my_rows, cm_s, cl_s, co_s, tr);
  // No CTA leaves while another still reads its shared memory: every thread arrived (relaxed)
  // in cluster_merge once its remote reads were complete; this CTA's global stores (the
  // partials) are published by the fence below, not by this barrier.
  if (C > 1) asm volatile("barrier.cluster.wait;\n" ::: "memory");
  if (threadIdx.x == 0) SIEVE_TRACE(7);
  if (a.groups == 1 || a.ll) return;

  // ---- Several clusters per row: the last CTA of the row to finish merges their partials (no
  // second launch; the counter returns to zero for the next call, so graph replays need no
  // memset).
  // One thread fences for the CTA after the barrier (as a grid-wide sync does): the release
  // fence is cumulative over the writes the barrier ordered before it; the last CTA's acquire
  // fence pairs with the others' through the counter.
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_gpu();
    int32_t* ctr = a.counters + row_id;
    is_last = atomicAdd(ctr, 1) == S - 1;
    if (is_last) {
      *ctr = 0;
      fence_acq_rel_gpu();
    }
  }
  __syncthreads();
  if (!is_last) return;
  merge_row_partials(a, t, kvh, row_id);
  if (threadIdx.x == 0) SIEVE_TRACE(8);
}

#undef SIEVE_TRACE

// How many clusters of `cluster` CTAs of this kernel the device runs at once (cached).
template <bool kFp8, int kGroups>
int max_active_clusters_of(int cluster, int stages) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({cluster, stages});
  if (it != cache.end()) return it->second;
  const int n = resident_clusters(attention_kernel<kFp8, kGroups>, threads_of<kGroups>(), smem_bytes<kFp8>(stages),
                                  cluster, 64, 0);
  cache[{cluster, stages}] = n;
  return n;
}

template <bool kFp8, int kGroups>
void launch_of(const AttnArgs& a, int64_t tokens, int nkv, cudaStream_t stream) {
  const size_t smem = smem_bytes<kFp8>(a.stages);
  set_smem(attention_kernel<kFp8, kGroups>, smem);
  ClusterLaunch l(dim3(unsigned(int64_t(a.splits) * tokens), unsigned(nkv), 1), dim3(threads_of<kGroups>(), 1, 1),
                  smem, stream, a.cluster);
  if (pdl_enabled(kPdlAttention, tokens, a.topk_idx == nullptr)) l.allow_programmatic_serialization();
  cuda_check(cudaLaunchKernelEx(&l.cfg, attention_kernel<kFp8, kGroups>, a), "attention launch");
}

}  // namespace

int max_active_clusters(bool fp8, int groups, int cluster, int stages) {
  if (fp8) return groups == 2 ? max_active_clusters_of<true, 2>(cluster, stages) : max_active_clusters_of<true, 1>(cluster, stages);
  return groups == 2 ? max_active_clusters_of<false, 2>(cluster, stages) : max_active_clusters_of<false, 1>(cluster, stages);
}

void launch(const AttnArgs& a, bool fp8, int64_t tokens, int nkv, cudaStream_t stream) {
  if (fp8) {
    if (a.cgroups == 2) launch_of<true, 2>(a, tokens, nkv, stream);
    else launch_of<true, 1>(a, tokens, nkv, stream);
  } else {
    if (a.cgroups == 2) launch_of<false, 2>(a, tokens, nkv, stream);
    else launch_of<false, 1>(a, tokens, nkv, stream);
  }
}

}  // namespace sieve::cuda::attn
