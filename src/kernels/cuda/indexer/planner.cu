// The lightning indexer's host side: which kernel runs a batch, and its grid, workspace and
// options, from shapes only (batch.max_seq_len, num_seqs, max_query_len, the SM count), so a
// CUDA graph captured at one shape replays the same launch at any live lengths below it.
//
// Kernels (cuda/indexer/; docs/kernels.md; "v2".."v4" are their names in docs/performance.md):
//  - decode (max_query_len x index heads <= 16 query vectors a request):
//      persistent (v4, decode_persistent.cu) where its one-unit-per-CTA plan exists, with an
//        fp8 cache only where it measured faster (below), and with an fp8 cache past 2048 (up to
//        4096) blocks a request under the long-context plan (claimed units, persistent_long_plan);
//      cluster (v3, decode_cluster.cu) for large batches without that plan;
//      chunked (v2, decode_chunked.cu) otherwise, and wherever the other two have no plan;
//  - prefill: the stream-K tensor-core kernel and its selection kernel (prefill.cu) for rows of
//    at most 2048 key blocks (262144 positions); the long-context kernel (prefill_long.cu)
//    beyond, or where the score rows would not fit the workspace.
// IndexerTuning (tuning.h) forces grids and options for the tests and the benchmark.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/indexer/kernels.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kMaxTopk = 32;

bool is_fp8(const ops::IndexerParams& p) { return p.cache.dtype == DType::FP8_E4M3; }
uint32_t key_block_bytes(bool fp8) { return uint32_t(kBlock) * kDim * (fp8 ? 1 : 2); }

// Whether the decode kernels score with the narrow MMA (warp_block_max_narrow): every request has
// at most 8 query vectors (query rows x index heads), e.g. one decode token with up to 8 index
// heads. Same outputs bit for bit, half the MMAs a key block.
bool narrow_mma(const ops::IndexerParams& p) {
  return tuning().indexer.narrow_mma && int64_t(p.batch.max_query_len) * p.num_index_heads <= 8;
}

int l2_first(int64_t stream_bytes) { return l2_evict_first(stream_bytes, tuning().indexer.l2_evict_first) ? 1 : 0; }

// ---------------------------------------------------------------------------------------------
// Decode, chunked (v2): about 3 (fp8) / 2 (bf16) resident CTAs per SM, one wave.

constexpr int kChunkedMaxChunks = 128;

bool run_chunked(const ops::IndexerParams& p, cudaStream_t stream) {
  const bool fp8 = is_fp8(p);
  IndexerArgs a = make_indexer_args(p);
  const int target = num_sms() * (fp8 ? 3 : 2);
  int chunks = std::clamp(target / a.num_seqs, 1, kChunkedMaxChunks);
  if (const int cap = tuning().indexer.chunked_max_chunks; cap > 0) chunks = std::min(chunks, cap);
  chunks = std::min(chunks, a.max_blocks);
  // At most 1024 blocks a chunk: bounds the chunk's score array in shared memory (64 KB).
  chunks = std::max(chunks, (a.max_blocks + 1023) / 1024);
  a.chunk_blocks = (a.max_blocks + chunks - 1) / chunks;
  a.chunks = (a.max_blocks + a.chunk_blocks - 1) / a.chunk_blocks;

  const size_t part = size_t(a.num_seqs) * a.chunks * 16 * a.topk;
  char* ws = static_cast<char*>(workspace(stream, part * 8));
  a.part_s = reinterpret_cast<float*>(ws);
  a.part_i = reinterpret_cast<int32_t*>(ws + part * 4);
  a.counters = zeroed_counters(stream, size_t(a.num_seqs));
  launch_decode_chunked(a, fp8, narrow_mma(p), a.num_seqs * a.chunks, chunked_smem_bytes(a, fp8),
                        pdl_enabled(kPdlIndexer, p.batch.num_tokens), stream);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Decode, cluster (v3). Grid = num_seqs x G groups x C CTAs; the C CTAs of a group are one
// thread-block cluster (C in {1, 2, 4, 8}, portable), each taking a contiguous chunk of key
// blocks. C is the largest power of two <= 8 with num_seqs * C <= 2 * SMs (and C <= the blocks of
// max_seq_len); G > 1 only for long contexts (G = min(2 * SMs / (num_seqs * C), max_blocks / (8 *
// C)), at least max_blocks / (256 * C)). The cluster count meant to be one wave is checked
// against cudaOccupancyMaxActiveClusters (clusters must fit in a GPC): smaller C / fewer groups
// if not. On the H200 only 30 clusters of 8 (62 of 4) fit at two CTAs per SM, so b32 ctx9216
// runs as C 4, G 1: 128 CTAs of 18 blocks. Stages: as many as fit ~110 KB a CTA (2 CTAs per SM),
// or ~200 KB with at most one CTA per SM (b1: the whole chunk in flight at once), never more than
// the chunk's blocks.

constexpr int kClusterMaxCluster = 8;
constexpr int kClusterMaxGroups = 64;
constexpr int kClusterMinGroupChunk = 8;  // G > 1 only when every CTA still gets >= 8 blocks
constexpr uint32_t kClusterBudgetShared = 110u * 1024u;
constexpr uint32_t kClusterBudgetAlone = 200u * 1024u;

int pow2_floor(int x) {
  int p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}

int cluster_min_groups(int max_blocks, int C) {
  return (max_blocks + C * kClusterMaxChunkBlocks - 1) / (C * kClusterMaxChunkBlocks);
}

struct ClusterPlan {
  int chunk_blocks, stages;
  ClusterLayout L;
};
ClusterPlan cluster_plan(int max_blocks, int topk, int C, int G, uint32_t budget, uint32_t block_bytes,
                         int max_stages) {
  ClusterPlan pl{};
  pl.chunk_blocks = (max_blocks + G * C - 1) / (G * C);
  const uint32_t fixed = cluster_layout(pl.chunk_blocks, topk, C, G, 0, block_bytes).region + 256;
  int st = budget > fixed ? int((budget - fixed) / block_bytes) : 1;
  pl.stages = std::min(std::clamp(st, 1, kClusterMaxStages), pl.chunk_blocks);
  if (max_stages > 0) pl.stages = std::min(pl.stages, max_stages);
  pl.L = cluster_layout(pl.chunk_blocks, topk, C, G, pl.stages, block_bytes);
  return pl;
}

bool run_cluster(const ops::IndexerParams& p, cudaStream_t stream) {
  const IndexerTuning& tu = tuning().indexer;
  const bool fp8 = is_fp8(p);
  const int N = p.batch.num_seqs;
  IndexerArgs a = make_indexer_args(p);
  const int max_blocks = a.max_blocks;
  const bool narrow = narrow_mma(p);
  const uint32_t block_bytes = key_block_bytes(fp8);
  const int target = 2 * num_sms();
  const int force_c = tu.cluster_size, force_g = tu.cluster_groups;
  const uint32_t budget_shared = tu.cluster_budget_kb > 0 ? uint32_t(tu.cluster_budget_kb) * 1024u : kClusterBudgetShared;
  const uint32_t budget_alone = tu.cluster_budget_kb > 0 ? uint32_t(tu.cluster_budget_kb) * 1024u : kClusterBudgetAlone;
  auto auto_groups = [&](int C) {
    int G = force_g > 0 ? std::min(force_g, kClusterMaxGroups)
                        : std::max(1, std::min(int(target / (int64_t(N) * C)), max_blocks / (C * kClusterMinGroupChunk)));
    return std::max(G, cluster_min_groups(max_blocks, C));
  };
  int C = kClusterMaxCluster;
  if (force_c > 0) {
    C = pow2_floor(std::min(force_c, kClusterMaxCluster));
  } else {
    while (C > 1 && (int64_t(N) * C > target || C > max_blocks)) C /= 2;
  }
  int G = auto_groups(C);
  ClusterPlan plan = cluster_plan(max_blocks, p.topk, C, G, budget_shared, block_bytes, tu.cluster_max_stages);
  if (force_c <= 0 && force_g <= 0) {
    // Meant as one wave at two CTAs per SM: check that the clusters fit (GPC sizes), else use
    // smaller clusters / fewer groups.
    int act = cluster_resident(fp8, narrow, C, plan.L.total);
    while (C > 1 && N > act) {
      C /= 2;
      G = auto_groups(C);
      plan = cluster_plan(max_blocks, p.topk, C, G, budget_shared, block_bytes, tu.cluster_max_stages);
      act = cluster_resident(fp8, narrow, C, plan.L.total);
    }
    if (int64_t(N) * G > act && G > cluster_min_groups(max_blocks, C)) {
      G = std::max(cluster_min_groups(max_blocks, C), act / N);
      plan = cluster_plan(max_blocks, p.topk, C, G, budget_shared, block_bytes, tu.cluster_max_stages);
    }
  }
  if (G > kClusterMaxGroups) return false;
  // At most one CTA per SM: give each CTA the whole shared memory (more stages in flight) when
  // all the clusters still fit at once.
  if (int64_t(N) * G * C <= num_sms()) {
    const ClusterPlan big = cluster_plan(max_blocks, p.topk, C, G, budget_alone, block_bytes, tu.cluster_max_stages);
    if (big.stages > plan.stages && int64_t(N) * G <= cluster_resident(fp8, narrow, C, big.L.total)) plan = big;
  }
  const uint32_t smem = plan.L.total;
  if (smem + 1024u > 227u * 1024u) return false;
  const int64_t ctas = int64_t(N) * G * C;
  if (ctas > int64_t(0x7fffffff)) return false;

  a.C = C;
  a.G = G;
  a.chunk_blocks = plan.chunk_blocks;
  a.stages = plan.stages;
  a.merge_ilp = tu.cluster_merge_ilp ? 1 : 0;
  a.pdl = pdl_enabled(kPdlIndexer, p.batch.num_tokens) ? 1 : 0;
  if (G > 1) {
    const size_t part = size_t(N) * G * 16 * p.topk;
    char* ws = static_cast<char*>(workspace(stream, part * 8));
    a.part_s = reinterpret_cast<float*>(ws);
    a.part_i = reinterpret_cast<int32_t*>(ws + part * 4);
    a.counters = zeroed_counters(stream, size_t(N) * C);
  }
  a.l2_first = l2_first(int64_t(N) * max_blocks * block_bytes);
  launch_decode_cluster(a, fp8, narrow, ctas, smem, stream);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Decode, persistent (v4): a grid of the CTAs resident at once taking work units of U key
// blocks; one unit per CTA (every unit static, polled finish) where the batch fits.

constexpr int kPersistentMaxUnit = 32;    // blocks a unit: a producer lane holds one block-table entry each
constexpr int kPersistentMaxSlots = 8;    // units in flight a CTA
constexpr int kPersistentMaxStages = 16;
constexpr int kPersistentMaxBlocks = 2048;  // blocks a request (the selection stages a row's keys)
constexpr int kPersistentLongMaxBlocks = 4096;  // the same under the long-context plan (16 KB of keys)
constexpr int kPersistentLongMinBlocks = 512;   // the long-context plan's shortest request (blocks)
constexpr int kPersistentMaxSeqs = 1024;    // requests (the live-unit prefix sums are in shared memory)

// The smallest unit of at most 32 key blocks that gives every request's `blocks` at most one unit
// per CTA of `ctas` (0: none does).
int persistent_single_unit(int64_t num_seqs, int64_t blocks, int64_t ctas) {
  for (int u = 1; u <= kPersistentMaxUnit; ++u)
    if (num_seqs * ((blocks + u - 1) / u) <= ctas) return u;
  return 0;
}

// fp8: three CTAs per SM (24 consumer warps at 64 registers, with spills: the scoring loop, not
// the copies, bounds the fp8 stream) below 256 blocks per request, two from there (16 warps at
// 80 registers, no spills). bf16: two (its registers allow no more). Measured (graph x16, µs, one
// unit per CTA either way): b32 ctx32768 47.0 -> 42.6, b8 ctx131072 50.0 -> 46.8; b32 ctx9216
// 20.9 -> 21.4 and b128 ctx9216 52.6 -> 62.8 went the other way, b1 ctx9216 9.0 either way.
int persistent_ctas_per_sm(bool fp8, int64_t blocks) {
  const int forced = tuning().indexer.persistent_ctas_per_sm;
  return std::clamp(forced > 0 ? forced : fp8 ? (blocks >= 256 ? 2 : 3) : 2, 1, fp8 ? 3 : 2);
}

// The long-context plan (IndexerTuning::persistent_long_unit): with an fp8 cache and requests of
// 512 to 4096 key blocks, small units claimed from the counter with the polled finish instead of
// one static unit a CTA. With one static unit a CTA, a CTA whose copies are served late (the
// grid's first copies alone, ~20 MB requested at once, arrive over ~4 us) still has its whole
// share to stream when the others are done: at b8 ctx131072 the CTAs' consumers were done at
// 32.5-33.1 us (median) and 35.6-36.3 (last), and the selection waits for the last. Claimed
// units of 2 blocks let the early CTAs take the late ones' work, so the data ends within about
// a unit of each other. The polled finish keeps a unit's finisher at a few relaxed stores (no
// release fence and counter a unit, which at 2 blocks a unit would be as long as the unit).
// By default it replaces v2 where v4 had no plan for the length (2049..4096 blocks): on an H100,
// b8 ctx524288 202.8 us against v2's 228.7 (graph x16), b1 ctx524288 42.9 against 42.7. Where
// the one-unit-a-CTA plan exists it lost (b8 ctx131072 66.7 against 53.5 us), so it replaces
// that plan only when persistent_long_unit is set (> 0).
bool persistent_long_plan(const ops::IndexerParams& p, int64_t blocks) {
  const int u = tuning().indexer.persistent_long_unit;
  if (!is_fp8(p) || u < 0 || blocks < kPersistentLongMinBlocks || blocks > kPersistentLongMaxBlocks ||
      p.batch.num_seqs > kPersistentMaxSeqs)
    return false;
  return blocks > kPersistentMaxBlocks ||
         (u > 0 &&
          persistent_single_unit(p.batch.num_seqs, blocks, int64_t(persistent_ctas_per_sm(true, blocks)) * num_sms()) > 0);
}

bool run_persistent(const ops::IndexerParams& p, cudaStream_t stream) {
  const IndexerTuning& tu = tuning().indexer;
  const bool fp8 = is_fp8(p);
  const int N = p.batch.num_seqs;
  IndexerArgs a = make_indexer_args(p);
  const int max_blocks = a.max_blocks;
  const bool long_plan = persistent_long_plan(p, max_blocks);
  if (max_blocks > (long_plan ? kPersistentLongMaxBlocks : kPersistentMaxBlocks) || N > kPersistentMaxSeqs) return false;
  const uint32_t block_bytes = key_block_bytes(fp8);
  const size_t esz = a.q_bf16 ? 2 : 4;
  const int nv_max = std::min(16, std::max(1, p.batch.max_query_len * p.num_index_heads));
  const uint32_t q_slot_bytes = uint32_t((size_t(nv_max) * kDim * esz + 15) / 16 * 16);

  // CTAs per SM, the ring that fits the shared-memory budget, units of U blocks (below).
  const int per_sm = persistent_ctas_per_sm(fp8, max_blocks);
  const bool narrow = narrow_mma(p);
  const uint32_t budget = per_sm == 1 ? 200u * 1024u : per_sm == 2 ? 110u * 1024u : 72u * 1024u;
  const int slots = int(std::clamp<uint32_t>(16384u / q_slot_bytes, 2u, uint32_t(kPersistentMaxSlots)));
  const int64_t work_blocks = int64_t(N) * max_blocks;
  const int p_full = per_sm * num_sms();
  // One unit per CTA when the batch fits (the smallest such U): every unit is static, no claims,
  // and each CTA pays one query copy, one finish. Otherwise about 4 units per resident CTA.
  // The long-context plan: units of 2 blocks (the static ones fill the ring), the rest claimed.
  int unit = long_plan ? 0 : persistent_single_unit(N, max_blocks, p_full);
  const bool single = unit > 0;
  if (long_plan) unit = tu.persistent_long_unit > 0 ? std::min(tu.persistent_long_unit, kPersistentMaxUnit) : 2;
  else if (!single) unit = int(std::clamp<int64_t>((work_blocks + 4 * int64_t(p_full) - 1) / (4 * int64_t(p_full)), 1, 8));
  if (tu.persistent_unit > 0) unit = std::min(tu.persistent_unit, kPersistentMaxUnit);
  const PersistentLayout fixed = persistent_layout(0, slots, unit, q_slot_bytes, max_blocks, N, block_bytes);
  int stages = fixed.total + 256 < budget ? int((budget - fixed.total - 256) / block_bytes) : 1;
  stages = std::clamp(stages, 2, kPersistentMaxStages);
  if (tu.persistent_stages > 0) stages = std::clamp(tu.persistent_stages, 1, kPersistentMaxStages);
  const uint32_t smem = persistent_layout(stages, slots, unit, q_slot_bytes, max_blocks, N, block_bytes).total;
  if (smem + 1024u > 227u * 1024u) return false;
  const int upr = (max_blocks + unit - 1) / unit;
  const int64_t dense_units = int64_t(N) * upr;
  if (dense_units > int64_t(1) << 30) return false;
  // The counter build sizes the grid; the polled build (chosen below, once the grid shows every
  // unit static) has the same launch bounds and shared memory, so the same residency.
  const int resident = std::max(1, std::min(per_sm, persistent_resident_per_sm(fp8, per_sm, narrow, smem))) * num_sms();
  int P = int(std::min<int64_t>(dense_units, resident));
  if (tu.persistent_grid > 0) P = std::min(P, tu.persistent_grid);

  a.unit = unit;
  a.upr = upr;
  a.dense_units = int(dense_units);
  a.static_units = single ? 1 : std::clamp(stages / unit, 1, kPersistentMaxStatic);
  if (tu.persistent_statics > 0) a.static_units = std::min(tu.persistent_statics, kPersistentMaxStatic);
  a.stages = stages;
  a.slots = slots;
  a.q_slot_bytes = q_slot_bytes;
  if (p.block_scores) {
    a.sbuf = p.block_scores;
    a.fill_tail = 1;
  } else {
    a.sbuf = static_cast<float*>(workspace(stream, size_t(p.batch.num_tokens) * p.num_index_heads * a.mbps * 4));
  }
  // Every CTA of the grid is resident at once (P is at most what fits), so the CTA of a
  // request's last block can wait for the others' scores by polling them: where every unit is
  // static, and with claimed units under the long-context plan (persistent_claim_poll). Claims
  // are in unit order and each finisher takes its units in order, so a polling finisher waits
  // only for units numbered below its own, and the lowest unit not yet scored always can be:
  // no CTA waits in a cycle.
  const bool all_static = int64_t(a.static_units) * P >= dense_units;
  const bool claim_poll = tu.persistent_claim_poll > 0 || (tu.persistent_claim_poll < 0 && long_plan);
  const bool poll = (all_static || claim_poll) && tu.persistent_poll;
  if (poll) {
    a.rec_stride = (max_blocks + 3) & ~3;
    a.rec = static_cast<uint32_t*>(private_scratch(
        stream, kScratchIndexerPoll, size_t(p.batch.num_tokens) * p.num_index_heads * a.rec_stride * 4));
  }
  int32_t* counters = zeroed_counters(stream, size_t(N) + 2);
  a.req_done = counters;
  a.work = counters + N;

  const bool pdl = pdl_enabled(kPdlIndexer, p.batch.num_tokens);
  // Query rows first (no early copies) where the consumers, not the copies, set the pace and the
  // first unit has several blocks: fp8 units of 2..8 blocks (b32 ctx9216 fp8, units of 6: 19.6-19.8
  // vs 20.1 us; the query rows landed 2 us after the first block, traces). With one block a unit
  // (b1: 8.1 vs 8.6), bf16 (b32 ctx9216: 24.8 vs 25.0) and units of 32 the old order measured
  // as fast or faster.
  const bool q_first = fp8 && unit >= 2 && unit <= 8;
  a.early_copies = pdl || !q_first || tu.persistent_early_copies ? 1 : 0;
  a.l2_first = l2_first(int64_t(N) * max_blocks * block_bytes);
  launch_decode_persistent(a, fp8, per_sm, poll, narrow, P, smem, pdl, stream);
  return true;
}

// ---------------------------------------------------------------------------------------------
// The decode kernel for a shape. Measured on the H200 (docs/performance.md, graph x16 per call,
// µs):
//  - persistent with one unit per CTA is the fastest for one request (b1 ctx9216: fp8 9.0 vs
//    chunked 12.7, bf16 8.7 vs 13.1), with a bf16 cache wherever that plan exists (b32 ctx9216:
//    25.0 vs cluster 29.0; b32 ctx32768: 68.0 vs 77.7; b8 ctx131072: 72.4 vs 80.9) and with an
//    fp8 cache from 256 blocks per request (b32 ctx32768: 47.5 vs chunked 54.6; b8 ctx131072:
//    50.3 vs 53.7), and with an fp8 cache where its units are at most 8 blocks (b32 ctx9216,
//    units of 6: 19.6-19.8 vs chunked 21.2-21.3 since its selection reads a staged row and its
//    query rows are copied first). With fp8 at b128 (units of 24) it lost to cluster (50.0 vs
//    46.3) with the 16-row MMA, and wins with the narrow one (at most 8 query vectors a
//    request: 43.4 vs cluster's 45.9).
//  - Otherwise cluster for 128 requests with fp8 (46.6 vs chunked 55.8) and for about 32
//    requests x 9216 tokens of work with bf16 (b128: 76.5 vs 95.6); chunked below.
IndexerKernel decode_kernel_for(const ops::IndexerParams& p) {
  const int64_t blocks = std::max(1, std::min((p.batch.max_seq_len + 127) / 128, p.batch.max_blocks_per_seq));
  const int64_t work = blocks * p.batch.num_seqs;  // key blocks of the batch, at most
  const bool fp8 = is_fp8(p);
  if (persistent_long_plan(p, blocks)) return IndexerKernel::kDecodePersistent;
  const int unit = persistent_single_unit(p.batch.num_seqs, blocks,
                                          int64_t(persistent_ctas_per_sm(fp8, blocks)) * num_sms());
  if (unit > 0 && (!fp8 || unit <= 8 || blocks >= 256 || narrow_mma(p))) return IndexerKernel::kDecodePersistent;
  if (fp8) return p.batch.num_seqs >= 64 && work >= 2048 ? IndexerKernel::kDecodeCluster : IndexerKernel::kDecodeChunked;
  return work >= 2048 ? IndexerKernel::kDecodeCluster : IndexerKernel::kDecodeChunked;
}

// ---------------------------------------------------------------------------------------------
// Prefill (prefill.cu): the stream-K scoring grid (2 CTAs per SM per index head, each an equal
// share of the head's causal work) writes every row's block scores into score rows
// [num_tokens, H, max_blocks] (block_scores itself when requested, else the workspace), and the
// selection kernel takes each row's top-k, overlapping the scoring grid's tail. False (the
// long-context kernel runs) for rows past kPrefillSelMaxBlocks blocks, score rows over 512 MB,
// or a cache not 16-byte aligned.

bool run_prefill(const ops::IndexerParams& p, cudaStream_t stream) {
  const IndexerTuning& tu = tuning().indexer;
  if (reinterpret_cast<uintptr_t>(p.cache.k) % 16 != 0) return false;
  const ops::BatchView& bv = p.batch;
  IndexerArgs a = make_indexer_args(p);
  const int max_blocks = a.max_blocks;
  const bool fp8 = is_fp8(p);
  if (max_blocks > kPrefillSelMaxBlocks) return false;
  if (!p.block_scores && int64_t(bv.num_tokens) * p.num_index_heads * max_blocks * 4 > (int64_t(512) << 20)) return false;
  const int64_t full_tiles = (bv.num_tokens + 127) / 128;
  if (full_tiles + bv.num_seqs > 0x7fffffff || p.num_index_heads > 65535) return false;
  // Causal work estimate in (tile, block) units, as for one request whose new tokens end at
  // max_seq_len (tile i of n sees the prefix and blocks up to its own: max_blocks - n / 2 on
  // average).
  const int64_t work = std::max<int64_t>(1, full_tiles * std::max<int64_t>(1, max_blocks - full_tiles / 2));

  if (p.block_scores) {
    a.sbuf = p.block_scores;
    a.sstride = bv.max_blocks_per_seq;
  } else {
    a.sbuf = static_cast<float*>(workspace(stream, size_t(bv.num_tokens) * p.num_index_heads * max_blocks * 4));
    a.sstride = max_blocks;
  }
  a.setup_units = std::clamp(tu.prefill_setup_units, 0, 64);
  if (tu.prefill_overlap) {
    const size_t n = size_t(bv.num_tokens) * p.num_index_heads;
    int32_t* ctr = zeroed_counters(stream, 2 * n + 1);
    a.tile_done = ctr;
    a.sel_done = ctr + n;
    a.sel_ctas = ctr + 2 * n;
  }
  const int ctas_per_head = int(std::max<int64_t>(1, 2 * num_sms() / p.num_index_heads));
  // The MMA with a bf16 cache: rs (query fragments in registers; 32768 prompt tokens on the
  // H200: 296 vs 307 us with ss), as rsp (half blocks, pipelined) where a CTA's share is at least
  // 16 key blocks (32768 prompt tokens: 264-268 vs 288-292 us; 8192 after 57344: 237 vs 256; at
  // 8192 prompt tokens, 8 blocks a CTA, no clear difference in the run-to-run spread). ss with
  // fp8 (the fp8 rs instantiation spills).
  using Mma = IndexerTuning::PrefillMma;
  Mma mma = fp8 ? Mma::kSS : work >= 16 * int64_t(ctas_per_head) ? Mma::kRSP : Mma::kRS;
  if (tu.prefill_mma != Mma::kAuto) mma = tu.prefill_mma;
  launch_prefill(a, fp8, mma, ctas_per_head, int64_t(bv.num_tokens) * p.num_index_heads, stream);
  return true;
}

// Long-context prefill (prefill_long.cu): key blocks split across CTAs so short tiles and long
// ones both fill the GPU; at most 32 splits per tile (the merge is one warp lane per split).
bool run_prefill_long(const ops::IndexerParams& p, cudaStream_t stream) {
  IndexerArgs a = make_indexer_args(p);
  const int tiles = int((p.batch.num_tokens + kPrefillLongRows - 1) / kPrefillLongRows) + p.batch.num_seqs;
  const int max_blocks = std::max(1, (p.batch.max_seq_len + kBlock - 1) / kBlock);
  a.kb = std::max(8, (max_blocks + 31) / 32);
  a.splits = (max_blocks + a.kb - 1) / a.kb;
  if (a.splits > 1) {
    const size_t n = size_t(tiles) * p.num_index_heads * a.splits * kPrefillLongRows * p.topk;
    char* ws = static_cast<char*>(workspace(stream, n * 8));
    a.part_s = reinterpret_cast<float*>(ws);
    a.part_i = reinterpret_cast<int32_t*>(ws + n * 4);
    a.counters = zeroed_counters(stream, size_t(tiles) * p.num_index_heads);
  }
  launch_prefill_long(a, is_fp8(p), tiles, stream);
  return true;
}

}  // namespace

bool indexer_supported(const ops::IndexerParams& p) {
  if (p.index_dim != kDim || p.cache.index_dim != kDim || p.cache.block_size != kBlock) return false;
  if (p.cache.dtype != DType::BF16 && p.cache.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.topk <= 0 || p.topk > kMaxTopk || p.num_index_heads <= 0) return false;
  return true;
}

bool use_decode_indexer(const ops::IndexerParams& p) { return p.batch.max_query_len * p.num_index_heads <= 16; }

IndexerKernel planned_indexer_kernel(const ops::IndexerParams& p) {
  return use_decode_indexer(p) ? decode_kernel_for(p) : IndexerKernel::kPrefill;
}

bool run_indexer_kernel(const ops::IndexerParams& p, void* stream_v, IndexerKernel kernel) {
  if (!indexer_supported(p)) return false;
  if (p.batch.num_seqs == 0 || p.batch.num_tokens == 0) return true;
  const bool decode = use_decode_indexer(p);
  const bool decode_kernel = kernel == IndexerKernel::kDecodeChunked || kernel == IndexerKernel::kDecodeCluster ||
                             kernel == IndexerKernel::kDecodePersistent;
  if (decode_kernel && !decode) return false;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);
  switch (kernel) {
    case IndexerKernel::kAuto:
      if (decode) {
        // The cluster and persistent kernels have no plan for some shapes: the chunked one runs.
        const IndexerKernel k = decode_kernel_for(p);
        if (k == IndexerKernel::kDecodeCluster && run_cluster(p, stream)) return true;
        if (k == IndexerKernel::kDecodePersistent && run_persistent(p, stream)) return true;
        return run_chunked(p, stream);
      }
      return run_prefill(p, stream) || run_prefill_long(p, stream);
    case IndexerKernel::kDecodeChunked: return run_chunked(p, stream);
    case IndexerKernel::kDecodeCluster: return run_cluster(p, stream);
    case IndexerKernel::kDecodePersistent: return run_persistent(p, stream);
    case IndexerKernel::kPrefill: return run_prefill(p, stream) || run_prefill_long(p, stream);
    case IndexerKernel::kPrefillLong: return run_prefill_long(p, stream);
  }
  return false;
}

bool run_indexer(const ops::IndexerParams& p, void* stream) {
  return run_indexer_kernel(p, stream, IndexerKernel::kAuto);
}

bool run_indexer_graph_check(const ops::IndexerParams& p, IndexerKernel kernel) {
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  const bool ok = run_indexer_kernel(p, s, kernel);
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

}  // namespace sieve::cuda
