// Device pieces shared by the lightning indexer's kernels (cuda/indexer/): the forced block
// sentinels, the permuted k-slot -> dim mapping of the 16-row MMA over index keys, key
// fragments, the 16-row and narrow (at most 8 query vectors) block maxima and their fold into a
// maxima table, the order-preserving float encoding of the per-block maxima, the chunked decode
// kernel's shared-memory layout, chunk ranking and last-CTA merge, and the row selection of the
// persistent decode kernel and the prefill kernel.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/args.h"
#include "kernels/ops.h"

namespace sieve::cuda {

// Forced scores: init blocks, local blocks (local wins when both), and what a NaN score becomes.
constexpr float kInitScore = 1e30f, kLocalScore = 1e29f, kNanScore = -1e30f;

__device__ __forceinline__ float forced_score(float s, int b, int n_blk, int init, int local) {
  if (b >= n_blk - local) return kLocalScore;
  if (b < init) return kInitScore;
  return s != s ? kNanScore : s;
}

// Element d of index-q head h of token tok as the fp32 value the chunked decode kernel and the
// long-context prefill kernel use: the activation, rounded to e4m3 first in the fp8-MMA mode
// (q_in_cache_dtype with an fp8 cache).
__device__ __forceinline__ float load_q(const IndexerArgs& a, int64_t tok, int h, int d) {
  float v = load_act(a.q, tok * a.q_stride + int64_t(h) * 128 + d, a.q_bf16);
  if (a.q_fp8_round) v = fp8_to_f32(f32_to_fp8_bits(v));
  return v;
}

template <bool kFp8>
__device__ __forceinline__ uint32_t pack_op(float lo, float hi) {
  return kFp8 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

// Loads 8 keys' worth (one n-tile) of B-fragment data for this lane: key row `row` of the cache.
template <bool kFp8>
struct KeyRegs {
  static constexpr int kVec = kFp8 ? 2 : 4;
  uint4 v[kVec];
  __device__ __forceinline__ void load(const uint8_t* row, int q) {
#pragma unroll
    for (int i = 0; i < kVec; ++i)
      v[i] = ldg_stream(row + (kFp8 ? i * 64 + q * 16 : (i * 32 + q * 8) * 2));
  }
  // From a block staged in shared memory (row = this lane's key row). bf16: lanes of odd keys
  // read the 16-byte runs in the other order so the two keys of a quarter-warp hit different
  // banks. fp8 reads them in order: a 2-way conflict on 2 of the lane's loads a block costs less
  // than the 8 selects that put the runs back (the fp8 loop is bound by its instruction chains).
  __device__ __forceinline__ void load_smem(const uint8_t* row, int q, int g) {
    const int flip = kFp8 ? 0 : g & 1;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int j = i ^ flip;
      v[i] = *reinterpret_cast<const uint4*>(row + (kFp8 ? j * 64 + q * 16 : (j * 32 + q * 8) * 2));
    }
#pragma unroll
    for (int i = 0; i < kVec; i += 2) {
      const uint4 a0 = v[i], a1 = v[i + 1];
      v[i] = flip ? a1 : a0;
      v[i + 1] = flip ? a0 : a1;
    }
  }
  // B fragment registers for k-step s.
  __device__ __forceinline__ void frag(int s, uint32_t& b0, uint32_t& b1) const {
    if constexpr (kFp8) {
      const uint4& u = v[s / 4];
      uint32_t w = (s % 4 == 0) ? u.x : (s % 4 == 1) ? u.y : (s % 4 == 2) ? u.z : u.w;
      b0 = fp8x2_to_f16x2(uint16_t(w & 0xffff));
      b1 = fp8x2_to_f16x2(uint16_t(w >> 16));
    } else {
      const uint4& u = v[s / 2];
      b0 = (s % 2 == 0) ? u.x : u.z;
      b1 = (s % 2 == 0) ? u.y : u.w;
    }
  }
};

// One 128-key block's scores for this warp's NT n-tiles of 8 keys (fragments in kr) against the
// 16 query vectors (qa), then the causal maximum per row over the warp's keys: m0 for row g
// (position pos0), m1 for row g + 8 (pos1); kbase is the key of this lane's first slot. Keys
// past a row's position do not count; -inf when none counts.
template <bool kFp8, int NT>
__device__ __forceinline__ void warp_block_max(const KeyRegs<kFp8> (&kr)[NT], const uint32_t (&qa)[8][4], int kbase,
                                               int pos0, int pos1, float& m0, float& m1) {
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      uint32_t bb0, bb1;
      kr[nt].frag(st, bb0, bb1);
      mma16816<kFp8>(acc[nt], qa[st], bb0, bb1);
    }
  }
  m0 = kNegInf, m1 = kNegInf;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int key = kbase + nt * 8 + j;
      if (key <= pos0) m0 = fmaxf(m0, acc[nt][j]);
      if (key <= pos1) m1 = fmaxf(m1, acc[nt][2 + j]);
    }
  }
  quad_max2(m0, m1);
}

// Narrow form for at most 8 query vectors: the warp's 16 keys are the MMA's rows (A: kr[0] rows
// 0..7, kr[1] rows 8..15) and the query vectors its 8 columns (B: the row-g half of qa), so a
// block takes 8 MMAs a warp instead of 16. Every output is the same dot product over the same
// k-steps in the same order as in warp_block_max. m0 / m1: the causal maxima of vectors 2q and
// 2q + 1 (positions posA / posB) over the warp's 16 keys, valid in lanes 0..3 (g == 0); kbase is
// the key of row 0.
template <bool kFp8>
__device__ __forceinline__ void warp_block_max_narrow(const KeyRegs<kFp8> (&kr)[2], const uint32_t (&qa)[8][4],
                                                      int kbase, int g, int posA, int posB, float& m0, float& m1) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    uint32_t a[4];
    kr[0].frag(st, a[0], a[2]);
    kr[1].frag(st, a[1], a[3]);
    mma16816<kFp8>(acc, a, qa[st][0], qa[st][2]);
  }
  const int key0 = kbase + g, key1 = key0 + 8;
  m0 = fmaxf(key0 <= posA ? acc[0] : kNegInf, key1 <= posA ? acc[2] : kNegInf);
  m1 = fmaxf(key0 <= posB ? acc[1] : kNegInf, key1 <= posB ? acc[3] : kNegInf);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
  }
}

// Query vectors of a lane's two maxima: rows g and g + 8 of the 16-row MMA, or (narrow) columns
// 2q and 2q + 1.
template <bool kNarrow>
__device__ __forceinline__ int max_vec(int g, int q, int r) {
  return kNarrow ? 2 * q + r : g + 8 * r;
}

// Order-preserving float <-> int for non-NaN values (integer max == float max).
__device__ __forceinline__ int enc_max(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float dec_max(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

// One block's scores for the warp's 16 keys (first key kbase; fragments in kr, 16-row or narrow
// MMA), folded into the block's column of the [vector][stride] maxima table tab: each of the
// lane's two vectors (max_vec, positions pos0 / pos1) that is below nv and has a key in range.
template <bool kFp8, bool kNarrow>
__device__ __forceinline__ void fold_warp_block(const KeyRegs<kFp8> (&kr)[2], const uint32_t (&qa)[8][4], int kbase,
                                                int g, int q, int pos0, int pos1, int nv, int* tab, int stride) {
  float m0, m1;
  if constexpr (kNarrow) {
    warp_block_max_narrow<kFp8>(kr, qa, kbase, g, pos0, pos1, m0, m1);
  } else {
    warp_block_max<kFp8>(kr, qa, kbase + 2 * q, pos0, pos1, m0, m1);
  }
  if ((kNarrow ? g : q) == 0) {
    const int v0 = max_vec<kNarrow>(g, q, 0), v1 = max_vec<kNarrow>(g, q, 1);
    if (v0 < nv && m0 != kNegInf) atomicMax(&tab[v0 * stride], enc_max(m0));
    if (v1 < nv && m1 != kNegInf) atomicMax(&tab[v1 * stride], enc_max(m1));
  }
}

// Dynamic shared memory of the chunked decode kernel: [16][chunk_blocks] chunk scores,
// the merge scratch, the chunk's block table, then the 128-byte aligned stages and their
// mbarriers.
__host__ __device__ inline size_t table_offset(int chunk_blocks, int topk, int chunks) {
  return size_t(16) * chunk_blocks * 4 + (size_t(chunks) * topk * 2 + size_t(topk) * topk * 2 + 4) * 4;
}
__host__ __device__ inline size_t stage_offset(int chunk_blocks, int topk, int chunks) {
  const size_t o = table_offset(chunk_blocks, topk, chunks) + size_t(chunk_blocks) * 4;
  return (o + 127) / 128 * 128;
}

// Ranks each valid (row, block) of a chunk's scores sc[16][nb] and writes the chunk's sorted
// top-k list; empty slots get (-inf, -1). Called by all threads of the CTA.
__device__ inline void select_chunk(const IndexerArgs& a, const float* sc, int nb_stride, int nv, int b0,
                             int nb, const int* n_blk_row, float* out_s, int32_t* out_i) {
  const int K = a.topk;
  for (int e = threadIdx.x; e < nv * nb; e += blockDim.x) {
    const int v = e / nb, i = e % nb;
    const float s = sc[v * nb_stride + i];
    if (b0 + i >= n_blk_row[v]) continue;
    int rank = 0;
    for (int j = 0; j < nb && rank < K; ++j) {
      if (b0 + j >= n_blk_row[v]) break;
      rank += beats(sc[v * nb_stride + j], j, s, i);
    }
    if (rank < K) {
      out_s[v * K + rank] = s;
      out_i[v * K + rank] = b0 + i;
    }
  }
  for (int e = threadIdx.x; e < 16 * K; e += blockDim.x) {
    const int v = e / K, k = e % K;
    const int valid = v < nv ? max(0, min(nb, n_blk_row[v] - b0)) : 0;
    if (k >= valid) {
      out_s[e] = kNegInf;
      out_i[e] = -1;
    }
  }
}

// Merges the chunk lists of request `s` into the final top-k, one query vector at a time with
// the whole CTA: the lists are staged in shared memory with coalesced loads; candidates that the
// topk-th best chunk maximum beats cannot be selected, so only the others (at most topk * topk)
// are ranked exactly against each other.
__device__ inline void merge_request(const IndexerArgs& a, int s, int nv, const int* n_blk_row, float* smem) {
  const int K = a.topk, C = a.chunks, n = C * K;
  float* cs = smem;                                       // [C * K]
  int* ci = reinterpret_cast<int*>(cs + n);               // [C * K]
  float* sv_s = reinterpret_cast<float*>(ci + n);         // [K * K]
  int* sv_i = reinterpret_cast<int*>(sv_s + K * K);       // [K * K]
  int* misc = sv_i + K * K;                               // [0] survivors, [1] threshold id
  float* misc_f = reinterpret_cast<float*>(misc + 2);     // threshold score
  const int64_t tok0 = a.qsl[s];
  for (int v = 0; v < nv; ++v) {
    const float* ps = a.part_s + (int64_t(s) * C * 16 + v) * K;
    const int32_t* pi = a.part_i + (int64_t(s) * C * 16 + v) * K;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const int c = e / K, k = e % K;
      cs[e] = __ldcg(ps + int64_t(c) * 16 * K + k);
      ci[e] = __ldcg(pi + int64_t(c) * 16 * K + k);
    }
    if (threadIdx.x == 0) misc[0] = 0, misc[1] = 0x7fffffff, misc_f[0] = kNegInf;
    __syncthreads();
    // Threshold: the chunk maximum of rank K - 1 among chunk maxima (lists are sorted).
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const int id = ci[c * K];
      if (id < 0) continue;
      const float sc = cs[c * K];
      int rank = 0;
      for (int j = 0; j < C; ++j) rank += ci[j * K] >= 0 && beats(cs[j * K], ci[j * K], sc, id);
      if (rank == K - 1) misc[1] = id, misc_f[0] = sc;
    }
    __syncthreads();
    const int ti = misc[1];
    const float ts = misc_f[0];
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
      const int id = ci[e];
      if (id < 0) continue;
      if (ti != 0x7fffffff && beats(ts, ti, cs[e], id)) continue;
      const int slot = atomicAdd(&misc[0], 1);
      sv_s[slot] = cs[e];
      sv_i[slot] = id;
    }
    __syncthreads();
    const int ns = misc[0];
    int32_t* out = a.topk_idx + ((tok0 + v / a.H) * a.H + v % a.H) * K;
    for (int e = threadIdx.x; e < ns; e += blockDim.x) {
      int rank = 0;
      for (int j = 0; j < ns; ++j) rank += beats(sv_s[j], sv_i[j], sv_s[e], sv_i[e]);
      if (rank < K) out[rank] = sv_i[e];
    }
    const int valid = min(K, n_blk_row[v]);
    for (int k = valid + threadIdx.x; k < K; k += blockDim.x) out[k] = -1;
    __syncthreads();
  }
}

// The end of a chunked decode CTA (all threads): the chunk's block scores sc[16][chunk]
// to block_scores (when asked for; -inf past the request's blocks, the last chunk also up to
// mbps), its sorted top-k list to the partials, then the last CTA of request s to arrive (a
// counter it returns to zero) merges the request's lists into topk_idx. `is_last` is a
// __shared__ int of the kernel; `smem` the dynamic shared memory (scores first).
__device__ inline void finish_chunk(const IndexerArgs& a, const float* sc, int s, int c, int tok0, int nv, int b0, int nb,
                             const int* n_blk_row, float* smem, int* is_last) {
  if (a.block_scores) {
    const int hi = c == a.chunks - 1 ? a.mbps : min(a.mbps, b0 + a.chunk_blocks);
    const int w = max(0, hi - b0);
    for (int e = threadIdx.x; e < nv * w; e += blockDim.x) {
      const int v = e / w, i = e % w;
      a.block_scores[((tok0 + v / a.H) * int64_t(a.H) + v % a.H) * a.mbps + b0 + i] =
          i < nb ? sc[v * a.chunk_blocks + i] : kNegInf;
    }
  }
  const int K = a.topk;
  float* ps = a.part_s + (int64_t(s) * a.chunks + c) * 16 * K;
  int32_t* pi = a.part_i + (int64_t(s) * a.chunks + c) * 16 * K;
  select_chunk(a, sc, a.chunk_blocks, nv, b0, nb, n_blk_row, ps, pi);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *is_last = atomicAdd(&a.counters[s], 1) == a.chunks - 1;
  __syncthreads();
  if (!*is_last) return;
  __threadfence();
  merge_request(a, s, nv, n_blk_row, smem + 16 * a.chunk_blocks);
  if (threadIdx.x == 0) a.counters[s] = 0;
}

// Candidates per row of select_row's fast path (more: topk rounds).
constexpr int kCandCap = 256;

// Order-preserving unsigned key of a non-NaN score (-0 taken as +0, as the float compare
// does); never 0, so 0 can mean "no candidate".
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}

// One warp stages the order keys of score row srow[0, n) (global memory, read through L2) into
// keys: 256 scores per round, all eight loads of a lane in flight at once (one L2 round trip per
// round, not one per 32 scores).
__device__ __forceinline__ void stage_order_keys(const float* srow, int n, uint32_t* keys, int lane) {
  for (int j0 = 0; j0 < n; j0 += 256) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + 32 * u + lane;
      v[u] = j < n ? __ldcg(srow + j) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + 32 * u + lane;
      if (j < n) keys[j] = order_key(v[u]);
    }
  }
}

// The K-th largest lane best (with multiplicity) when n >= K, else 0: the largest lane best that at
// least K lane bests reach (ge >= K; no larger one has K at or above it). Lane bests are read back as
// 8 broadcast 16-byte loads (shuffles are 32 results per clock per SM).
__device__ __forceinline__ uint32_t kth_lane_best(uint32_t bk, int n, int K, uint32_t* mk, int lane) {
  if (n < K) return 0;
  mk[lane] = bk;
  __syncwarp();
  const uint4* m4 = reinterpret_cast<const uint4*>(mk);
  int ge = 0;
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    const uint4 w = m4[v];
    ge += int(w.x >= bk) + int(w.y >= bk) + int(w.z >= bk) + int(w.w >= bk);
  }
  const uint32_t t0 = __reduce_max_sync(0xffffffffu, ge >= K ? bk : 0u);
  __syncwarp();  // mk read by every lane before the next row writes it
  return t0;
}

// Appends block j (key kj) to cand when p, in lane order, c counting the candidates so far.
__device__ __forceinline__ void compact_candidate(bool p, uint32_t kj, int j, unsigned long long* cand, int& c,
                                                  int lane) {
  const unsigned long long cj = (static_cast<unsigned long long>(kj) << 32) | (0xffffffffu - uint32_t(j));
  const unsigned bal = __ballot_sync(0xffffffffu, p);
  const int off = c + __popc(bal & ((1u << lane) - 1u));
  if (p && off < kCandCap) cand[off] = cj;
  c += __popc(bal);
}

// The end of select_row once the c candidates are in cand: ranking, or (c > kCandCap) topk rounds
// over the lane bests (bk, bi) rescanning keys.
__device__ __forceinline__ void rank_candidates(uint32_t* keys, int n, int K, int c, uint32_t bk, uint32_t bi,
                                                unsigned long long* cand, int32_t* out, int lane) {
  // An odd count gets a zero pad (beats nothing) so the ranking reads two candidates a load.
  if (lane == 0 && (c & 1) && c < kCandCap) cand[c] = 0ull;
  __syncwarp();
  if (c <= kCandCap) {
    const ulonglong2* c2 = reinterpret_cast<const ulonglong2*>(cand);
    for (int e = lane; e < c; e += 32) {
      const unsigned long long ce = cand[e];
      int rank = 0;
      for (int f = 0; f < (c + 1) / 2; ++f) {
        const ulonglong2 w = c2[f];
        rank += int(w.x > ce) + int(w.y > ce);
      }
      if (rank < K) out[rank] = int(0xffffffffu - uint32_t(ce));
    }
  } else {
    int win_k = -1;
    for (int k = 0; k < K; ++k) {
      const uint32_t best = __reduce_max_sync(0xffffffffu, bk);
      if (best == 0) break;
      const uint32_t win = __reduce_min_sync(0xffffffffu, bk == best ? bi : 0xffffffffu);
      if (lane == k) win_k = int(win);
      if (bi == win) {  // the owning lane (ids are unique)
        keys[win] = 0;
        bk = 0, bi = 0xffffffffu;
        for (int j = lane; j < n; j += 32) {
          const uint32_t kj = keys[j];
          if (kj > bk) bk = kj, bi = uint32_t(j);
        }
      }
    }
    if (lane < K) out[lane] = win_k;
  }
  for (int k = min(K, n) + lane; k < K; k += 32) out[k] = -1;
  __syncwarp();
}

// Top-k of one row (one warp) from its n >= 1 order keys in shared memory (block j at keys[j],
// never 0) into out[0, K). Composite c(j) = key << 32 | (2^32 - 1 - j): unique, and c(i) > c(j)
// exactly when block i beats block j (higher score, then lower id). Lane l owns blocks l, l + 32,
// ...; its best key is m_l (0 when it owns none). When n >= K, the K-th largest m_l, t0, is a lower
// bound of the row's K-th largest key (K lanes hold a key >= t0), so the top K are among the
// candidates key(j) >= t0 (n < K: t0 = 0, every block); the candidates are compacted by ballots
// into cand (kCandCap entries), and each finds its rank by counting the candidates above it: the
// rank among the candidates is its rank in the row (everything above a top-K element is a
// candidate). No serial dependency per output slot: a few hundred independent instructions per
// row. More than kCandCap candidates (wide ties at t0, or contrived rows): topk rounds of __reduce_max_sync
// over the lane bests, the winner lane clearing its key and rescanning its blocks. Slots past
// min(K, n): -1.
__device__ __forceinline__ void select_row(uint32_t* keys, int n, int K, unsigned long long* cand, uint32_t* mk,
                                           int32_t* out, int lane) {
  uint32_t bk = 0, bi = 0xffffffffu;
  for (int j = lane; j < n; j += 32) {
    const uint32_t k = keys[j];
    if (k > bk) bk = k, bi = uint32_t(j);  // ascending j, strict: the lowest block among equal keys
  }
  const uint32_t t0 = kth_lane_best(bk, n, K, mk, lane);
  int c = 0;
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    const uint32_t kj = j < n ? keys[j] : 0u;
    compact_candidate(j < n && kj >= t0, kj, j, cand, c, lane);
  }
  rank_candidates(keys, n, K, c, bk, bi, cand, out, lane);
}

// select_row of a row staged by stage_row_async (keys holds the scores' float bits): the first
// scan turns them into order keys in place; both scans unrolled by kUnroll (loads in flight
// together). The same outputs. Kept apart from select_row on purpose: an unroll pragma in
// select_row's loops (even `unroll 1`) changes the register allocation of the prefill scoring
// kernels that contain it and made them 12-15 % slower (docs/performance.md).
// kFloatBits = false: keys already holds order keys (poll_row).
template <int kUnroll, bool kFloatBits = true>
__device__ __forceinline__ void select_row_staged(uint32_t* keys, int n, int K, unsigned long long* cand,
                                                  uint32_t* mk, int32_t* out, int lane) {
  uint32_t bk = 0, bi = 0xffffffffu;
#pragma unroll kUnroll
  for (int j = lane; j < n; j += 32) {
    uint32_t k = keys[j];
    if (kFloatBits) {
      k = order_key(__uint_as_float(k));
      keys[j] = k;
    }
    if (k > bk) bk = k, bi = uint32_t(j);
  }
  const uint32_t t0 = kth_lane_best(bk, n, K, mk, lane);
  int c = 0;
#pragma unroll kUnroll
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    const uint32_t kj = j < n ? keys[j] : 0u;
    compact_candidate(j < n && kj >= t0, kj, j, cand, c, lane);
  }
  rank_candidates(keys, n, K, c, bk, bi, cand, out, lane);
}

// One warp copies score row srow[0, n) (global memory, through L2) into shared memory with
// 16-byte cp.async copies: no registers held, so every chunk of the row is in flight at once (one
// round trip for any n; register loads would be split into several round trips by the register
// budget of the kernel around them). region holds stage_row_words(n) words (a multiple of 4) and
// is 16-byte aligned; the row lands at region + (srow's word offset mod 4), so that chunks are
// aligned on both sides, and that pointer is returned: keys[j] holds srow[j]'s bits. Then
// select_row_staged(keys, ...) takes the top-k.
__host__ __device__ constexpr int stage_row_words(int n) { return (n + 6) & ~3; }
__device__ __forceinline__ uint32_t* stage_row_async(const float* srow, int n, uint32_t* region, int lane) {
  const int shift = int((reinterpret_cast<uintptr_t>(srow) >> 2) & 3u);
  uint32_t* keys = region + shift;
  const int head = min(n, (4 - shift) & 3);  // words before the first aligned chunk
  const int chunks = (n - head) >> 2;
  const int tail = head + 4 * chunks;  // words after the last chunk: n - tail < 4
  if (lane < head) keys[lane] = __float_as_uint(__ldcg(srow + lane));
  if (lane >= 4 && lane - 4 < n - tail) keys[tail + lane - 4] = __float_as_uint(__ldcg(srow + tail + lane - 4));
  for (int c = lane; c < chunks; c += 32) cp_async16(keys + head + 4 * c, srow + head + 4 * c);
  cp_async_commit();
  cp_async_wait_all();
  __syncwarp();  // every lane's copies and stores visible to the warp
  return keys;
}

__device__ __forceinline__ void st_relaxed_gpu(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// One warp waits for the n order keys rec[0, n) (written by other CTAs with st_relaxed_gpu; 0 =
// not yet written) and copies them into keys[0, n) (shared memory; both 16-byte aligned) with
// 16-byte cp.async copies through L2, as stage_row_async: every chunk in flight at once and no
// registers held. Chunks with a word still 0 are copied again until none is. Then rec's chunks
// are returned to zero for the next call (words past n in the last chunk are never written).
// Needs every writer resident or able to start: there is no fence or counter, each key is one
// word written once, so a nonzero word is its final value.
__device__ __forceinline__ void poll_row(uint32_t* rec, int n, uint32_t* keys, int lane) {
  const int chunks = (n + 3) >> 2;
  for (int c = lane; c < chunks; c += 32) cp_async16(keys + 4 * c, rec + 4 * c);
  for (;;) {
    cp_async_commit();
    cp_async_wait_all();
    __syncwarp();
    bool missing = false;
    for (int c = lane; c < chunks; c += 32) {
      const uint4 w = *reinterpret_cast<const uint4*>(keys + 4 * c);
      const int r = n - 4 * c;  // words of the row in this chunk (>= 1)
      if (w.x == 0u || (r > 1 && w.y == 0u) || (r > 2 && w.z == 0u) || (r > 3 && w.w == 0u)) {
        cp_async16(keys + 4 * c, rec + 4 * c);
        missing = true;
      }
    }
    if (!__any_sync(0xffffffffu, missing)) break;
  }
  for (int c = lane; c < chunks; c += 32) *reinterpret_cast<uint4*>(rec + 4 * c) = make_uint4(0u, 0u, 0u, 0u);
  __syncwarp();
}

}  // namespace sieve::cuda
