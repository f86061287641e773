// Lightning indexer, long-context prefill kernel (the first prefill kernel; ops::IndexerParams):
// what the planner (planner.cu) runs where the stream-K prefill kernel (prefill.cu) does not
// apply: rows longer than 2048 key blocks, score rows that would not fit its workspace, a cache
// that is not 16-byte aligned.
//
// One CTA per (128-token tile of one request, key split, index head); the tile's queries stay in
// registers, key blocks (128 keys) stream through shared memory in bf16 (fp8 converts exactly),
// 8 warps x 16 rows compute 128x128 scores per block with mma.sync, reduce each row to the block
// max and insert it into a per-row running top-k in shared memory. Splits of kb blocks (at most
// 32 a tile) publish their sorted row lists; the tile's last split to arrive (a counter it
// returns to zero) merges them. No tokens x tokens (or tokens x blocks) matrix is materialised.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/kernels.cuh"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kPreRows = kPrefillLongRows;  // query rows per CTA (8 warps x 16)
constexpr int kPreThreads = 256;
constexpr int kKStride = kDim + 8;  // padded smem row (bf16 elems): conflict-free ldmatrix

template <bool kFp8>
__global__ void __launch_bounds__(kPreThreads) prefill_long_kernel(IndexerArgs a) {
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
  const int nsplit = (n_blocks + a.kb - 1) / a.kb;
  if (split >= nsplit) return;
  const int b_begin = split * a.kb, b_end = min(n_blocks, b_begin + a.kb);
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
    const int64_t tile_base = (int64_t(blockIdx.x) * a.H + h) * a.splits;
    for (int e = tid; e < rows * K; e += kPreThreads) {
      a.part_s[(tile_base + split) * kPreRows * K + e] = lst_s[e];
      a.part_i[(tile_base + split) * kPreRows * K + e] = lst_i[e];
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
        st_s[e] = __ldcg(a.part_s + ((tile_base + c) * kPreRows + r) * K + k);
        st_i[e] = __ldcg(a.part_i + ((tile_base + c) * kPreRows + r) * K + k);
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

void launch_prefill_long(const IndexerArgs& a, bool fp8, int tiles, cudaStream_t stream) {
  const size_t smem = size_t(kBlock) * kKStride * 2 + size_t(kPreRows) * a.topk * 8;
  const dim3 grid(unsigned(tiles), unsigned(a.splits), unsigned(a.H));
  if (fp8) {
    set_smem(prefill_long_kernel<true>, smem);
    prefill_long_kernel<true><<<grid, kPreThreads, smem, stream>>>(a);
  } else {
    set_smem(prefill_long_kernel<false>, smem);
    prefill_long_kernel<false><<<grid, kPreThreads, smem, stream>>>(a);
  }
  SIEVE_LAUNCH_CHECK("indexer prefill long");
}

}  // namespace sieve::cuda
