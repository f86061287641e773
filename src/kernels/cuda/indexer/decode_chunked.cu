// Decode lightning indexer, chunked (v2 in docs/performance.md): one CTA per (request, chunk of
// key blocks), each chunk ranked in its CTA, the last CTA of a request merging the chunk lists.
// The planner (planner.cu) runs it where the cluster and persistent kernels have no plan.
//
// Differences from the first fused kernel (deleted; in git history), from its ncu analysis
// (latency-bound: 4 warps per CTA, 0.6 waves, one CTA barrier per key block):
//  - 8 warps per CTA, each takes 16 keys (2 n-tiles) of every 128-key block: twice the warps per
//    byte in flight to hide the MMA / convert / shuffle latency. With at most 8 query vectors a
//    request the 16 keys are one tile of the narrow MMA instead (indexer_narrow; same outputs).
//  - No CTA barrier per block. Each warp folds its per-row masked block max into a shared
//    [16][chunk_blocks] table with an integer atomicMax on an order-preserving encoding of the
//    float (maxima are never NaN: fmaxf from -inf drops NaN); scores are formed
//    from the table after the loop (one barrier). Stage reuse is tracked by per-stage "empty"
//    mbarriers (one arrival per thread once its key rows are in registers); lane 0 of warp 0 waits
//    on it and refills the stage with a bulk copy.
//  - Grid sized to ~3 CTAs per SM for fp8 (4 stages of 16 KB) and ~2 for bf16 (3 stages of 32 KB).
// Chunk top-k and the last-CTA merge: indexer/common.cuh (256 threads).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/common.cuh"
#include "kernels/cuda/indexer/kernels.cuh"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kThreads = 256;

template <bool kFp8>
__host__ __device__ constexpr int stages() {
  return kFp8 ? 4 : 3;
}

template <bool kFp8, bool kNarrow>
__global__ void __launch_bounds__(kThreads, kFp8 ? 3 : 2) decode_chunked_kernel(IndexerArgs a) {
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

size_t chunked_smem_bytes(const IndexerArgs& a, bool fp8) {
  const int nst = fp8 ? stages<true>() : stages<false>();
  return stage_offset(a.chunk_blocks, a.topk, a.chunks) + size_t(nst) * kBlock * kDim * (fp8 ? 1 : 2) + 16 * nst;
}

void launch_decode_chunked(const IndexerArgs& a, bool fp8, bool narrow, int grid, size_t smem, bool pdl,
                           cudaStream_t stream) {
  auto kernel = fp8 ? (narrow ? decode_chunked_kernel<true, true> : decode_chunked_kernel<true, false>)
                    : (narrow ? decode_chunked_kernel<false, true> : decode_chunked_kernel<false, false>);
  set_smem(kernel, smem);
  launch_pdl(pdl, kernel, grid, kThreads, smem, stream, "indexer decode chunked", a);
}

}  // namespace sieve::cuda
