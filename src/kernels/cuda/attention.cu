// Paged GQA attention, block-sparse (topk_idx) or dense (ops::AttentionParams).
//
// One CTA per (query token, kv head, split). The 16 q heads of the kv group form the 16 rows of
// mma.sync m16n8k16, so each K/V element read from the cache is used by all heads of its group.
// 4 warps each take 32 keys of every 128-key block of the split (a flash-attention loop with
// base-2 online softmax per warp); warps and then splits are merged with their (max, sum).
// K and V go straight from global memory into mma fragments without shared memory:
//  - S = Q K^T: the dot sums over dims, so each lane's k-slots map to dims that are 16-byte runs
//    in memory (Q fragments use the same mapping);
//  - O = P V: the output dims are permuted (mma column n of n-tile j is dim n * 16 + j) so that
//    each lane's V elements of a key are one 16-element run; the permutation is undone at write.
// Splits come from shapes only (topk, batch.max_seq_len), so the grid is CUDA-graph safe.
// Precision: bf16 KV -> bf16 MMA (Q rounded to bf16); fp8 KV -> Q K^T in f16 (keys convert
// exactly; Q rounded to f16), k_scale applied to the fp32 scores; P * v_scale rounded to bf16
// and fp8 V converted exactly to bf16 for P V. Softmax and accumulation in fp32.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kThreads = 128;
constexpr int kMaxSplits = 128;
constexpr int kBatch = 64;  // block ids staged per batch

struct AttnArgs {
  const void* q;
  bool q_bf16;
  int64_t q_stride;
  void* out;
  bool out_bf16;
  int64_t out_stride;
  bool out_vec;  // out and out_stride allow 16-byte (f32) / 8-byte (bf16) stores
  int nq, nkv, gqa;
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
  int splits, per_split;  // sparse: topk entries per split; dense: blocks per split
  float* part_o;          // [tokens, nkv, splits, 16, 128]
  float* part_ml;         // [tokens, nkv, splits, 16, 2]
  int32_t* counters;      // [tokens, nkv], zero between calls
};

template <bool kFp8>
__device__ __forceinline__ int dbase(int s, int q) {
  return kFp8 ? (s / 4) * 64 + q * 16 + (s % 4) * 4 : (s / 2) * 32 + q * 8 + (s % 2) * 4;
}

__device__ __forceinline__ uint32_t word_of(const uint4& u, int i) {
  return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs a) {
  __shared__ float o_s[4][16][kDim + 4];
  __shared__ float m_s[4][16], l_s[4][16];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  // Request of token t.
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.qsl[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int s = lo;
  // Tokens outside [query_start_loc[0], query_start_loc[num_seqs]) are not written (as on CPU).
  if (t < a.qsl[0] || t >= a.qsl[a.num_seqs]) return;
  const int qlen = a.qsl[s + 1] - a.qsl[s];
  const int pos = a.seq_lens[s] - qlen + (t - a.qsl[s]);
  const int n_blk = pos / kBlock + 1;

  // Q fragments: rows g, g + 8 = heads of this kv group.
  uint32_t qa[8][4];
  {
    const int h0 = kvh * a.gqa + g, h1 = h0 + 8;
    const bool ok0 = g < a.gqa, ok1 = g + 8 < a.gqa;
#pragma unroll
    for (int st = 0; st < 8; ++st) {
      const int d = dbase<kFp8>(st, q);
      float x0[4], x1[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x0[i] = ok0 ? load_act(a.q, t * a.q_stride + int64_t(h0) * kDim + d + i, a.q_bf16) : 0.f;
        x1[i] = ok1 ? load_act(a.q, t * a.q_stride + int64_t(h1) * kDim + d + i, a.q_bf16) : 0.f;
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

  const int64_t kv_row = kFp8 ? kDim : kDim * 2;  // bytes per key row
  int e_begin, e_end;
  if (a.topk_idx) {
    e_begin = split * a.per_split;
    e_end = min(a.topk, e_begin + a.per_split);
  } else {
    e_begin = split * a.per_split;
    e_end = min(n_blk, e_begin + a.per_split);
  }
  const int32_t* sel = a.topk_idx ? a.topk_idx + (int64_t(t) * a.nkv + kvh) * a.topk : nullptr;
  // The split's block ids and physical blocks are fetched in parallel, a batch at a time, so the
  // loop below waits on K/V loads only (not on two dependent index loads per block).
  __shared__ int blk_s[kBatch], phys_s[kBatch];
  for (int e0 = e_begin; e0 < e_end; e0 += kBatch) {
  const int ne = min(kBatch, e_end - e0);
  __syncthreads();
  for (int i = threadIdx.x; i < ne; i += kThreads) {
    const int b = sel ? sel[e0 + i] : e0 + i;
    const bool ok = b >= 0 && b < n_blk;
    blk_s[i] = ok ? b : -1;
    phys_s[i] = ok ? a.block_tables[int64_t(s) * a.mbps + b] : 0;
  }
  __syncthreads();
  for (int ei = 0; ei < ne; ++ei) {
    const int b = blk_s[ei];
    if (b < 0) continue;
    const int key0 = b * kBlock + warp * 32;  // this warp's first key
    if (key0 > pos) continue;
    const int64_t phys = phys_s[ei];
    const int64_t tok_base = (phys * a.nkv + kvh) * kBlock + warp * 32;  // token-row index
    const uint8_t* kb = a.k + tok_base * kv_row;
    const uint8_t* vb = a.v + tok_base * kv_row;

    // ---- S = Q K^T for 32 keys (4 n-tiles).
    constexpr int kKV = kFp8 ? 2 : 4;
    uint4 kr[4][kKV];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < kKV; ++i)
        kr[nt][i] = ldg_stream(kb + (nt * 8 + g) * kv_row + (kFp8 ? i * 64 + q * 16 : (i * 32 + q * 8) * 2));
    // V rows of this lane: keys 16 i + 8 jj + 2 q + kk (i: k-step, jj: half, kk: pair), dims g*16..+15.
    constexpr int kVV = kFp8 ? 1 : 2;
    uint4 vr[2][2][2][kVV];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int u = 0; u < kVV; ++u)
            vr[i][jj][kk][u] = ldg_stream(vb + (16 * i + 8 * jj + 2 * q + kk) * kv_row +
                                          (kFp8 ? g * 16 : g * 32 + u * 16));
    // Keys past the query (the tail of its own block) may hold anything, NaN included: their
    // probabilities are 0, so zero their V rows too (0 * NaN would poison the sum).
    if (key0 + 31 > pos) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
#pragma unroll
          for (int kk = 0; kk < 2; ++kk)
            if (key0 + 16 * i + 8 * jj + 2 * q + kk > pos)
#pragma unroll
              for (int u = 0; u < kVV; ++u) vr[i][jj][kk][u] = make_uint4(0, 0, 0, 0);
    }
    float2 ksc[4], vsc[4];
    if constexpr (kFp8) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        ksc[nt] = *reinterpret_cast<const float2*>(a.k_scale + tok_base + nt * 8 + 2 * q);
        vsc[nt] = *reinterpret_cast<const float2*>(a.v_scale + tok_base + nt * 8 + 2 * q);
      }
    }
    float sacc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sacc[nt][j] = 0.f;
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        uint32_t b0, b1;
        if constexpr (kFp8) {
          const uint32_t w = word_of(kr[nt][st / 4], st % 4);
          b0 = fp8x2_to_f16x2(uint16_t(w & 0xffff));
          b1 = fp8x2_to_f16x2(uint16_t(w >> 16));
          mma_f16(sacc[nt], qa[st], b0, b1);
        } else {
          b0 = word_of(kr[nt][st / 2], (st % 2) * 2);
          b1 = word_of(kr[nt][st / 2], (st % 2) * 2 + 1);
          mma_bf16(sacc[nt], qa[st], b0, b1);
        }
      }
    }
    // Scale, mask, online softmax (base 2).
    float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = key0 + nt * 8 + 2 * q + j;
        float f = a.scale_log2;
        if constexpr (kFp8) f *= (j ? ksc[nt].y : ksc[nt].x);
        const bool ok = key <= pos;
        sacc[nt][j] = ok ? sacc[nt][j] * f : kNegInf;
        sacc[nt][2 + j] = ok ? sacc[nt][2 + j] * f : kNegInf;
        mx0 = fmaxf(mx0, sacc[nt][j]);
        mx1 = fmaxf(mx1, sacc[nt][2 + j]);
      }
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float mu0 = mn0 == kNegInf ? 0.f : mn0, mu1 = mn1 == kNegInf ? 0.f : mn1;
    const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
    m0 = mn0, m1 = mn1;
    l0 *= al0, l1 *= al1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] *= al0, o[j][1] *= al0;
      o[j][2] *= al1, o[j][3] *= al1;
    }
    uint32_t pa[2][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      float p[4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        p[j] = exp2f(sacc[nt][j] - mu0);
        p[2 + j] = exp2f(sacc[nt][2 + j] - mu1);
        l0 += p[j];
        l1 += p[2 + j];
        if constexpr (kFp8) {
          const float vs = key0 + nt * 8 + 2 * q + j <= pos ? (j ? vsc[nt].y : vsc[nt].x) : 0.f;
          p[j] *= vs;
          p[2 + j] *= vs;
        }
      }
      // n-tile nt holds keys 8 nt..: k-step nt / 2, low (even nt) or high (odd nt) k half.
      pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf16x2(p[0], p[1]);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf16x2(p[2], p[3]);
    }
    // ---- O += P V over two k-steps of 16 keys; 16 n-tiles of 8 (permuted) dims.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        uint32_t bb[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          if constexpr (kFp8) {
            const uint32_t wa = word_of(vr[i][jj][0][0], nt / 4);
            const uint32_t wb = word_of(vr[i][jj][1][0], nt / 4);
            const uint32_t sel2 = (nt % 4) | ((4 + nt % 4) << 4);
            bb[jj] = fp8x2_to_bf16x2(uint16_t(__byte_perm(wa, wb, sel2)));
          } else {
            const uint32_t wa = word_of(vr[i][jj][0][nt / 8], (nt % 8) / 2);
            const uint32_t wb = word_of(vr[i][jj][1][nt / 8], (nt % 8) / 2);
            bb[jj] = __byte_perm(wa, wb, (nt % 2) ? 0x7632 : 0x5410);
          }
        }
        // P's A fragment for k-step i: a0/a1 = keys 16i + 2q.. (rows g, g+8), a2/a3 = 16i + 8 + 2q..
        const uint32_t af[4] = {pa[i][0], pa[i][1], pa[i][2], pa[i][3]};
        mma_bf16(o[nt], af, bb[0], bb[1]);
      }
    }
  }
  }

  // ---- Merge the 4 warps.
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  if (q == 0) {
    m_s[warp][g] = m0, m_s[warp][g + 8] = m1;
    l_s[warp][g] = l0, l_s[warp][g + 8] = l1;
  }
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int dim = (2 * q + j) * 16 + nt;
      o_s[warp][g][dim] = o[nt][j];
      o_s[warp][g + 8][dim] = o[nt][2 + j];
    }
  }
  __syncthreads();
  const int d = threadIdx.x;  // one output dim per thread
  const int64_t pbase = ((int64_t(t) * a.nkv + kvh) * a.splits + split) * 16;
  for (int r = 0; r < a.gqa; ++r) {
    float M = fmaxf(fmaxf(m_s[0][r], m_s[1][r]), fmaxf(m_s[2][r], m_s[3][r]));
    const float Mu = M == kNegInf ? 0.f : M;
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float f = exp2f(m_s[w][r] - Mu);
      L += l_s[w][r] * f;
      acc += o_s[w][r][d] * f;
    }
    if (a.splits == 1) {
      const float val = L > 0.f ? acc / L : 0.f;
      const int64_t oi = t * a.out_stride + int64_t(kvh * a.gqa + r) * kDim + d;
      if (a.out_bf16) static_cast<uint16_t*>(a.out)[oi] = f32_to_bf16_bits(val);
      else static_cast<float*>(a.out)[oi] = val;
    } else {
      a.part_o[(pbase + r) * kDim + d] = acc;
      if (d == 0) {
        a.part_ml[(pbase + r) * 2] = M;
        a.part_ml[(pbase + r) * 2 + 1] = L;
      }
    }
  }
  if (a.splits == 1) return;

  // The last split of this (token, kv head) to finish merges all splits (no second launch; the
  // counter returns to zero for the next call, so graph replays need no memset).
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* ctr = a.counters + int64_t(t) * a.nkv + kvh;
    is_last = atomicAdd(ctr, 1) == a.splits - 1;
    if (is_last) *ctr = 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const int S = a.splits;
  float* w_s = &o_s[0][0][0];  // [S][16] merge weights (o_s is free now)
  float* inv_l = &m_s[0][0];   // [16]
  const int64_t base = (int64_t(t) * a.nkv + kvh) * S * 16;
  for (int e = threadIdx.x; e < S * 16; e += kThreads) w_s[e] = __ldcg(a.part_ml + (base + e) * 2);
  __syncthreads();
  if (threadIdx.x < 16) {
    const int r = threadIdx.x;
    float M = kNegInf;
    for (int sp = 0; sp < S; ++sp) M = fmaxf(M, w_s[sp * 16 + r]);
    const float Mu = M == kNegInf ? 0.f : M;
    float L = 0.f;
    for (int sp = 0; sp < S; ++sp) {
      const float f = exp2f(w_s[sp * 16 + r] - Mu);
      L += __ldcg(a.part_ml + (base + sp * 16 + r) * 2 + 1) * f;
      w_s[sp * 16 + r] = f;
    }
    inv_l[r] = L > 0.f ? 1.f / L : 0.f;
  }
  __syncthreads();
  // Thread owns dims d4..d4+3 of rows r0, r0 + 4, r0 + 8, r0 + 12: float4 loads, 4 in flight.
  const int r0 = threadIdx.x / 32, d4 = (threadIdx.x % 32) * 4;
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
  for (int sp = 0; sp < S; ++sp) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = r0 + 4 * k;
      const float4 x = __ldcg(reinterpret_cast<const float4*>(a.part_o + (base + sp * 16 + r) * kDim + d4));
      const float f = w_s[sp * 16 + r];
      acc[k].x += x.x * f, acc[k].y += x.y * f, acc[k].z += x.z * f, acc[k].w += x.w * f;
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = r0 + 4 * k;
    if (r >= a.gqa) continue;
    const float il = inv_l[r];
    const float o4[4] = {acc[k].x * il, acc[k].y * il, acc[k].z * il, acc[k].w * il};
    const int64_t oi = t * a.out_stride + int64_t(kvh * a.gqa + r) * kDim + d4;
    if (a.out_vec && a.out_bf16) {
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.out) + oi) =
          make_uint2(pack_bf16x2(o4[0], o4[1]), pack_bf16x2(o4[2], o4[3]));
    } else if (a.out_vec) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + oi) = make_float4(o4[0], o4[1], o4[2], o4[3]);
    } else {
      for (int i = 0; i < 4; ++i) {
        if (a.out_bf16) static_cast<uint16_t*>(a.out)[oi + i] = f32_to_bf16_bits(o4[i]);
        else static_cast<float*>(a.out)[oi + i] = o4[i];
      }
    }
  }
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
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);

  AttnArgs a{};
  a.q = p.q;
  a.q_bf16 = p.q_dtype == DType::BF16;
  a.q_stride = p.q_stride;
  a.out = p.out;
  a.out_bf16 = p.out_dtype == DType::BF16;
  a.out_stride = p.out_stride;
  {
    const size_t esz = a.out_bf16 ? 2 : 4;
    a.out_vec = reinterpret_cast<uintptr_t>(p.out) % (4 * esz) == 0 && (p.out_stride * esz) % (4 * esz) == 0;
  }
  a.nq = p.num_q_heads;
  a.nkv = p.num_kv_heads;
  a.gqa = gqa;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.k = static_cast<const uint8_t*>(p.kv.k);
  a.v = static_cast<const uint8_t*>(p.kv.v);
  a.k_scale = p.kv.k_scale;
  a.v_scale = p.kv.v_scale;
  a.qsl = p.batch.query_start_loc;
  a.seq_lens = p.batch.seq_lens;
  a.block_tables = p.batch.block_tables;
  a.mbps = p.batch.max_blocks_per_seq;
  a.num_seqs = p.batch.num_seqs;
  a.topk_idx = p.topk_idx;
  a.topk = p.topk;

  // Splits from shapes only: enough CTAs to fill the GPU a few times over.
  const int64_t rows = p.batch.num_tokens * p.num_kv_heads;
  // About two resident CTAs per SM (the kernel holds ~255 registers per thread): one wave.
  const int target = num_sms() * 2;
  const int units = p.topk_idx ? p.topk
                               : std::max(1, std::min((p.batch.max_seq_len + kBlock - 1) / kBlock,
                                                      p.batch.max_blocks_per_seq));
  int splits = int(std::clamp<int64_t>((target + rows - 1) / rows, 1, std::min(units, kMaxSplits)));
  a.per_split = (units + splits - 1) / splits;
  a.splits = (units + a.per_split - 1) / a.per_split;
  if (a.splits > 1) {
    const size_t n = size_t(rows) * a.splits * 16;
    char* ws = static_cast<char*>(workspace(stream, n * (kDim + 2) * 4));
    a.part_o = reinterpret_cast<float*>(ws);
    a.part_ml = reinterpret_cast<float*>(ws + n * kDim * 4);
    a.counters = zeroed_counters(stream, size_t(rows));
  }
  dim3 grid(unsigned(p.batch.num_tokens), p.num_kv_heads, a.splits);
  if (fp8) {
    attention_kernel<true><<<grid, kThreads, 0, stream>>>(a);
  } else {
    attention_kernel<false><<<grid, kThreads, 0, stream>>>(a);
  }
  SIEVE_LAUNCH_CHECK("attention");
  return true;
}

}  // namespace sieve::cuda
