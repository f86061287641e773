// Decode lightning indexer, cluster kernel (v3 in docs/performance.md). Same contract, supported
// set and outputs as the chunked kernel (decode_chunked.cu, "v2" below):
// the scoring loop (16 query vectors of a request = the 16 M rows of m16n8k16, the permuted
// k-slot -> dim mapping, bf16 / f16 operands, one MMA chain per 8 keys in the same order, so
// block scores are bitwise v2's; or, with at most 8 vectors, the narrow MMA as in v2), the
// forced sentinels and the "higher score, then lower block id" order are v2's. What changes is
// the grid and everything around the scoring loop.
//
// v2 measured latency-bound (DRAM 33% of peak, 12% achieved occupancy): a long chain of
// dependent steps per CTA (lengths -> block table -> barrier -> copies -> math -> chunk top-k ->
// partials to global -> fence -> atomic -> last CTA re-reads the partials) and CTAs idle while
// the slowest CTA and the last-CTA merge finish. v3:
//  - Grid = num_seqs x G groups x C CTAs; the C CTAs of a group are one thread-block cluster
//    (C in {1, 2, 4, 8}, portable) and each takes a contiguous chunk of chunk_blocks blocks.
//    C is the largest power of two <= 8 with num_seqs * C <= 2 * SMs (and C <= the blocks of
//    max_seq_len); G > 1 only for long contexts (G = min(2 * SMs / (num_seqs * C),
//    max_blocks / (8 * C)), at least max_blocks / (256 * C)). Everything from shapes only
//    (max_seq_len, max_blocks_per_seq, num_seqs, SM count): graph replays at shorter live
//    lengths run the same grid; chunks past a request's length score nothing.
//    The cluster count that is meant to be one wave is checked against
//    cudaOccupancyMaxActiveClusters (clusters must fit in a GPC): smaller C / fewer groups if not.
//    Before that check: b1 ctx9216 C 8, G 1, 9 blocks/CTA; b32 ctx9216 C 8, G 1, 256 CTAs;
//    b128 ctx9216 C 2, G 1, 36 blocks/CTA; b32 ctx32768 C 8, G 1, 32 blocks/CTA; b8 ctx131072
//    C 8, G 4, 256 CTAs of 32 blocks. On the H200 only 30 clusters of 8 (62 of 4) fit at two
//    CTAs per SM, so b32 ctx9216 runs as C 4, G 1: 128 CTAs of 18 blocks.
//  - CTA = 8 consumer warps (16 keys of every block each, as v2) + 1 producer warp. The
//    producer's lanes read the chunk's block-table entries in parallel with the request
//    lengths (one dependent global round trip before the first copy), lane 0 initialises the
//    mbarriers and lane i issues the bulk copy (cp.async.bulk, complete_tx on an mbarrier) of
//    block i directly, for all stages at once; lane 0 then refills stages as the consumer warps
//    release them ("empty" mbarriers, one arrival per consumer thread). Consumers load q
//    (16-byte vector loads when aligned) while the copies fly and meet the producer at one named
//    barrier (only the producer's barrier init must be visible); no CTA barrier inside the
//    block loop.
//  - Stages: as many as fit a budget of ~110 KB (2 CTAs per SM: >= 192 KB in flight per SM),
//    or ~200 KB when the grid has at most one CTA per SM (b1: the whole chunk is in flight at
//    once), never more than the chunk's blocks.
//  - Per-block maxima are folded into a shared [16][chunk] table with an order-preserving
//    integer atomicMax (as v2). After the loop each CTA ranks its chunk (top-k per row, sorted,
//    in its own shared memory), then a cluster barrier; CTA r of the cluster merges rows
//    v = r, r + C, ...: it copies the C sorted lists of its rows out of the other CTAs' shared
//    memory (distributed shared memory), arrives on the cluster barrier (its remote reads are
//    done) and ranks the candidates exactly: rank = own position + a binary search in each
//    other sorted list (no atomics, no global partials, no fence for G == 1). The final wait
//    on the cluster barrier keeps every CTA's shared memory alive until all reads are done.
//  - G > 1: the cluster's merged per-row lists go to a global partial; per (request, cluster
//    rank) a counter counts the G groups; the last CTA merges the G lists the same way and
//    returns the counter to zero (graph replays need no memset).
// The grid is planned in planner.cu (plan_cluster); IndexerTuning's cluster_* fields force it, and
// its trace field prints per-phase CTA timestamps of every call made outside a stream capture.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/kernels.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kMaxTopk = 32;
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
constexpr int kMaxChunkBlocks = kClusterMaxChunkBlocks;

// Trace points (IndexerTuning::trace) (one writer thread per CTA and point, %globaltimer in ns).
constexpr int kTracePoints = 9;
constexpr int kTraceSlots = kTracePoints + 1;  // + the SM id (+ 1) of the CTA
// The timer read after `dep` is available (the load that produces it has completed).
__device__ __forceinline__ unsigned long long global_ns_after(int dep) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep) : "memory");
  return t;
}

// Named CTA barrier 1 (barrier 0 is __syncthreads): the producer's block table and first copies
// before the consumers' loop.
__device__ __forceinline__ void named_sync(int count) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(count) : "memory");
}
// Split cluster barrier: arrive (release) after the last remote shared-memory read, wait
// (acquire) before the CTA may exit.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// Query fragments of rows g and g + 8 (v2's permuted k-slot -> dim mapping). The 8 k-steps come
// in pairs (2p, 2p + 1) whose dims are 8 contiguous values dbase(2p) .. + 7.
template <bool kFp8>
__device__ __forceinline__ void load_q_frags(const IndexerArgs& a, int tok0, int nv, int g, int q,
                                             uint32_t (&qa)[8][4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int d0 = dbase<kFp8>(2 * p, q);
    float x[2][8];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int v = g + 8 * r;
#pragma unroll
      for (int i = 0; i < 8; ++i) x[r][i] = 0.f;
      if (v < nv) {
        const int64_t off = int64_t(tok0 + v / a.H) * a.q_stride + int64_t(v % a.H) * kDim + d0;
        if (a.q_rows16) {
          if (a.q_bf16) {
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + off));
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              x[r][2 * i] = __uint_as_float(w[i] << 16);
              x[r][2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            }
          } else {
            const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + off);
            const float4 f0 = __ldg(f), f1 = __ldg(f + 1);
            x[r][0] = f0.x, x[r][1] = f0.y, x[r][2] = f0.z, x[r][3] = f0.w;
            x[r][4] = f1.x, x[r][5] = f1.y, x[r][6] = f1.z, x[r][7] = f1.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[r][i] = load_act(a.q, off + i, a.q_bf16 != 0);
        }
        if (a.q_fp8_round) {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[r][i] = fp8_to_f32(f32_to_fp8_bits(x[r][i]));
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int st = 2 * p + h;
      qa[st][0] = pack_op<kFp8>(x[0][4 * h], x[0][4 * h + 1]);
      qa[st][1] = pack_op<kFp8>(x[1][4 * h], x[1][4 * h + 1]);
      qa[st][2] = pack_op<kFp8>(x[0][4 * h + 2], x[0][4 * h + 3]);
      qa[st][3] = pack_op<kFp8>(x[1][4 * h + 2], x[1][4 * h + 3]);
    }
  }
}

// Rank of candidate (sv, id), at position p of sorted list `self`, among `nl` sorted lists of K
// (ids < 0: padding, a suffix of each list): its position plus, for each other list, the length
// of the prefix that beats it (binary search). Ids are distinct across lists (disjoint block
// ranges), so "beats" is a strict total order and ranks are distinct. Stops counting at K.
__device__ __forceinline__ int merged_rank(const float* ls, const int* li, int nl, int K, int self, int p,
                                           float sv, int id) {
  int rank = p;
  for (int b = 0; b < nl && rank < K; ++b) {
    if (b == self) continue;
    const float* bs = ls + b * K;
    const int* bi = li + b * K;
    int lo = 0, hi = K;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      const int mi = bi[mid];
      if (mi >= 0 && beats(bs[mid], mi, sv, id)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    rank += lo;
  }
  return rank;
}

// merged_rank for IndexerTuning::cluster_merge_ilp: the same value wherever it is < K (the callers drop the
// others), without the serial chain: no early exit, a fixed-step branch-free search per list
// (steps 32 .. 1, K <= 32), lists unrolled by 4 so their shared-memory loads overlap.
__device__ __forceinline__ int merged_rank_ilp(const float* ls, const int* li, int nl, int K, int self, int p,
                                               float sv, int id) {
  int rank = p;
#pragma unroll 4
  for (int b = 0; b < nl; ++b) {
    const float* bs = ls + b * K;
    const int* bi = li + b * K;
    int lo = 0;
#pragma unroll
    for (int step = kMaxTopk; step > 0; step >>= 1) {
      const int m = lo + step - 1;
      if (m < K) {
        const int x = bi[m];
        const float y = bs[m];
        if (x >= 0 && beats(y, x, sv, id)) lo += step;
      }
    }
    rank += b == self ? 0 : lo;
  }
  return rank;
}

template <bool kFp8, bool kNarrow>
__global__ void __launch_bounds__(kThreads, 2) decode_cluster_kernel(IndexerArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int nbr[16];  // blocks of each query vector (n_blk); 0 past nv
  __shared__ int is_last;
  constexpr int row_bytes = kFp8 ? kDim : kDim * 2;
  constexpr uint32_t block_bytes = uint32_t(kBlock) * row_bytes;
  const int C = a.C, G = a.G, S = a.stages, CB = a.chunk_blocks, K = a.topk;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());  // == blockIdx.x % C (cluster dims (C, 1, 1))
  const int grp = int(blockIdx.x / C) % G;
  const int s = int(blockIdx.x / C) / G;
  const int c = grp * C + rank;  // chunk of the request
  const int b0 = c * CB;
  const ClusterLayout L = cluster_layout(CB, K, C, G, S, block_bytes);
  int* mx = reinterpret_cast<int*>(smem);  // encoded block maxima (loop), then scores
  float* sc = reinterpret_cast<float*>(smem);
  float* ls = reinterpret_cast<float*>(smem + L.lists_s);
  int* li = reinterpret_cast<int*>(smem + L.lists_i);
  int* phys = reinterpret_cast<int*>(smem + L.phys);
  uint8_t* stage = smem + L.region;
  float* ms = reinterpret_cast<float*>(smem + L.region);  // merge buffer (after the loop)
  int* mi = reinterpret_cast<int*>(smem + L.merge_i);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + S;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long* const tr = a.trace ? a.trace + int64_t(blockIdx.x) * kTraceSlots : nullptr;
  pdl_trigger();
  if (tr && threadIdx.x == 0) {
    tr[0] = global_ns();
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    tr[kTracePoints] = sm + 1ull;
  }

  // The chunk's block-table entries (producer) are read in parallel with the lengths: they
  // depend on the CTA's place only (entries past the request's length exist and are unused).
  int tbl[kMaxChunkBlocks / 32];
  if (warp == kConsumerWarps) {
#pragma unroll
    for (int j = 0; j < kMaxChunkBlocks / 32; ++j) {
      const int i = lane + 32 * j;
      tbl[j] = i < CB && b0 + i < a.mbps ? __ldg(a.block_tables + int64_t(s) * a.mbps + b0 + i) : 0;
    }
  }
  const int tok0 = __ldg(a.qsl + s), qlen = __ldg(a.qsl + s + 1) - tok0, seq_len = __ldg(a.seq_lens + s);
  const int nv = min(16, max(0, qlen * a.H));
  const int n_blk_req = qlen > 0 ? (seq_len - 1) / kBlock + 1 : 0;
  const int nb = max(0, min(CB, n_blk_req - b0));

  if (warp == kConsumerWarps) {
    // ---- producer warp
    if (lane == 0) {
      for (int i = 0; i < S; ++i) {
        mbar_init(&full[i], 1);
        mbar_init(&empty[i], kConsumerWarps * 32);  // every consumer thread releases
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    if (tr && lane == 0) tr[1] = global_ns_after(tbl[0] + nb);
    // First copies: blocks that hold only tokens before the request's first new token need
    // nothing from the previous kernel (PDL: common.cuh); the others wait for it.
    const int n_old = qlen > 0 ? (seq_len - qlen) / kBlock : 0;
    const bool first = lane < min(nb, S);
    const uint64_t pol = a.l2_first ? l2_policy_evict_first() : 0;
    auto copy = [&](int st, int ph) {
      bulk_load_policy(stage + st * block_bytes, a.cache + int64_t(ph) * block_bytes, block_bytes, &full[st], a.l2_first,
                       pol);
    };
    if (first && b0 + lane < n_old) copy(lane, tbl[0]);
    pdl_wait();
    if (first && b0 + lane >= n_old) copy(lane, tbl[0]);
#pragma unroll
    for (int j = 0; j < kMaxChunkBlocks / 32; ++j)
      if (lane + 32 * j < CB) phys[lane + 32 * j] = tbl[j];
    __syncwarp();
    if (tr && lane == 0) tr[2] = global_ns();
    named_sync(kThreads);
    if (lane == 0) {
      for (int i = S; i < nb; ++i) {
        const int st = i % S;
        mbar_wait(&empty[st], uint32_t(i / S - 1) & 1u);
        copy(st, phys[i]);
      }
    }
    __syncwarp();
  } else {
    // ---- consumer warps: q fragments while the copies fly, then the block loop.
    for (int e = threadIdx.x; e < 16 * CB; e += kConsumerWarps * 32) mx[e] = enc_max(kNegInf);
    if (threadIdx.x < 16) {
      const int v = threadIdx.x;
      nbr[v] = v < nv ? (seq_len - qlen + v / a.H) / kBlock + 1 : 0;
    }
    const int g = lane / 4, q = lane % 4;
    const int v0 = max_vec<kNarrow>(g, q, 0), v1 = max_vec<kNarrow>(g, q, 1);
    const int pos0 = seq_len - qlen + v0 / a.H, pos1 = seq_len - qlen + v1 / a.H;
    uint32_t qa[8][4];
    pdl_wait();
    load_q_frags<kFp8>(a, tok0, nv, g, q, qa);
    named_sync(kThreads);

    for (int i = 0; i < nb; ++i) {
      const int b = b0 + i;
      const int st_i = i % S;
      const uint32_t par = uint32_t(i / S) & 1u;
      mbar_wait(&full[st_i], par);
      if (tr && i == 0 && threadIdx.x == 0) tr[3] = global_ns();
      const uint8_t* base = stage + st_i * block_bytes + warp * 16 * row_bytes;
      KeyRegs<kFp8> kr[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) kr[nt].load_smem(base + (nt * 8 + g) * row_bytes, q, g);
      // This thread's rows of the stage are in registers: release it to the producer (each
      // thread for its own reads).
      mbar_arrive(&empty[st_i]);
      fold_warp_block<kFp8, kNarrow>(kr, qa, b * kBlock + warp * 16, g, q, pos0, pos1, nv, mx + i, CB);
    }
  }
  __syncthreads();
  if (tr && threadIdx.x == 0) tr[4] = global_ns();

  // ---- block scores of the chunk (forced sentinels; -inf past the row's own blocks)
  for (int e = threadIdx.x; e < nv * CB; e += kThreads) {
    const int v = e / CB, i = e % CB;
    if (i >= nb) continue;
    const float m = dec_max(mx[e]);
    float score = kNegInf;
    if (b0 + i < nbr[v]) score = forced_score(m * a.scale, b0 + i, nbr[v], a.init_blocks, a.local_blocks);
    sc[e] = score;
  }
  __syncthreads();
  if (a.block_scores) {
    const int hi = c == G * C - 1 ? a.mbps : min(a.mbps, b0 + CB);
    const int w = max(0, hi - b0);
    for (int e = threadIdx.x; e < nv * w; e += kThreads) {
      const int v = e / w, i = e % w;
      a.block_scores[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * a.mbps + b0 + i] =
          i < nb ? sc[v * CB + i] : kNegInf;
    }
  }
  // ---- chunk top-k per row: rank = number of the chunk's blocks that beat it (as v2)
  for (int e = threadIdx.x; e < nv * nb; e += kThreads) {
    const int v = e / nb, i = e % nb;
    if (b0 + i >= nbr[v]) continue;
    const float sv = sc[v * CB + i];
    int r = 0;
    if (a.merge_ilp) {
      // Same verdict (r < K and its value) as the loop below: early exit every 8 blocks only.
      const int lim = min(nb, nbr[v] - b0);
      for (int j0 = 0; j0 < lim && r < K; j0 += 8) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int j = j0 + u;
          if (j < lim) r += beats(sc[v * CB + j], j, sv, i);
        }
      }
    } else {
      for (int j = 0; j < nb && r < K; ++j) {
        if (b0 + j >= nbr[v]) break;
        r += beats(sc[v * CB + j], j, sv, i);
      }
    }
    if (r < K) {
      ls[v * K + r] = sv;
      li[v * K + r] = b0 + i;
    }
  }
  for (int e = threadIdx.x; e < nv * K; e += kThreads) {
    const int v = e / K, k = e % K;
    const int valid = max(0, min(nb, nbr[v] - b0));
    if (k >= valid) {
      ls[e] = kNegInf;
      li[e] = -1;
    }
  }
  if (tr) {
    __syncthreads();
    if (threadIdx.x == 0) tr[5] = global_ns();
  }
  cluster.sync();  // every chunk list of the cluster is complete
  if (tr && threadIdx.x == 0) tr[6] = global_ns();

  // ---- cluster merge: this CTA takes rows v = rank + lr * C.
  const int nrl = nv > rank ? (nv - rank + C - 1) / C : 0;
  for (int e = threadIdx.x; e < nrl * C * K; e += kThreads) {
    const int lr = e / (C * K), src = (e / K) % C, k = e % K;
    const int o = (rank + lr * C) * K + k;
    ms[e] = cluster.map_shared_rank(ls, src)[o];
    mi[e] = cluster.map_shared_rank(li, src)[o];
  }
  cluster_arrive();  // this CTA's remote reads are done
  __syncthreads();
  for (int e = threadIdx.x; e < nrl * C * K; e += kThreads) {
    const int id = mi[e];
    if (id < 0) continue;
    const int lr = e / (C * K), self = (e / K) % C, p = e % K;
    const float sv = ms[e];
    const int r = a.merge_ilp ? merged_rank_ilp(ms + lr * C * K, mi + lr * C * K, C, K, self, p, sv, id)
                              : merged_rank(ms + lr * C * K, mi + lr * C * K, C, K, self, p, sv, id);
    if (r >= K) continue;
    const int v = rank + lr * C;
    if (G == 1) {
      a.topk_idx[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * K + r] = id;
    } else {
      const int64_t o = ((int64_t(s) * G + grp) * 16 + v) * K + r;
      a.part_s[o] = sv;
      a.part_i[o] = id;
    }
  }
  for (int e = threadIdx.x; e < nrl * K; e += kThreads) {
    const int lr = e / K, k = e % K, v = rank + lr * C;
    if (G == 1) {
      if (k >= min(K, nbr[v])) a.topk_idx[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * K + k] = -1;
    } else {
      // The group's candidates: its blocks [grp * C * CB, (grp + 1) * C * CB) below n_blk.
      const int valid = min(K, max(0, min(C * CB, nbr[v] - grp * C * CB)));
      if (k >= valid) {
        const int64_t o = ((int64_t(s) * G + grp) * 16 + v) * K + k;
        a.part_s[o] = kNegInf;
        a.part_i[o] = -1;
      }
    }
  }

  if (tr) {
    __syncthreads();
    if (threadIdx.x == 0) tr[7] = global_ns();
  }
  // ---- G > 1: the last group of the request (per cluster rank) merges the G group lists.
  if (G > 1 && nrl > 0) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&a.counters[s * C + rank], 1) == G - 1;
    __syncthreads();
    if (is_last) {
      __threadfence();
      for (int e = threadIdx.x; e < nrl * G * K; e += kThreads) {
        const int lr = e / (G * K), gg = (e / K) % G, k = e % K;
        const int64_t o = ((int64_t(s) * G + gg) * 16 + rank + lr * C) * K + k;
        ms[e] = __ldcg(a.part_s + o);
        mi[e] = __ldcg(a.part_i + o);
      }
      __syncthreads();
      for (int e = threadIdx.x; e < nrl * G * K; e += kThreads) {
        const int id = mi[e];
        if (id < 0) continue;
        const int lr = e / (G * K), self = (e / K) % G, p = e % K;
        const int r = a.merge_ilp ? merged_rank_ilp(ms + lr * G * K, mi + lr * G * K, G, K, self, p, ms[e], id)
                                  : merged_rank(ms + lr * G * K, mi + lr * G * K, G, K, self, p, ms[e], id);
        if (r >= K) continue;
        const int v = rank + lr * C;
        a.topk_idx[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * K + r] = id;
      }
      for (int e = threadIdx.x; e < nrl * K; e += kThreads) {
        const int lr = e / K, k = e % K, v = rank + lr * C;
        if (k >= min(K, nbr[v])) a.topk_idx[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * K + k] = -1;
      }
      if (threadIdx.x == 0) a.counters[s * C + rank] = 0;
    }
  }
  cluster_wait();  // the other CTAs have finished reading this CTA's lists
  if (tr) {
    __syncthreads();
    if (threadIdx.x == 0) tr[8] = global_ns();
  }
}

using ClusterKernel = void (*)(IndexerArgs);
ClusterKernel cluster_kernel(bool fp8, bool narrow) {
  if (fp8) return narrow ? decode_cluster_kernel<true, true> : decode_cluster_kernel<true, false>;
  return narrow ? decode_cluster_kernel<false, true> : decode_cluster_kernel<false, false>;
}

void print_trace(bool fp8, bool narrow, const IndexerArgs& a, int N, uint32_t smem,
                 const std::vector<unsigned long long>& tr, int64_t ctas) {
  const char* names[kTracePoints] = {"start",        "prologue",     "issued",      "first block", "loop end",
                                     "chunk top-k", "cluster sync", "cluster mrg", "end"};
  std::fprintf(stderr,
               "indexer cluster trace (%s): %d seqs, %lld CTAs, cluster %d groups %d chunk_blocks %d stages %d "
               "smem %u B, SMs %d, merge %s, pdl %d\n",
               fp8 ? "fp8" : "bf16", N, (long long)ctas, a.C, a.G, a.chunk_blocks, a.stages, smem, num_sms(),
               a.merge_ilp ? "ilp" : "serial", a.pdl);
  std::fprintf(stderr, "  max active clusters at %u B:", smem);
  for (int c : {1, 2, 4, 8}) std::fprintf(stderr, " C%d=%d", c, cluster_resident(fp8, narrow, c, smem));
  std::fprintf(stderr, "\n");
  {
    std::map<unsigned long long, int> per_sm;
    for (int64_t c = 0; c < ctas; ++c)
      if (tr[size_t(c * kTraceSlots + kTracePoints)]) ++per_sm[tr[size_t(c * kTraceSlots + kTracePoints)]];
    int most = 0;
    for (const auto& kv : per_sm) most = std::max(most, kv.second);
    std::fprintf(stderr, "  SMs used %zu of %d, at most %d CTAs on one SM (over the whole call)\n", per_sm.size(),
                 num_sms(), most);
  }
  print_trace_quantiles(names, kTracePoints, kTraceSlots, tr, ctas);
}

}  // namespace

int cluster_resident(bool fp8, bool narrow, int C, uint32_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<bool, bool, int, uint32_t>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(fp8, narrow, C, smem);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const int n = resident_clusters(cluster_kernel(fp8, narrow), kThreads, smem, C, 1, 1 << 30);
  cache[key] = n;
  return n;
}

void launch_decode_cluster(const IndexerArgs& a_in, bool fp8, bool narrow, int64_t ctas, uint32_t smem,
                           cudaStream_t stream) {
  IndexerArgs a = a_in;
  a.trace = trace_alloc(tuning().indexer.trace, size_t(ctas) * kTraceSlots, stream);
  ClusterLaunch l(dim3(unsigned(ctas), 1, 1), dim3(kThreads, 1, 1), smem, stream, a.C);
  if (a.pdl) l.allow_programmatic_serialization();
  const ClusterKernel kernel = cluster_kernel(fp8, narrow);
  set_smem(kernel, smem);
  cuda_check(cudaLaunchKernelEx(&l.cfg, kernel, a), "indexer decode cluster launch");
  SIEVE_LAUNCH_CHECK("indexer decode cluster");
  if (a.trace)
    print_trace(fp8, narrow, a, a.num_seqs, smem, trace_collect(a.trace, size_t(ctas) * kTraceSlots, stream), ctas);
}

}  // namespace sieve::cuda
