// Decode lightning indexer, variant 2 (selected by set_kernel_variant(2) / SIEVE_CUDA_KERNELS=v2;
// same contract and same outputs as the v1 fused decode kernel in indexer.cu).
//
// Differences from v1, from the ncu analysis of v1 (latency-bound: 4 warps per CTA, 0.6 waves,
// one CTA barrier per key block):
//  - 8 warps per CTA, each takes 16 keys (2 n-tiles) of every 128-key block: twice the warps per
//    byte in flight to hide the MMA / convert / shuffle latency. With at most 8 query vectors a
//    request the 16 keys are one tile of the narrow MMA instead (indexer_narrow; same outputs).
//  - No CTA barrier per block. Each warp folds its per-row masked block max into a shared
//    [16][chunk_blocks] table with an integer atomicMax on an order-preserving encoding of the
//    float (maxima are never NaN: fmaxf from -inf drops NaN, exactly as v1); scores are formed
//    from the table after the loop (one barrier). Stage reuse is tracked by per-stage "empty"
//    mbarriers (one arrival per thread once its key rows are in registers); lane 0 of warp 0 waits
//    on it and refills the stage with a bulk copy.
//  - Grid sized to ~3 CTAs per SM for fp8 (4 stages of 16 KB) and ~2 for bf16 (3 stages of 32 KB).
// Chunk top-k and the last-CTA merge are the v1 algorithms (indexer_common.cuh; 256 threads).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/indexer_common.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

// ---------------------------------------------------------------------------------------------
// Process-wide kernel variant switch.
namespace {
std::atomic<int> g_variant{0};  // 0 = not read yet
int variant_from_env() {
  // Unset: automatic (kVariantAuto: by shape, auto_decode_variant in indexer.cu);
  // SIEVE_CUDA_KERNELS=v1|v2|v3|v4 forces one.
  const char* e = std::getenv("SIEVE_CUDA_KERNELS");
  if (e && (std::strcmp(e, "v1") == 0 || std::strcmp(e, "1") == 0)) return 1;
  if (e && (std::strcmp(e, "v2") == 0 || std::strcmp(e, "2") == 0)) return 2;
  if (e && (std::strcmp(e, "v3") == 0 || std::strcmp(e, "3") == 0)) return 3;
  if (e && (std::strcmp(e, "v4") == 0 || std::strcmp(e, "4") == 0)) return 4;
  return kVariantAuto;
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
void set_kernel_variant(int v) {
  g_variant.store(v == 2 || v == 3 || v == 4 || v == kVariantAuto ? v : 1, std::memory_order_relaxed);
}

namespace {
std::atomic<int> g_max_chunks{0};
}  // namespace
void set_indexer_v2_max_chunks(int n) { g_max_chunks.store(n, std::memory_order_relaxed); }

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kMaxChunks = 128;
constexpr int kThreads = 256;

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

template <bool kFp8>
__host__ __device__ constexpr int stages() {
  return kFp8 ? 4 : 3;
}

template <bool kFp8, bool kNarrow>
__global__ void __launch_bounds__(kThreads, kFp8 ? 3 : 2) decode_indexer_v2_kernel(IdxArgs a) {
  extern __shared__ float smem[];
  __shared__ int n_blk_row[16];
  __shared__ int is_last;
  pdl_trigger();
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
      mbar_init(&empty[i], kThreads);  // every thread releases (its own reads)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int i) {
    const int64_t phys = tbl[i];
    bulk_load(stage + (i % kStages) * block_bytes, a.cache + phys * block_bytes, block_bytes, &full[i % kStages]);
  };
  // First copies: blocks that hold only tokens before the request's first new token need
  // nothing from the previous kernel (PDL: common.cuh); the others wait for it.
  const int n_old = qlen > 0 ? (seq_len - qlen) / kBlock : 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < min(nb, kStages); ++i)
      if (b0 + i < n_old) issue(i);
  pdl_wait();
  if (threadIdx.x == 0)
    for (int i = 0; i < min(nb, kStages); ++i)
      if (b0 + i >= n_old) issue(i);
  // Query fragments after the first copies are in flight (rows g and g + 8 = query vectors).
  const int v0 = g, v1 = g + 8;
  // Positions of the vectors of this lane's two maxima (max_vec).
  const int pos0 = seq_len - qlen + max_vec<kNarrow>(g, q, 0) / max(a.H, 1);
  const int pos1 = seq_len - qlen + max_vec<kNarrow>(g, q, 1) / max(a.H, 1);
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
    // This thread's rows of the stage are in registers: release it (each thread for its own
    // reads); warp 0 refills it once all threads have released it.
    mbar_arrive(&empty[st_i]);
    if (warp == 0) {
      if (lane == 0 && i + kStages < nb) {
        mbar_wait(&empty[st_i], par);
        issue(i + kStages);
      }
      __syncwarp();
    }
    fold_warp_block<kFp8, kNarrow>(kr, qa, b * kBlock + warp * 16, g, q, pos0, pos1, nv, mx + i, a.chunk_blocks);
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
  finish_chunk(a, sc, s, c, tok0, nv, b0, nb, n_blk_row, smem, &is_last);
}

}  // namespace

bool run_indexer_decode_v2(const ops::IndexerParams& p, void* stream_v) {
  if (!indexer_supported(p)) return false;
  if (!use_decode_indexer(p)) return false;
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;

  IdxArgs a{};
  fill_indexer_args(a, p);
  a.num_seqs = p.batch.num_seqs;
  a.block_scores = p.block_scores;
  a.max_blocks = std::min((p.batch.max_seq_len + kBlock - 1) / kBlock, p.batch.max_blocks_per_seq);

  // Grid from shapes only: about 3 (fp8) / 2 (bf16) resident CTAs per SM, one wave.
  const int target = num_sms() * (fp8 ? 3 : 2);
  int chunks = std::clamp(target / a.num_seqs, 1, kMaxChunks);
  // Development: SIEVE_V2_CHUNKS = chunks per request (read once; unset: the rule above).
  static const int force_chunks = [] {
    const int v = env_int("SIEVE_V2_CHUNKS");
    return v > 0 ? std::min(v, kMaxChunks) : 0;
  }();
  if (force_chunks > 0) chunks = force_chunks;
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
  const bool narrow = indexer_narrow(p);
  auto kernel = fp8 ? (narrow ? decode_indexer_v2_kernel<true, true> : decode_indexer_v2_kernel<true, false>)
                    : (narrow ? decode_indexer_v2_kernel<false, true> : decode_indexer_v2_kernel<false, false>);
  set_smem(kernel, smem);
  launch_pdl(pdl_enabled(kPdlIndexer, p.batch.num_tokens), kernel, grid, kThreads, smem, stream, "indexer decode v2", a);
  return true;
}

}  // namespace sieve::cuda
