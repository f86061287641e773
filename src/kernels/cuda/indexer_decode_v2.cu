// Decode lightning indexer, variant 2 (selected by set_kernel_variant(2) / SIEVE_CUDA_KERNELS=v2;
// same contract and same outputs as the v1 fused decode kernel in indexer.cu).
//
// Differences from v1, from the ncu analysis of v1 (latency-bound: 4 warps per CTA, 0.6 waves,
// one CTA barrier per key block):
//  - 8 warps per CTA, each takes 16 keys (2 n-tiles) of every 128-key block: twice the warps per
//    byte in flight to hide the MMA / convert / shuffle latency.
//  - No CTA barrier per block. Each warp folds its per-row masked block max into a shared
//    [16][chunk_blocks] table with an integer atomicMax on an order-preserving encoding of the
//    float (maxima are never NaN: fmaxf from -inf drops NaN, exactly as v1); scores are formed
//    from the table after the loop (one barrier). Stage reuse is tracked by per-stage "empty"
//    mbarriers (one arrival per warp once its key rows are in registers); lane 0 of warp 0 waits
//    on it and refills the stage with a bulk copy.
//  - Grid sized to ~3 CTAs per SM for fp8 (4 stages of 16 KB) and ~2 for bf16 (3 stages of 32 KB).
// Chunk top-k and the last-CTA merge are the v1 algorithms (copied, 256 threads).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

// ---------------------------------------------------------------------------------------------
// Process-wide kernel variant switch.
namespace {
std::atomic<int> g_variant{0};  // 0 = not read yet
int variant_from_env() {
  // v2 is the default: at batch 32, context 9216 it measured 21 us (fp8) against v3's 25 us and
  // the same with bf16 (docs/performance.md); SIEVE_CUDA_KERNELS=v1|v3 selects the others.
  const char* e = std::getenv("SIEVE_CUDA_KERNELS");
  if (e && (std::strcmp(e, "v1") == 0 || std::strcmp(e, "1") == 0)) return 1;
  if (e && (std::strcmp(e, "v3") == 0 || std::strcmp(e, "3") == 0)) return 3;
  return 2;
}
}  // namespace

int kernel_variant() {
  int v = g_variant.load(std::memory_order_relaxed);
  if (v == 0) {
    int expected = 0;
    g_variant.compare_exchange_strong(expected, variant_from_env());
    v = g_variant.load(std::memory_order_relaxed);
  }
  return v;
}
void set_kernel_variant(int v) { g_variant.store(v == 2 || v == 3 ? v : 1, std::memory_order_relaxed); }

namespace {
std::atomic<int> g_max_chunks{0};
}  // namespace
void set_indexer_v2_max_chunks(int n) { g_max_chunks.store(n, std::memory_order_relaxed); }

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kMaxTopk = 32;
constexpr int kMaxChunks = 128;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr float kInitScore = 1e30f, kLocalScore = 1e29f, kNanScore = -1e30f;

struct IdxArgs {
  const void* q;
  bool q_bf16;
  bool q_fp8_round;
  int64_t q_stride;
  int H;
  float scale;
  const uint8_t* cache;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps;
  int num_seqs;
  int chunks, chunk_blocks;
  int topk, init_blocks, local_blocks;
  int32_t* topk_idx;
  float* block_scores;
  float* part_s;  // [num_seqs, chunks, 16, topk]
  int32_t* part_i;
  int32_t* counters;  // [num_seqs]
  int max_blocks;
};

__device__ __forceinline__ float forced_score(float s, int b, int n_blk, int init, int local) {
  if (b >= n_blk - local) return kLocalScore;
  if (b < init) return kInitScore;
  return s != s ? kNanScore : s;
}

__device__ __forceinline__ float load_q(const IdxArgs& a, int64_t tok, int h, int d) {
  float v = load_act(a.q, tok * a.q_stride + int64_t(h) * kDim + d, a.q_bf16);
  if (a.q_fp8_round) v = fp8_to_f32(f32_to_fp8_bits(v));
  return v;
}

template <bool kFp8>
__device__ __forceinline__ int dbase(int s, int q) {
  return kFp8 ? (s / 4) * 64 + q * 16 + (s % 4) * 4 : (s / 2) * 32 + q * 8 + (s % 2) * 4;
}

template <bool kFp8>
__device__ __forceinline__ uint32_t pack_op(float lo, float hi) {
  return kFp8 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

template <bool kFp8>
struct KeyRegs {
  static constexpr int kVec = kFp8 ? 2 : 4;
  uint4 v[kVec];
  __device__ __forceinline__ void load_smem(const uint8_t* row, int q, int g) {
    const int flip = g & 1;
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

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}

// Order-preserving float <-> int for non-NaN values (integer max == float max).
__device__ __forceinline__ int enc_max(float f) {
  const int i = __float_as_int(f);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float dec_max(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

// As v1 select_chunk.
__device__ void select_chunk(const IdxArgs& a, const float* sc, int nb_stride, int nv, int b0,
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

// As v1 merge_request.
__device__ void merge_request(const IdxArgs& a, int s, int nv, const int* n_blk_row, float* smem) {
  const int K = a.topk, C = a.chunks, n = C * K;
  float* cs = smem;
  int* ci = reinterpret_cast<int*>(cs + n);
  float* sv_s = reinterpret_cast<float*>(ci + n);
  int* sv_i = reinterpret_cast<int*>(sv_s + K * K);
  int* misc = sv_i + K * K;
  float* misc_f = reinterpret_cast<float*>(misc + 2);
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

// Shared memory: [16][chunk_blocks] maxima/scores, merge scratch, block table, then the
// 128-byte aligned stages and 2 * kStages mbarriers (full, empty).
__host__ __device__ inline size_t table_offset(int chunk_blocks, int topk, int chunks) {
  return size_t(16) * chunk_blocks * 4 + (size_t(chunks) * topk * 2 + size_t(topk) * topk * 2 + 4) * 4;
}
__host__ __device__ inline size_t stage_offset(int chunk_blocks, int topk, int chunks) {
  const size_t o = table_offset(chunk_blocks, topk, chunks) + size_t(chunk_blocks) * 4;
  return (o + 127) / 128 * 128;
}
template <bool kFp8>
__host__ __device__ constexpr int stages() {
  return kFp8 ? 4 : 3;
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, kFp8 ? 3 : 2) decode_indexer_v2_kernel(IdxArgs a) {
  extern __shared__ float smem[];
  __shared__ int n_blk_row[16];
  __shared__ int is_last;
  const int s = blockIdx.x / a.chunks, c = blockIdx.x % a.chunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int nv = qlen * a.H;
  const int n_blk_req = qlen > 0 ? (seq_len - 1) / kBlock + 1 : 0;
  if (threadIdx.x < 16) {
    const int v = threadIdx.x;
    n_blk_row[v] = v < nv ? (seq_len - qlen + v / a.H) / kBlock + 1 : 0;
  }
  const int b0 = c * a.chunk_blocks;
  const int nb = max(0, min(a.chunk_blocks, n_blk_req - b0));
  float* sc = smem;                       // [16][chunk_blocks] scores (after the loop)
  int* mx = reinterpret_cast<int*>(smem);  // same array: encoded block maxima (during the loop)
  for (int e = threadIdx.x; e < 16 * a.chunk_blocks; e += kThreads) mx[e] = enc_max(kNegInf);

  const int row_bytes = kFp8 ? kDim : kDim * 2;
  const uint32_t block_bytes = uint32_t(kBlock) * row_bytes;
  constexpr int kStages = stages<kFp8>();
  uint8_t* stage = reinterpret_cast<uint8_t*>(smem) + stage_offset(a.chunk_blocks, a.topk, a.chunks);
  uint64_t* full = reinterpret_cast<uint64_t*>(stage + kStages * block_bytes);
  uint64_t* empty = full + kStages;
  int* tbl = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(smem) + table_offset(a.chunk_blocks, a.topk, a.chunks));
  // The chunk's physical block ids, all fetched in parallel. They depend on the CTA's place
  // only, so they are read for the whole chunk (entries past the request's length exist in
  // block_tables and are never used).
  for (int i = threadIdx.x; i < a.chunk_blocks && b0 + i < a.mbps; i += kThreads)
    tbl[i] = a.block_tables[int64_t(s) * a.mbps + b0 + i];
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int i) {
    const int64_t phys = tbl[i];
    bulk_load(stage + (i % kStages) * block_bytes, a.cache + phys * block_bytes, block_bytes, &full[i % kStages]);
  };
  if (threadIdx.x == 0)
    for (int i = 0; i < min(nb, kStages); ++i) issue(i);
  // Query fragments after the first copies are in flight (rows g and g + 8 = query vectors).
  const int v0 = g, v1 = g + 8;
  const int pos0 = seq_len - qlen + v0 / max(a.H, 1), pos1 = seq_len - qlen + v1 / max(a.H, 1);
  uint32_t qa[8][4];
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    const int d = dbase<kFp8>(st, q);
    float x0[4] = {0, 0, 0, 0}, x1[4] = {0, 0, 0, 0};
    if (v0 < nv)
      for (int i = 0; i < 4; ++i) x0[i] = load_q(a, tok0 + v0 / a.H, v0 % a.H, d + i);
    if (v1 < nv)
      for (int i = 0; i < 4; ++i) x1[i] = load_q(a, tok0 + v1 / a.H, v1 % a.H, d + i);
    qa[st][0] = pack_op<kFp8>(x0[0], x0[1]);
    qa[st][1] = pack_op<kFp8>(x1[0], x1[1]);
    qa[st][2] = pack_op<kFp8>(x0[2], x0[3]);
    qa[st][3] = pack_op<kFp8>(x1[2], x1[3]);
  }

  for (int i = 0; i < nb; ++i) {
    const int b = b0 + i;
    const int st_i = i % kStages;
    const uint32_t par = uint32_t(i / kStages) & 1u;
    mbar_wait(&full[st_i], par);
    const uint8_t* base = stage + st_i * block_bytes + warp * 16 * row_bytes;
    KeyRegs<kFp8> kr[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) kr[nt].load_smem(base + (nt * 8 + g) * row_bytes, q, g);
    // This warp's rows of the stage are in registers: release it; warp 0 refills it once all
    // warps have released it.
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st_i]);
    if (warp == 0) {
      if (lane == 0 && i + kStages < nb) {
        mbar_wait(&empty[st_i], par);
        issue(i + kStages);
      }
      __syncwarp();
    }
    float acc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
#pragma unroll
      for (int st = 0; st < 8; ++st) {
        uint32_t bb0, bb1;
        kr[nt].frag(st, bb0, bb1);
        mma16816<kFp8>(acc[nt], qa[st], bb0, bb1);
      }
    }
    float m0 = kNegInf, m1 = kNegInf;
    const int kbase = b * kBlock + warp * 16 + 2 * q;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = kbase + nt * 8 + j;
        if (key <= pos0) m0 = fmaxf(m0, acc[nt][j]);
        if (key <= pos1) m1 = fmaxf(m1, acc[nt][2 + j]);
      }
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
    }
    if (q == 0) {
      if (v0 < nv && m0 != kNegInf) atomicMax(&mx[v0 * a.chunk_blocks + i], enc_max(m0));
      if (v1 < nv && m1 != kNegInf) atomicMax(&mx[v1 * a.chunk_blocks + i], enc_max(m1));
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nv * a.chunk_blocks; e += kThreads) {
    const int v = e / a.chunk_blocks, i = e % a.chunk_blocks;
    if (i >= nb) continue;
    const float m = dec_max(mx[e]);
    float score = kNegInf;
    if (b0 + i < n_blk_row[v]) score = forced_score(m * a.scale, b0 + i, n_blk_row[v], a.init_blocks, a.local_blocks);
    sc[e] = score;
  }
  __syncthreads();
  if (a.block_scores) {
    const int hi = c == a.chunks - 1 ? a.mbps : min(a.mbps, b0 + a.chunk_blocks);
    const int w = max(0, hi - b0);
    for (int e = threadIdx.x; e < nv * w; e += kThreads) {
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
  if (threadIdx.x == 0) is_last = atomicAdd(&a.counters[s], 1) == a.chunks - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  merge_request(a, s, nv, n_blk_row, smem + 16 * a.chunk_blocks);
  if (threadIdx.x == 0) a.counters[s] = 0;
}

template <class Kernel>
void set_smem(Kernel k, size_t bytes) {
  static std::mutex mu;
  static std::map<const void*, size_t> limit;
  if (bytes <= 48 * 1024) return;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = limit[reinterpret_cast<const void*>(k)];
  if (bytes <= have) return;
  cuda_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute");
  have = bytes;
}

}  // namespace

bool run_indexer_decode_v2(const ops::IndexerParams& p, void* stream_v) {
  if (p.index_dim != kDim || p.cache.index_dim != kDim || p.cache.block_size != kBlock) return false;
  if (p.cache.dtype != DType::BF16 && p.cache.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.topk <= 0 || p.topk > kMaxTopk || p.num_index_heads <= 0) return false;
  if (!use_decode_indexer(p)) return false;
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;

  IdxArgs a{};
  a.q = p.index_q;
  a.q_bf16 = p.q_dtype == DType::BF16;
  a.q_fp8_round = p.q_in_cache_dtype && fp8;
  a.q_stride = p.q_stride;
  a.H = p.num_index_heads;
  a.scale = p.score_scale;
  a.cache = static_cast<const uint8_t*>(p.cache.k);
  a.qsl = p.batch.query_start_loc;
  a.seq_lens = p.batch.seq_lens;
  a.block_tables = p.batch.block_tables;
  a.mbps = p.batch.max_blocks_per_seq;
  a.num_seqs = p.batch.num_seqs;
  a.topk = p.topk;
  a.init_blocks = p.init_blocks;
  a.local_blocks = p.local_blocks;
  a.topk_idx = p.topk_idx;
  a.block_scores = p.block_scores;
  a.max_blocks = std::min((p.batch.max_seq_len + kBlock - 1) / kBlock, p.batch.max_blocks_per_seq);

  // Grid from shapes only: about 3 (fp8) / 2 (bf16) resident CTAs per SM, one wave.
  const int target = num_sms() * (fp8 ? 3 : 2);
  int chunks = std::clamp(target / a.num_seqs, 1, kMaxChunks);
  if (const int cap = g_max_chunks.load(std::memory_order_relaxed); cap > 0) chunks = std::min(chunks, cap);
  chunks = std::min(chunks, std::max(a.max_blocks, 1));
  chunks = std::max(chunks, (a.max_blocks + 1023) / 1024);
  a.chunk_blocks = (std::max(a.max_blocks, 1) + chunks - 1) / chunks;
  a.chunks = (std::max(a.max_blocks, 1) + a.chunk_blocks - 1) / a.chunk_blocks;

  const size_t part = size_t(a.num_seqs) * a.chunks * 16 * a.topk;
  char* ws = static_cast<char*>(workspace(stream, part * 8));
  a.part_s = reinterpret_cast<float*>(ws);
  a.part_i = reinterpret_cast<int32_t*>(ws + part * 4);
  a.counters = zeroed_counters(stream, size_t(a.num_seqs));
  const int nst = fp8 ? stages<true>() : stages<false>();
  const size_t smem = stage_offset(a.chunk_blocks, a.topk, a.chunks) +
                      size_t(nst) * kBlock * kDim * (fp8 ? 1 : 2) + 16 * nst;
  const int grid = a.num_seqs * a.chunks;
  if (fp8) {
    set_smem(decode_indexer_v2_kernel<true>, smem);
    decode_indexer_v2_kernel<true><<<grid, kThreads, smem, stream>>>(a);
  } else {
    set_smem(decode_indexer_v2_kernel<false>, smem);
    decode_indexer_v2_kernel<false><<<grid, kThreads, smem, stream>>>(a);
  }
  SIEVE_LAUNCH_CHECK("indexer decode v2");
  return true;
}

}  // namespace sieve::cuda
