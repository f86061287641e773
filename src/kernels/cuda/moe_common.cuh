// Pieces shared by the MoE kernels of both weight formats (moe.cu: F32 / BF16, moe_fp8.cu: FP8):
// the one-CTA counting sort of (token, slot) pairs by expert, and a token's slots in expert-id
// order for the combine.
#pragma once

#include <cstdint>

namespace sieve::cuda {

// The sort's ids kSortRun at a time: e[i] = ids[q0 + i], -1 past the pairs.
constexpr int kSortRun = 8;
__device__ __forceinline__ void load_ids(const int32_t* ids, int q0, int pairs, bool vec, int (&e)[kSortRun]) {
  if (vec && q0 + kSortRun <= pairs) {
#pragma unroll
    for (int i = 0; i < kSortRun; i += 4) {
      const int4 v = *reinterpret_cast<const int4*>(ids + q0 + i);
      e[i] = v.x, e[i + 1] = v.y, e[i + 2] = v.z, e[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kSortRun; ++i) e[i] = q0 + i < pairs ? ids[q0 + i] : -1;
  }
}

// One CTA of blockDim.x threads; cnt and cur: 2 E int32 of shared memory. offsets[e] ..
// offsets[e + 1]: expert e's rows of `sorted` (pair indices t * topk + slot); blk_start[e]: its
// first row block of R rows; offsets[E], blk_start[E]: the totals; pos[q] (when set): the sorted
// row of pair q, -1 when its id is outside [0, E) (not this rank's expert). The order inside an
// expert's range comes from shared-memory atomics: a row's result must not depend on it.
// scan (blockDim.x a multiple of 32): the prefix over the experts by warp scans, each thread
// summing a run of consecutive experts, instead of thread 0's serial loop (same results): the
// serial loop's E dependent shared-memory reads and global stores were most of a decode sort.
__device__ __forceinline__ void sort_pairs(const int32_t* ids, int pairs, int E, int R, int32_t* cnt, int32_t* cur,
                                           int32_t* offsets, int32_t* blk_start, int32_t* sorted, int32_t* pos,
                                           bool scan = false) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  // kSortRun consecutive pairs a thread at a time (16-byte loads and stores where aligned), so that
  // each thread has kSortRun ids in flight, not one.
  const bool vec = (reinterpret_cast<uintptr_t>(ids) & 15) == 0;
  for (int q0 = kSortRun * threadIdx.x; q0 < pairs; q0 += kSortRun * blockDim.x) {
    int e[kSortRun];
    load_ids(ids, q0, pairs, vec, e);
#pragma unroll
    for (int i = 0; i < kSortRun; ++i)
      if (e[i] >= 0 && e[i] < E) atomicAdd(&cnt[e[i]], 1);
  }
  __syncthreads();
  if (scan) {
    __shared__ int32_t warp_tot[2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int per = (E + blockDim.x - 1) / blockDim.x;
    const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
    int rows = 0, blks = 0;
    for (int e = e0; e < e1; ++e) rows += cnt[e], blks += (cnt[e] + R - 1) / R;
    int rin = rows, bin = blks;  // inclusive over the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, rin, o), b = __shfl_up_sync(0xffffffffu, bin, o);
      if (lane >= o) rin += r, bin += b;
    }
    if (lane == 31) warp_tot[0][warp] = rin, warp_tot[1][warp] = bin;
    __syncthreads();
    if (warp == 0) {
      int r = lane < warps ? warp_tot[0][lane] : 0, b = lane < warps ? warp_tot[1][lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int r2 = __shfl_up_sync(0xffffffffu, r, o), b2 = __shfl_up_sync(0xffffffffu, b, o);
        if (lane >= o) r += r2, b += b2;
      }
      warp_tot[0][lane] = r, warp_tot[1][lane] = b;  // inclusive over the warps
    }
    __syncthreads();
    int off = rin - rows + (warp > 0 ? warp_tot[0][warp - 1] : 0);
    int blk = bin - blks + (warp > 0 ? warp_tot[1][warp - 1] : 0);
    for (int e = e0; e < e1; ++e) {
      offsets[e] = off;
      blk_start[e] = blk;
      cur[e] = off;
      off += cnt[e];
      blk += (cnt[e] + R - 1) / R;
    }
    if (threadIdx.x == blockDim.x - 1) {  // its run ends at E (or is empty past it): the totals
      offsets[E] = off;
      blk_start[E] = blk;
    }
  } else if (threadIdx.x == 0) {
    int off = 0, blks = 0;
    for (int e = 0; e < E; ++e) {
      offsets[e] = off;
      blk_start[e] = blks;
      cur[e] = off;
      off += cnt[e];
      blks += (cnt[e] + R - 1) / R;
    }
    offsets[E] = off;
    blk_start[E] = blks;
  }
  __syncthreads();
  const bool pos_vec = (reinterpret_cast<uintptr_t>(pos) & 15) == 0;
  for (int q0 = kSortRun * threadIdx.x; q0 < pairs; q0 += kSortRun * blockDim.x) {
    int e[kSortRun], r[kSortRun];
    load_ids(ids, q0, pairs, vec, e);
#pragma unroll
    for (int i = 0; i < kSortRun; ++i) {
      r[i] = -1;
      if (e[i] >= 0 && e[i] < E) {
        r[i] = atomicAdd(&cur[e[i]], 1);
        sorted[r[i]] = q0 + i;
      }
    }
    if (!pos) continue;
    if (pos_vec && q0 + kSortRun <= pairs) {
#pragma unroll
      for (int i = 0; i < kSortRun; i += 4)
        *reinterpret_cast<int4*>(pos + q0 + i) = make_int4(r[i], r[i + 1], r[i + 2], r[i + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < kSortRun; ++i)
        if (q0 + i < pairs) pos[q0 + i] = r[i];
    }
  }
}

// Token t's slots j with ids in [0, E), ordered by expert id (the CPU reference's summation
// order): order[0 .. n), n returned. order holds topk entries.
__device__ __forceinline__ int expert_order(const int32_t* ids, int64_t t, int topk, int E, int* order) {
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
  return n;
}

}  // namespace sieve::cuda
