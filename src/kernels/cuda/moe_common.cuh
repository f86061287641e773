// Pieces shared by the MoE kernels of both weight formats (moe.cu: F32 / BF16, moe_fp8.cu: FP8):
// the one-CTA counting sort of (token, slot) pairs by expert, and a token's slots in expert-id
// order for the combine.
#pragma once

#include <cstdint>

namespace sieve::cuda {

// One CTA of blockDim.x threads; cnt and cur: 2 E int32 of shared memory. offsets[e] ..
// offsets[e + 1]: expert e's rows of `sorted` (pair indices t * topk + slot); blk_start[e]: its
// first row block of R rows; offsets[E], blk_start[E]: the totals; pos[q] (when set): the sorted
// row of pair q, -1 when its id is outside [0, E) (not this rank's expert). The order inside an
// expert's range comes from shared-memory atomics: a row's result must not depend on it.
__device__ __forceinline__ void sort_pairs(const int32_t* ids, int pairs, int E, int R, int32_t* cnt, int32_t* cur,
                                           int32_t* offsets, int32_t* blk_start, int32_t* sorted, int32_t* pos) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int e = ids[q];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
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
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int e = ids[q];
    int r = -1;
    if (e >= 0 && e < E) {
      r = atomicAdd(&cur[e], 1);
      sorted[r] = q;
    }
    if (pos) pos[q] = r;
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
