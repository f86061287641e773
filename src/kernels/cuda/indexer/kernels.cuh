// What the indexer's planner (planner.cu) needs of its kernels: their shared-memory layouts, the
// limits both sides rely on, residency queries and one launch function per kernel. The grids,
// workspaces and options come in IndexerArgs (args.h); the launch functions only launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/indexer/args.h"
#include "kernels/cuda/indexer/common.cuh"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

// ---- Chunked decode kernel (decode_chunked.cu): grid num_seqs * chunks.
size_t chunked_smem_bytes(const IndexerArgs& a, bool fp8);
void launch_decode_chunked(const IndexerArgs& a, bool fp8, bool narrow, int grid, size_t smem, bool pdl,
                           cudaStream_t stream);

// ---- Cluster decode kernel (decode_cluster.cu): grid num_seqs * G * C CTAs in clusters of C.
constexpr int kClusterMaxChunkBlocks = 256;  // the producer keeps <= 8 table entries a lane
constexpr int kClusterMaxStages = 16;        // <= 32: lane i issues stage i's first copy
// Dynamic shared memory: [16][chunk] maxima/scores, [16][topk] chunk list (scores, ids), the
// chunk's physical block ids, then (128-aligned) the stage ring, reused after the loop as the
// merge buffer, then 2 * stages mbarriers (full, empty).
struct ClusterLayout {
  uint32_t lists_s, lists_i, phys, region, merge_i, bars, total;
};
__host__ __device__ inline ClusterLayout cluster_layout(int chunk_blocks, int topk, int C, int G, int stages,
                                                      uint32_t block_bytes) {
  ClusterLayout L{};
  uint32_t o = uint32_t(16 * chunk_blocks * 4);
  L.lists_s = o;
  o += uint32_t(16 * topk * 4);
  L.lists_i = o;
  o += uint32_t(16 * topk * 4);
  L.phys = o;
  o += uint32_t(chunk_blocks * 4);
  o = (o + 127u) & ~127u;
  L.region = o;
  const uint32_t merge_n = uint32_t((16 / C) * (C > G ? C : G) * topk);
  L.merge_i = o + merge_n * 4;
  const uint32_t ring = uint32_t(stages) * block_bytes, merge = merge_n * 8;
  o += ring > merge ? ring : merge;
  o = (o + 15u) & ~15u;
  L.bars = o;
  o += uint32_t(2 * stages * 8);
  L.total = o;
  return L;
}

// Clusters of C CTAs with `smem` bytes each that the device holds at once (cached; a failed
// query counts as "no limit").
int cluster_resident(bool fp8, bool narrow, int C, uint32_t smem);
void launch_decode_cluster(const IndexerArgs& a, bool fp8, bool narrow, int64_t ctas, uint32_t smem,
                           cudaStream_t stream);

// ---- Persistent decode kernel (decode_persistent.cu): a grid of P resident CTAs.
constexpr int kPersistentMetaInts = 8;
constexpr int kPersistentMaxStatic = 4;  // static units a CTA
struct PersistentLayout {
  uint32_t q, mx, umeta, smeta, cum, cand, mk, keys, bars, total;
};
__host__ __device__ inline PersistentLayout persistent_layout(int stages, int slots, int unit, uint32_t q_slot_bytes,
                                                            int max_blocks, int num_seqs, uint32_t block_bytes) {
  PersistentLayout L{};
  uint32_t o = uint32_t(stages) * block_bytes;  // the stage ring first (128-byte aligned)
  L.q = o;
  o += uint32_t(slots) * q_slot_bytes;
  L.mx = o;
  o += uint32_t(slots) * 16u * uint32_t(unit) * 4u;
  L.umeta = o;
  o += uint32_t(slots) * kPersistentMetaInts * 4u;
  L.smeta = o;
  o += uint32_t(stages) * 4u;
  L.cum = o;
  o += uint32_t(num_seqs + 1) * 4u;
  o = (o + 15u) & ~15u;
  L.cand = o;
  o += kCandCap * 8u;
  L.mk = o;
  o += 128u;
  L.keys = o;
  o += uint32_t(stage_row_words(max_blocks)) * 4u;
  o = (o + 15u) & ~15u;
  L.bars = o;
  o += uint32_t(2 * stages + 3 * slots) * 8u;
  L.total = o;
  return L;
}

// Resident CTAs per SM of the kernel launched with `per_sm` CTAs per SM at `smem` bytes (counter
// finish; the polled build has the same launch bounds and shared memory).
int persistent_resident_per_sm(bool fp8, int per_sm, bool narrow, uint32_t smem);
void launch_decode_persistent(const IndexerArgs& a, bool fp8, int per_sm, bool poll, bool narrow, int ctas,
                              uint32_t smem, bool pdl, cudaStream_t stream);

// ---- Prefill kernels (prefill.cu): the stream-K scoring grid (ctas per head x heads), then the
// selection kernel over `nrows` (token, head) rows of at most a.max_blocks blocks.
constexpr int kPrefillSelMaxBlocks = 2048;  // longest row (blocks) of the selection
void launch_prefill(const IndexerArgs& a, bool fp8, IndexerTuning::PrefillMma mma, int ctas_per_head,
                    int64_t nrows, cudaStream_t stream);

// ---- Long-context prefill kernel (prefill_long.cu): grid (tiles, a.splits, heads).
constexpr int kPrefillLongRows = 128;  // query rows a tile
void launch_prefill_long(const IndexerArgs& a, bool fp8, int tiles, cudaStream_t stream);

}  // namespace sieve::cuda
