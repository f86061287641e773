// Device side of decode attention's merges across CTAs (decode_kernel.cu): output stores, the
// flagged records of the flagged merge, the merge of a cluster's CTAs through distributed shared
// memory, and the last CTA's merge of a row's cluster partials.
#pragma once

#include <cooperative_groups.h>

#include "kernels/cuda/attention/decode.cuh"

namespace sieve::cuda::attn {

namespace cg = cooperative_groups;

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

// Several clusters per row, in the last CTA of row `row_id` (token t, kv head kvh) to finish:
// folds the row's cluster partials into the output.
__device__ __forceinline__ void merge_row_partials(const AttnArgs& a, int t, int kvh, int64_t row_id) {
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
}

}  // namespace sieve::cuda::attn
