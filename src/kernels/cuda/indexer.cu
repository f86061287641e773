// Lightning indexer (ops::IndexerParams): block scores + per-token top-k block selection.
//
// Decode path (max_query_len * num_index_heads <= 16): one CTA per (request, chunk of blocks),
// grid from batch.max_seq_len only (CUDA-graph safe). The request's query vectors (all rows and
// index heads, <= 16) form the 16-row A operand of mma.sync m16n8k16, so each index key is read
// once per request. Keys stream straight from global memory into B fragments: the dot product
// sums over dims, so the k-slot -> dim mapping is permuted to make each lane's slots contiguous
// in memory (16-byte loads), with the query fragments permuted the same way. Each CTA keeps the
// top-k of its chunk; the last CTA of a request (atomic counter, reset by itself) merges the
// chunk lists into the final -1-padded top-k. bf16 cache: bf16 MMA; fp8 cache: the keys convert
// exactly to f16 and the query is rounded to f16 (f16 MMA).
//
// Prefill path: one CTA per (128-token tile of one request, index head); the tile's queries
// stay in registers, key blocks (128 keys) stream through shared memory in bf16 (fp8 converts
// exactly), 8 warps x 16 rows compute 128x128 scores per block with mma.sync, reduce each row
// to the block max and insert it into a per-row running top-k in shared memory. No tokens x
// tokens (or tokens x blocks) matrix is materialised.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/indexer_common.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kMaxTopk = 32;
constexpr int kMaxChunks = 128;

struct IdxArgs {
  const void* q;
  bool q_bf16;
  bool q_fp8_round;  // q_in_cache_dtype with an fp8 cache
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
  float* block_scores;  // optional [tokens, H, mbps]
  float* part_s;        // [num_seqs, chunks, 16, topk]
  int32_t* part_i;
  int32_t* counters;  // [num_seqs]
  float* full_scores;  // baseline: [num_seqs, 16, max_blocks]
  int max_blocks;
  // Prefill: key blocks per split, splits (grid.y), per-split row lists, per-tile counters.
  int pre_kb, pre_splits;
  float* pre_s;  // [tiles, H, splits, kPreRows, topk]
  int32_t* pre_i;
};

constexpr int kDecThreads = 128;

size_t merge_smem_bytes(int topk, int chunks);

// kMode 0: fused (score + chunk top-k + last-CTA merge); 1: baseline step 1 (scores only).
template <bool kFp8, int kMode>
__global__ void __launch_bounds__(kDecThreads) decode_indexer_kernel(IdxArgs a) {
  extern __shared__ float smem[];
  __shared__ float red[2][4][16];
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
  float* sc = smem;  // [16][chunk_blocks]

  // Query fragments (rows g and g + 8 = query vectors), permuted dims.
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
  __syncthreads();

  const int row_bytes = kFp8 ? kDim : kDim * 2;
  const uint32_t block_bytes = uint32_t(kBlock) * row_bytes;
  // Whole cache blocks (contiguous 16 / 32 KB) stream into a ring of shared-memory stages by
  // bulk copies, kStages blocks ahead, so many bytes are in flight without registers.
  constexpr int kStages = kFp8 ? 4 : 3;
  uint8_t* stage = reinterpret_cast<uint8_t*>(smem) + stage_offset(a.chunk_blocks, a.topk, a.chunks);
  uint64_t* bars = reinterpret_cast<uint64_t*>(stage + kStages * block_bytes);
  // The chunk's physical block ids, fetched in parallel up front (one latency, not one per block).
  int* tbl = reinterpret_cast<int*>(reinterpret_cast<uint8_t*>(smem) + table_offset(a.chunk_blocks, a.topk, a.chunks));
  for (int i = threadIdx.x; i < nb; i += kDecThreads) tbl[i] = a.block_tables[int64_t(s) * a.mbps + b0 + i];
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int i) {  // block b0 + i into stage i % kStages (thread 0)
    const int64_t phys = tbl[i];
    bulk_load(stage + (i % kStages) * block_bytes, a.cache + phys * block_bytes, block_bytes, &bars[i % kStages]);
  };
  if (threadIdx.x == 0)
    for (int i = 0; i < min(nb, kStages); ++i) issue(i);
  for (int i = 0; i < nb; ++i) {
    const int b = b0 + i;
    mbar_wait(&bars[i % kStages], uint32_t(i / kStages) & 1u);
    const uint8_t* base = stage + (i % kStages) * block_bytes + warp * 32 * row_bytes;
    KeyRegs<kFp8> kr[4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) kr[nt].load_smem(base + (nt * 8 + g) * row_bytes, q, g);
    float m0, m1;
    warp_block_max<kFp8>(kr, qa, b * kBlock + warp * 32 + 2 * q, pos0, pos1, m0, m1);
    if (q == 0) {
      red[i & 1][warp][v0] = m0;
      red[i & 1][warp][v1] = m1;
    }
    __syncthreads();
    // Every warp is done with this stage: refill it with the block kStages ahead.
    if (threadIdx.x == 0 && i + kStages < nb) issue(i + kStages);
    if (threadIdx.x < nv) {
      const int v = threadIdx.x;
      float m = fmaxf(fmaxf(red[i & 1][0][v], red[i & 1][1][v]), fmaxf(red[i & 1][2][v], red[i & 1][3][v]));
      float score = kNegInf;
      if (b < n_blk_row[v]) score = forced_score(m * a.scale, b, n_blk_row[v], a.init_blocks, a.local_blocks);
      if constexpr (kMode == 1) {
        a.full_scores[(int64_t(s) * 16 + v) * a.max_blocks + b] = score;
      } else {
        sc[v * a.chunk_blocks + i] = score;
      }
    }
  }
  if constexpr (kMode == 1) {
    // Blocks past this request's horizon are never candidates.
    for (int e = threadIdx.x; e < nv * a.chunk_blocks; e += blockDim.x) {
      const int v = e / a.chunk_blocks, b = b0 + e % a.chunk_blocks;
      if (b >= b0 + nb && b < a.max_blocks) a.full_scores[(int64_t(s) * 16 + v) * a.max_blocks + b] = kNegInf;
    }
    return;
  } else {
    __syncthreads();
    finish_chunk(a, sc, s, c, tok0, nv, b0, nb, n_blk_row, smem, &is_last);
  }
}

// Baseline step 2: per (request, chunk), top-k of the score tensor's chunk.
__global__ void __launch_bounds__(kDecThreads) baseline_chunk_topk_kernel(IdxArgs a) {
  extern __shared__ float smem[];
  __shared__ int n_blk_row[16];
  const int s = blockIdx.x / a.chunks, c = blockIdx.x % a.chunks;
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int nv = qlen * a.H;
  if (threadIdx.x < 16)
    n_blk_row[threadIdx.x] = int(threadIdx.x) < nv ? (seq_len - qlen + int(threadIdx.x) / a.H) / kBlock + 1 : 0;
  const int b0 = c * a.chunk_blocks;
  const int nb = max(0, min(a.chunk_blocks, a.max_blocks - b0));
  for (int e = threadIdx.x; e < nv * nb; e += blockDim.x)
    smem[e] = a.full_scores[(int64_t(s) * 16 + e / nb) * a.max_blocks + b0 + e % nb];
  __syncthreads();
  const int K = a.topk;
  select_chunk(a, smem, nb, nv, b0, nb, n_blk_row,
               a.part_s + (int64_t(s) * a.chunks + c) * 16 * K,
               a.part_i + (int64_t(s) * a.chunks + c) * 16 * K);
}

// Baseline step 3: merge per request.
__global__ void __launch_bounds__(kDecThreads) baseline_merge_kernel(IdxArgs a) {
  extern __shared__ float smem[];
  __shared__ int n_blk_row[16];
  const int s = blockIdx.x;
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int nv = qlen * a.H;
  if (threadIdx.x < 16)
    n_blk_row[threadIdx.x] = int(threadIdx.x) < nv ? (seq_len - qlen + int(threadIdx.x) / a.H) / kBlock + 1 : 0;
  __syncthreads();
  merge_request(a, s, nv, n_blk_row, smem);
}

size_t merge_smem_bytes(int topk, int chunks) {
  return (size_t(chunks) * topk * 2 + size_t(topk) * topk * 2 + 4) * sizeof(float);
}

// ---------------------------------------------------------------------------------------------
// Prefill

constexpr int kPreRows = 128;  // query rows per CTA (8 warps x 16)
constexpr int kPreThreads = 256;
constexpr int kKStride = kDim + 8;  // padded smem row (bf16 elems): conflict-free ldmatrix

template <bool kFp8>
__global__ void __launch_bounds__(kPreThreads) prefill_indexer_kernel(IdxArgs a) {
  extern __shared__ uint4 smem_raw[];
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw);  // [128][kKStride]
  float* lst_s = reinterpret_cast<float*>(ks + kBlock * kKStride);  // [kPreRows][topk]
  int* lst_i = reinterpret_cast<int*>(lst_s + kPreRows * a.topk);
  const int h = blockIdx.z, split = blockIdx.y;
  // Find this CTA's (request, tile).
  int tile = blockIdx.x, s = 0;
  for (; s < a.num_seqs; ++s) {
    const int qlen = a.qsl[s + 1] - a.qsl[s];
    const int nt = (qlen + kPreRows - 1) / kPreRows;
    if (tile < nt) break;
    tile -= nt;
  }
  if (s >= a.num_seqs) return;
  const int tok0 = a.qsl[s], qlen = a.qsl[s + 1] - tok0, seq_len = a.seq_lens[s];
  const int r0 = tile * kPreRows;
  const int rows = min(kPreRows, qlen - r0);
  const int pos_first = seq_len - qlen + r0;
  const int pos_last = pos_first + rows - 1;
  const int n_blocks = pos_last / kBlock + 1;
  // This CTA's key blocks; splits past the tile's last block have nothing to do.
  const int nsplit = (n_blocks + a.pre_kb - 1) / a.pre_kb;
  if (split >= nsplit) return;
  const int b_begin = split * a.pre_kb, b_end = min(n_blocks, b_begin + a.pre_kb);
  const int K = a.topk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tid = threadIdx.x;

  for (int e = tid; e < kPreRows * K; e += kPreThreads) {
    lst_s[e] = kNegInf;
    lst_i[e] = -1;
  }
  // Query fragments (standard layout), bf16.
  const int wr0 = warp * 16 + g, wr1 = wr0 + 8;
  uint32_t qa[8][4];
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    float x[2][4];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = rr ? wr1 : wr0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = st * 16 + (i / 2) * 8 + 2 * q + (i % 2);
        x[rr][i] = r < rows ? load_q(a, tok0 + r0 + r, h, d) : 0.f;
      }
    }
    qa[st][0] = pack_bf16x2(x[0][0], x[0][1]);
    qa[st][1] = pack_bf16x2(x[1][0], x[1][1]);
    qa[st][2] = pack_bf16x2(x[0][2], x[0][3]);
    qa[st][3] = pack_bf16x2(x[1][2], x[1][3]);
  }
  const int wpos_lo = pos_first + warp * 16;                 // first row of this warp
  const int wpos_hi = min(pos_last, pos_first + warp * 16 + 15);
  const bool warp_active = warp * 16 < rows;
  const int p0 = pos_first + wr0, p1 = pos_first + wr1;

  constexpr int kLoads = kFp8 ? 4 : 8;  // 16-byte loads per thread per block
  uint4 stage[kLoads];
  auto issue = [&](int b) {
    const int64_t phys = a.block_tables[int64_t(s) * a.mbps + b];
    const uint8_t* src = a.cache + phys * kBlock * kDim * (kFp8 ? 1 : 2);
#pragma unroll
    for (int i = 0; i < kLoads; ++i) stage[i] = ldg_stream(src + (int64_t(tid) + i * kPreThreads) * 16);
  };
  issue(b_begin);
  for (int b = b_begin; b < b_end; ++b) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int cidx = tid + i * kPreThreads;
      if constexpr (kFp8) {
        const int key = cidx / 8, part = cidx % 8;
        uint32_t w[4] = {stage[i].x, stage[i].y, stage[i].z, stage[i].w};
        uint32_t o[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          o[2 * j] = fp8x2_to_bf16x2(uint16_t(w[j] & 0xffff));
          o[2 * j + 1] = fp8x2_to_bf16x2(uint16_t(w[j] >> 16));
        }
        uint4* dst = reinterpret_cast<uint4*>(ks + key * kKStride + part * 16);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
      } else {
        const int key = cidx / 16, part = cidx % 16;
        *reinterpret_cast<uint4*>(ks + key * kKStride + part * 8) = stage[i];
      }
    }
    __syncthreads();
    if (b + 1 < b_end) issue(b + 1);
    // Rows whose own block is before b see no key of it.
    if (warp_active && wpos_hi / kBlock >= b) {
      float acc[16][4];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[nt][j] = 0.f;
#pragma unroll
      for (int st = 0; st < 8; ++st) {
#pragma unroll
        for (int jp = 0; jp < 8; ++jp) {
          const int mi = lane / 8, rr = lane % 8;
          uint32_t bf[4];
          ldmatrix_x4(bf, ks + ((2 * jp + mi / 2) * 8 + rr) * kKStride + st * 16 + (mi % 2) * 8);
          mma_bf16(acc[2 * jp], qa[st], bf[0], bf[1]);
          mma_bf16(acc[2 * jp + 1], qa[st], bf[2], bf[3]);
        }
      }
      float m0 = kNegInf, m1 = kNegInf;
      const bool diag = b * kBlock + kBlock - 1 > wpos_lo;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = b * kBlock + nt * 8 + 2 * q + j;
          if (!diag || key <= p0) m0 = fmaxf(m0, acc[nt][j]);
          if (!diag || key <= p1) m1 = fmaxf(m1, acc[nt][2 + j]);
        }
      }
      quad_max2(m0, m1);
      if (q == 0) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = rr ? wr1 : wr0;
          const int p = rr ? p1 : p0;
          const int nbr = p / kBlock + 1;
          if (r >= rows || b >= nbr) continue;
          const float sc =
              forced_score((rr ? m1 : m0) * a.scale, b, nbr, a.init_blocks, a.local_blocks);
          if (a.block_scores)
            a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b] = sc;
          float* ls = lst_s + r * K;
          int* li = lst_i + r * K;
          if (sc > ls[K - 1]) {
            int k = K - 1;
            while (k > 0 && sc > ls[k - 1]) {
              ls[k] = ls[k - 1];
              li[k] = li[k - 1];
              --k;
            }
            ls[k] = sc;
            li[k] = b;
          }
        }
      }
    }
    __syncthreads();
  }
  if (a.block_scores && split == nsplit - 1) {
    for (int r = warp; r < rows; r += kPreThreads / 32) {
      const int nbr = (pos_first + r) / kBlock + 1;
      for (int b = nbr + lane; b < a.mbps; b += 32)
        a.block_scores[((tok0 + r0 + r) * int64_t(a.H) + h) * a.mbps + b] = kNegInf;
    }
  }
  if (nsplit == 1) {
    for (int e = tid; e < rows * K; e += kPreThreads) {
      const int r = e / K, k = e % K;
      a.topk_idx[((tok0 + r0 + r) * int64_t(a.H) + h) * K + k] = lst_i[e];
    }
  } else {
    // Publish this split's sorted row lists; the tile's last split to finish merges them.
    const int64_t tile_base = (int64_t(blockIdx.x) * a.H + h) * a.pre_splits;
    for (int e = tid; e < rows * K; e += kPreThreads) {
      a.pre_s[(tile_base + split) * kPreRows * K + e] = lst_s[e];
      a.pre_i[(tile_base + split) * kPreRows * K + e] = lst_i[e];
    }
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      int32_t* ctr = a.counters + int64_t(blockIdx.x) * a.H + h;
      is_last = atomicAdd(ctr, 1) == nsplit - 1;
      if (is_last) *ctr = 0;  // every split has arrived: ready for the next launch
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    // k-way merge of the nsplit (<= 32) sorted lists of each row: one warp per row, lane c
    // holds list c's head; K rounds of a warp arg-max under "higher score, then lower id".
    float* st_s = lst_s + warp * (32 * K);  // reuses the row lists + key tile: 8 * 32 * K * 8 B
    int* st_i = reinterpret_cast<int*>(ks) + warp * (32 * K);
    __syncthreads();
    for (int r = warp; r < rows; r += kPreThreads / 32) {
      for (int e = lane; e < nsplit * K; e += 32) {
        const int c = e / K, k = e % K;
        st_s[e] = __ldcg(a.pre_s + ((tile_base + c) * kPreRows + r) * K + k);
        st_i[e] = __ldcg(a.pre_i + ((tile_base + c) * kPreRows + r) * K + k);
      }
      __syncwarp();
      int head = 0, mine = -1;
      for (int k = 0; k < K; ++k) {
        float hs = kNegInf;
        int hi = 0x7fffffff;
        if (lane < nsplit && head < K && st_i[lane * K + head] >= 0)
          hs = st_s[lane * K + head], hi = st_i[lane * K + head];
        float bs = hs;
        int bi = hi;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float os = __shfl_xor_sync(0xffffffffu, bs, o);
          const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
          if (oi != 0x7fffffff && (bi == 0x7fffffff || beats(os, oi, bs, bi))) bs = os, bi = oi;
        }
        if (lane == k) mine = bi == 0x7fffffff ? -1 : bi;
        if (hi == bi && bi != 0x7fffffff) ++head;
      }
      if (lane < K) a.topk_idx[((tok0 + r0 + r) * int64_t(a.H) + h) * K + lane] = mine;
      __syncwarp();
    }
  }
}

}  // namespace

bool indexer_supported(const ops::IndexerParams& p) {
  if (p.index_dim != kDim || p.cache.index_dim != kDim || p.cache.block_size != kBlock) return false;
  if (p.cache.dtype != DType::BF16 && p.cache.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.topk <= 0 || p.topk > kMaxTopk || p.num_index_heads <= 0) return false;
  return true;
}

namespace {

IdxArgs make_args(const ops::IndexerParams& p) {
  IdxArgs a{};
  fill_indexer_args(a, p);
  a.num_seqs = p.batch.num_seqs;
  a.block_scores = p.block_scores;
  a.max_blocks = std::min((p.batch.max_seq_len + kBlock - 1) / kBlock, p.batch.max_blocks_per_seq);
  return a;
}

size_t decode_smem_bytes(const IdxArgs& a, bool fp8) {
  const int stages = fp8 ? 4 : 3;
  return stage_offset(a.chunk_blocks, a.topk, a.chunks) + size_t(stages) * kBlock * kDim * (fp8 ? 1 : 2) +
         8 * stages;
}

void decode_grid(IdxArgs& a) {
  // Two to three CTAs fit an SM (their shared-memory stages): aim at about two per SM.
  const int target = num_sms() * 2;
  int chunks = std::clamp(target / a.num_seqs, 1, kMaxChunks);  // floor: stay within one wave
  chunks = std::min(chunks, std::max(a.max_blocks, 1));
  // At most 1024 blocks per chunk: bounds the chunk's score array in shared memory (64 KB).
  chunks = std::max(chunks, (a.max_blocks + 1023) / 1024);
  a.chunk_blocks = (std::max(a.max_blocks, 1) + chunks - 1) / chunks;
  a.chunks = (std::max(a.max_blocks, 1) + a.chunk_blocks - 1) / a.chunk_blocks;
}

}  // namespace

bool use_decode_indexer(const ops::IndexerParams& p) {
  return p.batch.max_query_len * p.num_index_heads <= 16;
}

// The fused decode variant that kAuto runs by default, from shapes only (graph safe). Measured on
// the H200 (docs/performance.md, graph x16 per call, µs):
//  - v4 with one unit per CTA (v4_single_unit; every unit static) is the fastest for one request
//    (b1 ctx9216: fp8 9.0 vs v2 12.7, bf16 8.7 vs 13.1), with a bf16 cache wherever that plan
//    exists (b32 ctx9216: 25.0 vs v3 29.0; b32 ctx32768: 68.0 vs 77.7; b8 ctx131072: 72.4 vs
//    80.9) and with an fp8 cache from 256 blocks per request (b32 ctx32768: 47.5 vs v2 54.6; b8
//    ctx131072: 50.3 vs 53.7), and with an fp8 cache where its units are at most 8 blocks
//    (b32 ctx9216, units of 6: 19.6-19.8 vs v2 21.2-21.3 since its selection reads a staged row
//    and its query rows are copied first). With fp8 at b128 (units of 24) it lost to v3 (50.0
//    vs 46.3) with the 16-row MMA, and wins with the narrow one (at most 8 query vectors a
//    request, indexer_narrow: 43.4 vs v3's 45.9).
//  - Otherwise v3 (cluster CTAs per request) for 128 requests with fp8 (46.6 vs v2 55.8) and
//    for about 32 requests x 9216 tokens of work with bf16 (b128: 76.5 vs 95.6); v2 below.
// Where v3 / v4 do not support the parameters, v2 runs.
int auto_decode_variant(const ops::IndexerParams& p) {
  const int64_t blocks = std::max(1, std::min((p.batch.max_seq_len + 127) / 128, p.batch.max_blocks_per_seq));
  const int64_t work = blocks * p.batch.num_seqs;  // key blocks of the batch, at most
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;
  // v4 where its one-unit-per-CTA plan exists and measured faster (above).
  const int unit = v4_single_unit(p.batch.num_seqs, blocks, int64_t(v4_ctas_per_sm(fp8, blocks)) * num_sms());
  if (unit > 0 && (!fp8 || unit <= 8 || blocks >= 256 || indexer_narrow(p))) return 4;
  if (fp8) return p.batch.num_seqs >= 64 && work >= 2048 ? 3 : 2;
  return work >= 2048 ? 3 : 2;
}

bool run_indexer_path(const ops::IndexerParams& p, void* stream_v, IndexerPath path) {
  if (!indexer_supported(p)) return false;
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  IdxArgs a = make_args(p);
  const bool fp8 = p.cache.dtype == DType::FP8_E4M3;
  if (path == IndexerPath::kAuto) {
    path = use_decode_indexer(p) ? IndexerPath::kDecodeFused : IndexerPath::kPrefill;
    if (path == IndexerPath::kDecodeFused) {
      int v = kernel_variant();
      if (v == kVariantAuto) v = auto_decode_variant(p);
      if (v == 3 && run_indexer_decode_v3(p, stream_v)) return true;
      if (v == 4 && run_indexer_decode_v4(p, stream_v)) return true;
      if (v >= 2) path = IndexerPath::kDecodeFusedV2;
    }
  }
  if (path == IndexerPath::kDecodeFusedV2) return run_indexer_decode_v2(p, stream_v);
  if (path == IndexerPath::kDecodeFusedV3) return run_indexer_decode_v3(p, stream_v);
  if (path == IndexerPath::kDecodeFusedV4) return run_indexer_decode_v4(p, stream_v);
  if (path == IndexerPath::kPrefill && run_indexer_prefill_v2(p, stream_v)) return true;
  if (path == IndexerPath::kPrefill) path = IndexerPath::kPrefillV1;
  if (path != IndexerPath::kPrefillV1 && !use_decode_indexer(p)) return false;

  if (path == IndexerPath::kPrefillV1) {
    const int tiles = int((p.batch.num_tokens + kPreRows - 1) / kPreRows) + p.batch.num_seqs;
    // Key blocks are split across CTAs so short tiles and long ones both fill the GPU; at most
    // 32 splits per tile (the merge is one warp lane per split).
    const int max_blocks = std::max(1, (p.batch.max_seq_len + kBlock - 1) / kBlock);
    a.pre_kb = std::max(8, (max_blocks + 31) / 32);
    a.pre_splits = (max_blocks + a.pre_kb - 1) / a.pre_kb;
    if (a.pre_splits > 1) {
      const size_t n = size_t(tiles) * p.num_index_heads * a.pre_splits * kPreRows * p.topk;
      char* ws = static_cast<char*>(workspace(stream, n * 8));
      a.pre_s = reinterpret_cast<float*>(ws);
      a.pre_i = reinterpret_cast<int32_t*>(ws + n * 4);
      a.counters = zeroed_counters(stream, size_t(tiles) * p.num_index_heads);
    }
    const size_t smem = size_t(kBlock) * kKStride * 2 + size_t(kPreRows) * p.topk * 8;
    dim3 grid(tiles, a.pre_splits, p.num_index_heads);
    if (fp8) {
      set_smem(prefill_indexer_kernel<true>, smem);
      prefill_indexer_kernel<true><<<grid, kPreThreads, smem, stream>>>(a);
    } else {
      set_smem(prefill_indexer_kernel<false>, smem);
      prefill_indexer_kernel<false><<<grid, kPreThreads, smem, stream>>>(a);
    }
    SIEVE_LAUNCH_CHECK("indexer prefill");
    return true;
  }

  decode_grid(a);
  const size_t part = size_t(a.num_seqs) * a.chunks * 16 * a.topk;
  size_t ws_bytes = part * 8;
  if (path == IndexerPath::kDecodeBaseline) ws_bytes += size_t(a.num_seqs) * 16 * a.max_blocks * 4;
  char* ws = static_cast<char*>(workspace(stream, ws_bytes));
  a.part_s = reinterpret_cast<float*>(ws);
  a.part_i = reinterpret_cast<int32_t*>(ws + part * 4);
  a.full_scores = reinterpret_cast<float*>(ws + part * 8);
  const int grid = a.num_seqs * a.chunks;
  if (path == IndexerPath::kDecodeFused) {
    a.counters = zeroed_counters(stream, size_t(a.num_seqs));
    const size_t smem = decode_smem_bytes(a, fp8);
    if (fp8) {
      set_smem(decode_indexer_kernel<true, 0>, smem);
      decode_indexer_kernel<true, 0><<<grid, kDecThreads, smem, stream>>>(a);
    } else {
      set_smem(decode_indexer_kernel<false, 0>, smem);
      decode_indexer_kernel<false, 0><<<grid, kDecThreads, smem, stream>>>(a);
    }
    SIEVE_LAUNCH_CHECK("indexer decode");
    return true;
  }
  // Baseline: score kernel -> score tensor -> chunk top-k kernel -> merge kernel.
  const size_t smem1 = decode_smem_bytes(a, fp8);
  if (fp8) {
    set_smem(decode_indexer_kernel<true, 1>, smem1);
    decode_indexer_kernel<true, 1><<<grid, kDecThreads, smem1, stream>>>(a);
  } else {
    set_smem(decode_indexer_kernel<false, 1>, smem1);
    decode_indexer_kernel<false, 1><<<grid, kDecThreads, smem1, stream>>>(a);
  }
  SIEVE_LAUNCH_CHECK("indexer baseline score");
  const size_t smem2 = size_t(16) * a.chunk_blocks * 4;
  set_smem(baseline_chunk_topk_kernel, smem2);
  baseline_chunk_topk_kernel<<<grid, kDecThreads, smem2, stream>>>(a);
  SIEVE_LAUNCH_CHECK("indexer baseline topk");
  const size_t smem3 = merge_smem_bytes(a.topk, a.chunks);
  set_smem(baseline_merge_kernel, smem3);
  baseline_merge_kernel<<<a.num_seqs, kDecThreads, smem3, stream>>>(a);
  SIEVE_LAUNCH_CHECK("indexer baseline merge");
  return true;
}

bool run_indexer_graph_check(const ops::IndexerParams& p, IndexerPath path) {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  const bool ok = run_indexer_path(p, s, path);
  cuda_check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  if (ok) {
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int i = 0; i < 2; ++i) cuda_check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaGraphExecDestroy(exec);
  }
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return ok;
}

bool run_indexer(const ops::IndexerParams& p, void* stream) {
  return run_indexer_path(p, stream, IndexerPath::kAuto);
}

}  // namespace sieve::cuda
