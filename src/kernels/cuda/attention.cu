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
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kGroupWarps = 4;  // warps of a consumer group (32 keys each)
// Consumer groups (kGroups, a template parameter: 1 or 2) take alternate units; a CTA has
// kGroups * 4 consumer warps and one producer warp.
template <int kGroups>
constexpr int threads_of() {
  return (kGroupWarps * kGroups + 1) * 32;
}
constexpr int kMaxConsumers = 2 * kGroupWarps;
constexpr int kMaxSplits = 128;
constexpr int kMaxCluster = 8;
constexpr int kMaxStages = 12;
constexpr int kRing = 16;  // unit ids in flight between producer and consumers (>= stages / 2 + 1)
constexpr int kCoStride = kDim + 4;
__host__ __device__ constexpr int co_index(int r, int d) { return r * kCoStride + d + (d >> 5); }
// Shared memory for the merges (reusing the slot ring after the loop): the 4 warps' O, then
// the CTA's O (at a fixed offset: other CTAs of the cluster read it).
constexpr size_t kWarpOBytes = size_t(kMaxConsumers) * 64 * 32 * 4;
constexpr size_t kMergeBytes = kWarpOBytes + size_t(16) * kCoStride * 4;
// The Q rows of one kv group (up to 16 heads, f32 at most), after the slot ring and the merge space.
constexpr size_t kQBytes = size_t(16) * kDim * 4;

template <bool kFp8>
struct Geo {
  static constexpr int kRowBytes = kFp8 ? kDim : kDim * 2;
  static constexpr int kDataBytes = kBlock * kRowBytes;
  static constexpr int kScaleBytes = kFp8 ? kBlock * 4 : 0;
  static constexpr int kSlotBytes = kDataBytes + kScaleBytes;
  // Slots per CTA: ~200 KB with one CTA per SM (two consumer groups), ~100 KB with two.
  static constexpr int kMaxSlots2 = kFp8 ? 12 : 6;
  static constexpr int kMaxSlots1 = kFp8 ? 6 : 3;
};
// Offset of the Q rows in dynamic shared memory: past the slot ring and the merge space.
template <bool kFp8>
__host__ __device__ constexpr size_t q_offset(int stages) {
  const size_t ring = size_t(stages) * Geo<kFp8>::kSlotBytes;
  return ((ring > kMergeBytes ? ring : kMergeBytes) + 127) / 128 * 128;
}

struct AttnArgs {
  const void* q;
  bool q_bf16;
  bool q_vec;  // q and q_stride allow 8-byte (bf16) / 16-byte (f32) loads of 4 elements
  bool q_bulk;  // a kv group's Q rows come by one bulk copy into shared memory (16-byte aligned rows)
  int64_t q_stride;
  void* out;
  bool out_bf16;
  int64_t out_stride;
  bool out_vec;  // out and out_stride allow 16-byte (f32) / 8-byte (bf16) stores
  int nkv, gqa;
  float scale_log2;  // sm_scale * log2(e)
  const uint8_t* k;
  const uint8_t* v;
  const float* k_scale;
  const float* v_scale;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps, num_seqs;
  const int32_t* topk_idx;
  int topk;
  int splits, cluster, groups, per_split, stages;
  int cgroups;  // consumer groups of the launched kernel (host side)
  float* part_o;      // [rows, groups, 16, 128]
  float* part_ml;     // [rows, groups, 16, 2]
  int32_t* counters;  // [rows], zero between calls
  // Flagged merge (ll): partials go to `ll_buf` as flagged records that the row's first cluster
  // waits for, instead of through part_o / part_ml and the last-CTA counter (see cluster_merge).
  bool ll;
  uint4* ll_buf;  // [rows][groups - 1][16][kDim / kN] records of kLLChunks x 16 bytes, zero between calls
  bool l2_first;  // K/V copies with an L2 evict-first policy (one query row a request)
  unsigned long long* trace;  // optional (AttentionTuning::trace): [grid CTAs][kTraceSlots] timestamps, SM id + 1
};

constexpr int kTracePoints = 9;
constexpr int kTraceSlots = kTracePoints + 1;  // the last slot: the CTA's SM id + 1

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

// Output dims d4..d4+3 of q head `head` of token t (bf16 or f32; vector stores when aligned).
__device__ __forceinline__ void store_out4(const AttnArgs& a, int t, int head, int d4, float x0, float x1, float x2,
                                           float x3) {
  const int64_t oi = t * a.out_stride + int64_t(head) * kDim + d4;
  if (a.out_vec && a.out_bf16) {
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.out) + oi) = make_uint2(pack_bf16x2(x0, x1), pack_bf16x2(x2, x3));
  } else if (a.out_vec) {
    *reinterpret_cast<float4*>(static_cast<float*>(a.out) + oi) = make_float4(x0, x1, x2, x3);
  } else {
    const float o4[4] = {x0, x1, x2, x3};
    for (int i = 0; i < 4; ++i) {
      if (a.out_bf16) static_cast<uint16_t*>(a.out)[oi + i] = f32_to_bf16_bits(o4[i]);
      else static_cast<float*>(a.out)[oi + i] = o4[i];
    }
  }
}

// Output dims d0..d0+kN-1 of q head `head` of token t.
template <int kN>
__device__ __forceinline__ void store_out(const AttnArgs& a, int t, int head, int d0, const float (&x)[kN]) {
  if constexpr (kN == 4) {
    store_out4(a, t, head, d0, x[0], x[1], x[2], x[3]);
  } else {
    const int64_t oi = t * a.out_stride + int64_t(head) * kDim + d0;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (a.out_bf16) static_cast<uint16_t*>(a.out)[oi + i] = f32_to_bf16_bits(x[i]);
      else static_cast<float*>(a.out)[oi + i] = x[i];
    }
  }
}

struct MergeAt {
  int t, kvh, C, rank;
  int64_t part_row;  // (row, cluster group) index of the partials (groups > 1)
  int64_t row;       // (token, kv head) row
  int grp;           // this CTA's cluster group of the row
};

// Flagged records (the flagged merge): a cluster group's partial of kN dims of one q head, with
// its (max, sum), as 16-byte chunks {value, flag, value, flag}. A reader accepts a chunk when both
// of its flags are set: each 8-byte half is written and read whole, so a set flag comes with its
// own value. The reader returns the chunks to zero, so every call starts from zeros (the buffer
// is private to this kernel) and no epoch is needed.
constexpr int kLLChunks = 3;  // up to 4 values + max + sum
constexpr uint32_t kLLFlag = 1;
__device__ __forceinline__ void ll_store(uint4* p, float x, float y) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(__float_as_uint(x)), "r"(kLLFlag),
               "r"(__float_as_uint(y)), "r"(kLLFlag)
               : "memory");
}
__device__ __forceinline__ uint4 ll_load(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ bool ll_ready(const uint4& x) { return x.y == kLLFlag && x.w == kLLFlag; }
// Waits until every chunk x[u][c] (u < n) holds its record: each round reloads, all at once, the
// chunks not there yet (chunk by chunk, a late record cost a memory round trip for each of its
// chunks loaded before it arrived). rec(u) is the address of record u.
template <int kU, int kC, class Rec>
__device__ __forceinline__ void ll_wait(uint4 (&x)[kU][kC], int n, Rec rec) {
  for (;;) {
    bool all = true;
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int c = 0; c < kC; ++c)
        if (u < n && !ll_ready(x[u][c])) all = false;
    if (all) return;
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int c = 0; c < kC; ++c)
        if (u < n && !ll_ready(x[u][c])) x[u][c] = ll_load(rec(u) + c);
  }
}
__device__ __forceinline__ void ll_clear(uint4* p) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"l"(p), "r"(0u) : "memory");
}
// Record of (row, cluster group grp >= 1, q head r, dims d0..d0+kN-1).
template <int kN>
__device__ __forceinline__ uint4* ll_record(const AttnArgs& a, int64_t row, int grp, int r, int d0) {
  const int64_t rec = ((row * (a.groups - 1) + (grp - 1)) * 16 + r) * (kDim / kN) + d0 / kN;
  return a.ll_buf + rec * kLLChunks;
}

// A thread's arrival on the cluster barrier that lets the cluster's CTAs exit: relaxed (it
// orders nothing; the thread's remote reads are complete, their values used). The kernel waits
// on it last. The halves in cluster_merge are not `.aligned`; every warp reaches them together
// (merge tasks go to whole warps), and a build with `.aligned` halves measured the same.
__device__ __forceinline__ void cluster_arrive_exit() {
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
// The wait half of the cluster barrier that publishes the CTAs' merge inputs (the kernel arrives
// with release semantics before cluster_merge); thread 0 then records trace point 6.
__device__ __forceinline__ void cluster_wait_inputs(unsigned long long* tr) {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
  if (tr && threadIdx.x == 0) tr[6] = global_ns();
}

// Merge of the cluster's CTAs through distributed shared memory, for rows rank, rank + C, ...:
// a thread takes kN consecutive dims of one row and issues the loads of every CTA's (max, sum,
// values) at once; it writes the output (one cluster a row) or the cluster's partial. kC: the
// cluster size when known at compile time (2: batch 32 on the H200), else 0 (at.C, up to 8).
// With C > 1 the kernel has arrived on the barrier that publishes the merge inputs; each thread
// waits on it here: when the merge takes one pass, after the flagged merge's first record loads
// are issued (they do not depend on the cluster), so that their round trip overlaps the
// barrier's; else at the top. Then every thread arrives once on the exit barrier
// (cluster_arrive_exit): in one pass as soon as its remote values are used, so that the wait at
// the kernel's end (after the output, the records or the partial are stored, and after the
// flagged merge's wait for the other cluster) finds every CTA of the cluster arrived; else after
// the loop.
template <int kN, int kThreads, int kC>
__device__ __forceinline__ void cluster_merge(const AttnArgs& a, cg::cluster_group& cluster, const MergeAt& at,
                                              int my_rows, const float* cm_s, const float* cl_s, const float* co_s,
                                              unsigned long long* tr) {
  constexpr int kPer = kDim / kN;
  constexpr int kCs = kC ? kC : kMaxCluster;  // the loops' trip count
  const int C = kC ? kC : at.C;
  const bool one_pass = my_rows * kPer <= kThreads;
  if (C > 1 && !(one_pass && threadIdx.x < my_rows * kPer)) {
    cluster_wait_inputs(tr);
    if (one_pass) cluster_arrive_exit();  // no remote reads
  }
  for (int idx = threadIdx.x; idx < my_rows * kPer; idx += kThreads) {
    const int r = at.rank + (idx / kPer) * C, d0 = (idx % kPer) * kN;
    const int ci = co_index(r, d0);  // the kN dims are consecutive words (within one 32-dim run)
    // Flagged merge, the first cluster group: the first kBatch groups' records are loaded before
    // this cluster's own values (they do not depend on them), so that their round trip overlaps
    // the distributed shared memory loads; a chunk not there yet is loaded again below.
    constexpr int kChunks = (kN + 3) / 2;  // chunks that hold kN values, the max and the sum
    constexpr int kBatch = kChunks == 3 ? 2 : 4;
    uint4 x[kBatch][kChunks];
    // The records of groups g0 .. g0 + kBatch - 1 (those that exist), all loads at once.
    auto load_batch = [&](int g0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          if (g0 + u < a.groups) x[u][c] = ll_load(ll_record<kN>(a, at.row, g0 + u, r, d0) + c);
    };
    if (a.ll && at.grp == 0) load_batch(1);
    if (C > 1 && one_pass) cluster_wait_inputs(tr);
    float mc[kCs], lc[kCs], oc[kCs][kN];
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      mc[c] = kNegInf, lc[c] = 0.f;
#pragma unroll
      for (int i = 0; i < kN; ++i) oc[c][i] = 0.f;
      if (c < C) {
        const float* cm = C > 1 ? cluster.map_shared_rank(cm_s, c) : cm_s;
        const float* cl = C > 1 ? cluster.map_shared_rank(cl_s, c) : cl_s;
        const float* co = C > 1 ? cluster.map_shared_rank(co_s, c) : co_s;
        mc[c] = cm[r], lc[c] = cl[r];
#pragma unroll
        for (int i = 0; i < kN; ++i) oc[c][i] = co[ci + i];
      }
    }
    float M = kNegInf;
#pragma unroll
    for (int c = 0; c < kCs; ++c) M = fmaxf(M, mc[c]);
    const float Mu = M == kNegInf ? 0.f : M;
    float L = 0.f, acc[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const float f = c < C ? exp2f(mc[c] - Mu) : 0.f;
      L += lc[c] * f;
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] += oc[c][i] * f;
    }
    if (C > 1 && one_pass) cluster_arrive_exit();
    if (a.ll && at.grp > 0) {
      // Flagged merge, a later cluster group: post this partial for the row's first group.
      float v[2 * kLLChunks];
#pragma unroll
      for (int i = 0; i < 2 * kLLChunks; ++i) v[i] = 0.f;
#pragma unroll
      for (int i = 0; i < kN; ++i) v[i] = acc[i];
      v[kN] = M, v[kN + 1] = L;
      uint4* rec = ll_record<kN>(a, at.row, at.grp, r, d0);
#pragma unroll
      for (int c = 0; c < (kN + 3) / 2; ++c) ll_store(rec + c, v[2 * c], v[2 * c + 1]);
    } else if (a.groups == 1 || a.ll) {
      // Flagged merge, the first cluster group: fold in the other groups' partials as their
      // records arrive (every CTA of the grid is resident: the host checks), then finish.
      // The records of kBatch groups are loaded at once (the first batch above).
      for (int g0 = 1; a.ll && g0 < a.groups; g0 += kBatch) {
        if (g0 > 1) load_batch(g0);
        ll_wait(x, a.groups - g0, [&](int u) { return ll_record<kN>(a, at.row, g0 + u, r, d0); });
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (g0 + u >= a.groups) break;
          uint4* rec = ll_record<kN>(a, at.row, g0 + u, r, d0);
          float v[2 * kChunks];
#pragma unroll
          for (int c = 0; c < kChunks; ++c)
            v[2 * c] = __uint_as_float(x[u][c].x), v[2 * c + 1] = __uint_as_float(x[u][c].z);
#pragma unroll
          for (int c = 0; c < kChunks; ++c) ll_clear(rec + c);
          const float mg = v[kN], lg = v[kN + 1];
          const float mn = fmaxf(M, mg);
          const float mu = mn == kNegInf ? 0.f : mn;
          const float fo = exp2f(M - mu), fn = exp2f(mg - mu);
          L = L * fo + lg * fn;
#pragma unroll
          for (int i = 0; i < kN; ++i) acc[i] = acc[i] * fo + v[i] * fn;
          M = mn;
        }
      }
      const float il = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
      for (int i = 0; i < kN; ++i) acc[i] *= il;
      store_out<kN>(a, at.t, at.kvh * a.gqa + r, d0, acc);
    } else {
      const int64_t pi = at.part_row * 16 + r;
      float* po = a.part_o + pi * kDim + d0;
      if constexpr (kN == 4) *reinterpret_cast<float4*>(po) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      else if constexpr (kN == 2) *reinterpret_cast<float2*>(po) = make_float2(acc[0], acc[1]);
      else po[0] = acc[0];
      if (d0 == 0) *reinterpret_cast<float2*>(a.part_ml + pi * 2) = make_float2(M, L);
    }
  }
  if (C > 1 && !one_pass) cluster_arrive_exit();
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
#define SIEVE_TRACE(i) \
  if (tr) tr[i] = global_ns()
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
  } else {
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
  const int Gn = a.groups;
  if (threadIdx.x >= kDim) return;
  // Thread owns dims d4..d4+3 of rows r0, r0 + 4, r0 + 8, r0 + 12 and folds the partials in
  // with a running (max, sum): the loads of 4 partials are in flight at once.
  const int64_t base = row_id * Gn * 16;
  const int r0 = threadIdx.x / 32, d4 = (threadIdx.x % 32) * 4;
  float4 acc[4];
  float mr[4], lr[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f), mr[k] = kNegInf, lr[k] = 0.f;
  for (int g0 = 0; g0 < Gn; g0 += 4) {
    float2 ml[4][4];
    float4 x[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int gi = min(g0 + u, Gn - 1);
        const int64_t pi = base + gi * 16 + r0 + 4 * k;
        ml[u][k] = __ldcg(reinterpret_cast<const float2*>(a.part_ml + pi * 2));
        x[u][k] = __ldcg(reinterpret_cast<const float4*>(a.part_o + pi * kDim + d4));
      }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (g0 + u >= Gn) break;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float mn = fmaxf(mr[k], ml[u][k].x);
        const float mu = mn == kNegInf ? 0.f : mn;
        const float fo = exp2f(mr[k] - mu), fn = exp2f(ml[u][k].x - mu);
        lr[k] = lr[k] * fo + ml[u][k].y * fn;
        acc[k].x = acc[k].x * fo + x[u][k].x * fn;
        acc[k].y = acc[k].y * fo + x[u][k].y * fn;
        acc[k].z = acc[k].z * fo + x[u][k].z * fn;
        acc[k].w = acc[k].w * fo + x[u][k].w * fn;
        mr[k] = mn;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = r0 + 4 * k;
    if (r >= a.gqa) continue;
    const float il = lr[k] > 0.f ? 1.f / lr[k] : 0.f;
    store_out4(a, t, kvh * a.gqa + r, d4, acc[k].x * il, acc[k].y * il, acc[k].z * il, acc[k].w * il);
  }
  if (threadIdx.x == 0) SIEVE_TRACE(8);
#undef SIEVE_TRACE
}

template <bool kFp8>
size_t smem_bytes(int stages) {
  return q_offset<kFp8>(stages) + kQBytes;
}

// How many clusters of `cluster` CTAs of this kernel the device runs at once (cached).
template <bool kFp8, int kGroups>
int max_active_clusters(int cluster, int stages) {
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
int max_active_clusters_of(bool fp8, int groups, int cluster, int stages) {
  if (fp8) return groups == 2 ? max_active_clusters<true, 2>(cluster, stages) : max_active_clusters<true, 1>(cluster, stages);
  return groups == 2 ? max_active_clusters<false, 2>(cluster, stages) : max_active_clusters<false, 1>(cluster, stages);
}

template <bool kFp8, int kGroups>
void launch(const AttnArgs& a, int64_t tokens, int nkv, cudaStream_t stream) {
  const size_t smem = smem_bytes<kFp8>(a.stages);
  set_smem(attention_kernel<kFp8, kGroups>, smem);
  ClusterLaunch l(dim3(unsigned(int64_t(a.splits) * tokens), unsigned(nkv), 1), dim3(threads_of<kGroups>(), 1, 1),
                  smem, stream, a.cluster);
  if (pdl_enabled(kPdlAttention, tokens, a.topk_idx == nullptr)) l.allow_programmatic_serialization();
  cuda_check(cudaLaunchKernelEx(&l.cfg, attention_kernel<kFp8, kGroups>, a), "attention launch");
}

// AttentionTuning::trace 1: every call is synchronised and prints where its CTAs spent their
// time (global timer, ns from the first CTA's start): a development aid, never on in serving;
// 2 also prints every CTA's SM and phase times.
int trace_level() { return tuning().attention.trace; }
bool trace_enabled() { return trace_level() > 0; }
void print_trace(const AttnArgs& a, const std::vector<unsigned long long>& tr, int64_t ctas) {
  const bool fp8 = a.k_scale != nullptr;
  const char* names[kTracePoints] = {"start", "prologue", "issued", "first K", "loop end", "cta merged",
                                     "cluster sync", "end", "row merged"};
  std::fprintf(stderr,
               "attention trace: %lld CTAs, splits %d cluster %d groups %d (%s merge) per_split %d stages %d consumer "
               "groups %d\n",
               (long long)ctas, a.splits, a.cluster, a.groups, a.groups == 1 ? "no global" : a.ll ? "flagged" : "last-CTA",
               a.per_split, a.stages, a.cgroups);
  for (int c : {2, 4, 8})
    std::fprintf(stderr, "  max active clusters of %d at %d stages: %d\n", c, a.stages,
                 max_active_clusters_of(fp8, a.cgroups, c, a.stages));
  print_trace_quantiles(names, kTracePoints, kTraceSlots, tr, ctas);
  if (trace_level() < 2) return;
  const unsigned long long t0 = trace_origin(tr, kTraceSlots, ctas);
  auto at = [&](int64_t c, int i) {
    const unsigned long long x = tr[size_t(c * kTraceSlots + i)];
    return x ? double(x - t0) / 1000.0 : -1.0;
  };
  for (int64_t c = 0; c < ctas; ++c)
    std::fprintf(stderr, "  cta %lld sm %d: first K %.2f loop end %.2f cta merged %.2f cluster sync %.2f end %.2f\n",
                 (long long)c, int(tr[size_t(c * kTraceSlots + kTracePoints)]) - 1, at(c, 3), at(c, 4), at(c, 5),
                 at(c, 6), at(c, 7));
}

}  // namespace

bool run_attention(const ops::AttentionParams& p, void* stream_v) {
  if (p.head_dim != kDim || p.kv.head_dim != kDim || p.kv.block_size != kBlock) return false;
  if (p.kv.dtype != DType::BF16 && p.kv.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.out_dtype != DType::BF16 && p.out_dtype != DType::F32) return false;
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  const int gqa = p.num_q_heads / p.num_kv_heads;
  if (gqa > 16) return false;
  if (p.topk_idx && p.topk <= 0) return false;
  const bool fp8 = p.kv.dtype == DType::FP8_E4M3;
  if (fp8 && (!p.kv.k_scale || !p.kv.v_scale)) return false;
  if (p.batch.num_tokens == 0 || p.batch.num_seqs == 0) return true;
  if (use_prefill_attention(p) && run_attention_prefill(p, stream_v)) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);

  AttnArgs a{};
  fill_attention_args(a, p);
  {
    const size_t esz = a.q_bf16 ? 2 : 4;
    a.q_vec = reinterpret_cast<uintptr_t>(p.q) % (4 * esz) == 0 && (p.q_stride * esz) % (4 * esz) == 0;
    a.q_bulk = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && (p.q_stride * esz) % 16 == 0;
  }
  {
    const size_t esz = a.out_bf16 ? 2 : 4;
    a.out_vec = reinterpret_cast<uintptr_t>(p.out) % (4 * esz) == 0 && (p.out_stride * esz) % (4 * esz) == 0;
  }
  a.gqa = gqa;
  a.k = static_cast<const uint8_t*>(p.kv.k);
  a.v = static_cast<const uint8_t*>(p.kv.v);
  a.k_scale = p.kv.k_scale;
  a.v_scale = p.kv.v_scale;

  // Splits from shapes only. About two resident CTAs per SM; one cluster of up to 8 CTAs per
  // row when that already covers the GPU, else several clusters per row.
  const int64_t rows = p.batch.num_tokens * p.num_kv_heads;
  const int sms = num_sms();
  const int units = p.topk_idx ? p.topk
                               : std::max(1, std::min((p.batch.max_seq_len + kBlock - 1) / kBlock,
                                                      p.batch.max_blocks_per_seq));
  const AttentionTuning& tu = tuning().attention;
  const int max_cluster = std::clamp(tu.max_cluster, 1, kMaxCluster);
  const int max_stages = std::clamp(tu.max_stages, 2, kMaxStages);
  const int force_splits = tu.splits > 0 ? std::min(tu.splits, kMaxSplits) : 0;
  const int force_groups = tu.consumer_groups > 0 ? std::min(tu.consumer_groups, 2) : 0;
  // Up to about 33 rows on the H200 (at least 4 splits a row): one CTA per SM, each with two
  // consumer groups (8 consumer warps, ~200 KB of K/V in flight), floor(SMs / rows) splits a row,
  // so the grid is one wave. Measured at batch 32, context 9216 (4 splits in 2 clusters of 2):
  // 38.8 us against 42.5 for 8 splits in clusters of 2 at two CTAs per SM (dense, fp8), 19.2
  // against 21.7 (sparse, fp8). More rows: about two CTAs (one group each) per SM.
  const bool one_per_sm = rows * 4 <= sms;
  // Q by one bulk copy (16-byte aligned rows): with bf16 KV at every shape (sparse b32 ctx9216
  // 19.4 -> 19.1 us, dense 46.9 -> 46.4); with fp8 KV for sparse rows at one CTA per SM only
  // (b32 ctx9216 14.2 -> 13.5 us) — dense fp8 rows and sparse b128 measured 1-2.4 % slower with
  // it (docs/performance.md). AttentionTuning::q_bulk 0 / 1 forces it off / on (where aligned).
  if (tu.q_bulk == 0) a.q_bulk = false;
  else if (tu.q_bulk < 0 && fp8 && !(p.topk_idx && one_per_sm)) a.q_bulk = false;
  int splits = int(std::clamp<int64_t>(one_per_sm ? sms / rows : (2 * sms + rows - 1) / rows, 1,
                                       std::min(units, kMaxSplits)));
  a.cgroups = force_groups ? force_groups : (one_per_sm ? 2 : 1);
  const int max_slots = std::min(max_stages, fp8 ? (a.cgroups == 2 ? Geo<true>::kMaxSlots2 : Geo<true>::kMaxSlots1)
                                                 : (a.cgroups == 2 ? Geo<false>::kMaxSlots2 : Geo<false>::kMaxSlots1));
  // Each consumer group has its own half of the ring (slot_of): an even count with two groups,
  // at least 2 slots (one unit's K and V) per group.
  const int min_slots = 2 * a.cgroups;
  auto stages_for = [&](int per_split) {
    const int n = std::max(min_slots, std::min(2 * per_split, max_slots));
    return n - n % a.cgroups;
  };
  auto resident = [&](int c, int per_split) { return max_active_clusters_of(fp8, a.cgroups, c, stages_for(per_split)); };
  a.cluster = 1;
  if (force_splits) {
    splits = std::min(force_splits, units);
    a.cluster = std::min(splits, max_cluster);
  } else if (!one_per_sm) {
    // Enough rows to fill the GPU with one cluster per row: the largest cluster (<= 8 CTAs,
    // each a split of the row) with which every row's cluster is resident at once. The merge is
    // then entirely in distributed shared memory. Rows too many for that: plain CTAs.
    splits = std::min(splits, kMaxCluster);
    for (int c : {8, 4, 2}) {
      if (c > max_cluster || c > units) continue;
      if (rows <= resident(c, (units + c - 1) / c)) {
        a.cluster = c;
        splits = c;
        break;
      }
    }
  } else if (const int c1 = std::min(max_cluster, (units + 1) / 2);
             c1 >= 2 && units <= 2 * c1 && rows <= resident(c1, 2)) {
    // Few rows and at most two units a CTA in one cluster (one unit per consumer group, the two
    // streamed at once): one cluster per row, merged in distributed shared memory only. Measured
    // at batch 1, context 9216, sparse (16 units): 9.9 us (fp8) / 10.0 (bf16) against 12.3 /
    // 11.3 for 16 splits in 2 clusters of 8 merged through global memory.
    a.cluster = c1;
    splits = c1;
  } else {
    // Few rows: several clusters per row (a last-CTA merge over global memory joins them), the
    // largest power-of-two cluster (<= 8) with which they are all resident.
    const int c0 = std::min(splits, max_cluster);
    for (int c : {c0, std::min(c0 - 1, 4), std::min(c0 - 1, 2)}) {
      if (c < 2 || (c != c0 && (c & (c - 1)))) continue;
      const int groups = (splits + c - 1) / c;
      if (rows * groups <= resident(c, (units + c * groups - 1) / (c * groups))) {
        a.cluster = c;
        break;
      }
    }
  }
  a.groups = (splits + a.cluster - 1) / a.cluster;
  a.splits = a.cluster * a.groups;
  a.per_split = (units + a.splits - 1) / a.splits;
  a.stages = stages_for(a.per_split);
  // Two clusters a row: the flagged merge when every CTA of the grid is resident at once (the
  // first cluster waits for the second's records), else, and with more clusters a row, partials
  // and a last-CTA merge. Measured (H200): batch 32 (two clusters of 2 a row) sparse fp8 15.0 ->
  // 14.1 us, dense fp8 31.5 -> 30.8; with 8 or 9 clusters a row (dense, batch 1 and 8) the
  // flagged merge was slower (b1 bf16 14.9 -> 17.0 us), so it is not used there.
  a.ll = tu.flagged_merge && a.groups == 2 && a.cluster > 1 &&
         rows * a.groups <= max_active_clusters_of(fp8, a.cgroups, a.cluster, a.stages);
  if (a.ll) {
    const size_t records = size_t(rows) * (a.groups - 1) * 16 * kDim;  // kN = 1 at most
    a.ll_buf = static_cast<uint4*>(private_scratch(stream, kScratchAttentionMerge, records * kLLChunks * 16));
  } else if (a.groups > 1) {
    const size_t n = size_t(rows) * a.groups * 16;
    char* ws = static_cast<char*>(workspace(stream, n * (kDim + 2) * 4));
    a.part_o = reinterpret_cast<float*>(ws);
    a.part_ml = reinterpret_cast<float*>(ws + n * kDim * 4);
    a.counters = zeroed_counters(stream, size_t(rows));
  }
  // L2 evict-first K/V copies (internal.h) when each request has one query row (decode: no
  // block is read again by another row of the grid) and the call streams at least
  // kL2HintMinBytes. Measured (docs/performance.md): b32 ctx9216 sparse fp8 / bf16 -6.7 / -6.5 %,
  // dense bf16 -2.9 %; sparse b1 +1.1-1.8 % (a 0.5-1 MB stream), hence the threshold. With
  // several rows a request the rows read the same blocks and keep the default policy.
  // AttentionTuning::l2_evict_first 0 / 1 forces it off / on.
  const int64_t unit_bytes = 2 * (fp8 ? Geo<true>::kSlotBytes : Geo<false>::kSlotBytes);  // K and V
  a.l2_first = l2_evict_first(p.batch.max_query_len <= 1 ? rows * units * unit_bytes : 0, tu.l2_evict_first);
  const int64_t ctas = int64_t(a.splits) * p.batch.num_tokens * p.num_kv_heads;
  a.trace = trace_alloc(trace_enabled(), size_t(ctas) * kTraceSlots, stream);
  if (fp8) {
    if (a.cgroups == 2) launch<true, 2>(a, p.batch.num_tokens, p.num_kv_heads, stream);
    else launch<true, 1>(a, p.batch.num_tokens, p.num_kv_heads, stream);
  } else {
    if (a.cgroups == 2) launch<false, 2>(a, p.batch.num_tokens, p.num_kv_heads, stream);
    else launch<false, 1>(a, p.batch.num_tokens, p.num_kv_heads, stream);
  }
  if (a.trace) print_trace(a, trace_collect(a.trace, size_t(ctas) * kTraceSlots, stream), ctas);
  return true;
}

}  // namespace sieve::cuda
