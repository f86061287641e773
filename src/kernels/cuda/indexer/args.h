// The one argument struct of the lightning indexer's kernels (cuda/indexer/): the op's
// parameters as every kernel reads them (make_indexer_args), then what the planner (planner.cu)
// adds for the kernel it launches: its grid, its workspace and its options. A kernel reads only
// the fields its comment names; the others stay zero.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cuda {

struct IndexerArgs {
  // ---- The op (make_indexer_args).
  const void* q;
  int q_bf16;
  int q_fp8_round;  // q_in_cache_dtype with an fp8 cache: q rounded to e4m3 first
  int q_rows16;     // q and its row stride 16-byte aligned (cluster: vector loads; persistent: bulk copies)
  int q_async;      // prefill: bf16 q, not rounded, rows 16-byte aligned (cp.async into the tile)
  int64_t q_stride;
  int H;
  float scale;
  const uint8_t* cache;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps;
  int num_seqs;
  int max_blocks;  // blocks of batch.max_seq_len, in [1, mbps]: the grids cover [0, max_blocks)
  int topk, init_blocks, local_blocks;
  int32_t* topk_idx;
  float* block_scores;  // optional [tokens, H, mbps]

  // ---- Grid.
  int chunks, chunk_blocks;  // chunked: chunks a request, blocks a chunk; cluster: blocks a CTA
  int C, G;                  // cluster: CTAs a cluster, cluster groups a request
  int stages;                // cluster, persistent: stages of the key ring
  int unit, upr, dense_units;  // persistent: units of `unit` blocks, upr a request, num_seqs * upr
  int static_units;            // persistent: units blockIdx.x + r * P (r < static_units) are the CTA's own
  int slots;                   // persistent: units in flight a CTA
  uint32_t q_slot_bytes;       // persistent: bytes of a unit's query rows in shared memory
  int kb, splits;              // prefill_long: key blocks a split, splits a tile

  // ---- Workspace.
  float* part_s;  // chunked [num_seqs, chunks, 16, topk]; cluster [num_seqs, G, 16, topk];
  int32_t* part_i;  // prefill_long [tiles, H, splits, 128, topk]
  int32_t* counters;  // chunked [num_seqs]; cluster [num_seqs, C]; prefill_long [tiles, H]
  float* sbuf;        // persistent, prefill: score rows (block_scores, or the workspace)
  int64_t sstride;    // prefill: elements a (token, head) row of sbuf
  int fill_tail;      // persistent: sbuf is block_scores: blocks [n_blk_req, mbps) get -inf
  int32_t* req_done;  // persistent [num_seqs]: blocks scored so far (returned to 0 by the selector)
  uint32_t* rec;      // persistent, polled: [tokens * H][rec_stride] order keys, 0 = not yet written
  int rec_stride;     // persistent, polled: max_blocks rounded up to 4
  int32_t* work;      // persistent: [0] live units claimed past the static ones, [1] CTAs exited
  // prefill: with the selection overlapping the scoring grid, key blocks scored a tile
  // [tokens * H], rows selected a tile [tokens * H], selection CTAs done [1]; else null.
  int32_t* tile_done;
  int32_t* sel_done;
  int32_t* sel_ctas;

  // ---- Options.
  int pdl;           // launched with programmatic stream serialisation (common.cuh)
  int l2_first;      // cluster, persistent: key blocks copied with an L2 evict-first policy
  int merge_ilp;     // cluster: unrolled chunk top-k, branch-free merge searches
  int early_copies;  // persistent: the first unit's old blocks are copied before pdl_wait
  int setup_units;   // prefill: stream-K units of a tile's setup (a key block is one)
  unsigned long long* trace;  // optional development trace (IndexerTuning::trace)
};

// The op's fields of IndexerArgs; everything else zero.
inline IndexerArgs make_indexer_args(const ops::IndexerParams& p) {
  IndexerArgs a{};
  a.q = p.index_q;
  a.q_bf16 = p.q_dtype == DType::BF16;
  a.q_fp8_round = p.q_in_cache_dtype && p.cache.dtype == DType::FP8_E4M3;
  const size_t esz = a.q_bf16 ? 2 : 4;
  a.q_rows16 = reinterpret_cast<uintptr_t>(p.index_q) % 16 == 0 && (size_t(p.q_stride) * esz) % 16 == 0;
  a.q_async = a.q_bf16 && !a.q_fp8_round && a.q_rows16;
  a.q_stride = p.q_stride;
  a.H = p.num_index_heads;
  a.scale = p.score_scale;
  a.cache = static_cast<const uint8_t*>(p.cache.k);
  a.qsl = p.batch.query_start_loc;
  a.seq_lens = p.batch.seq_lens;
  a.block_tables = p.batch.block_tables;
  a.mbps = p.batch.max_blocks_per_seq;
  a.num_seqs = p.batch.num_seqs;
  a.max_blocks = std::max(1, std::min((p.batch.max_seq_len + 127) / 128, p.batch.max_blocks_per_seq));
  a.topk = p.topk;
  a.init_blocks = p.init_blocks;
  a.local_blocks = p.local_blocks;
  a.topk_idx = p.topk_idx;
  a.block_scores = p.block_scores;
  return a;
}

}  // namespace sieve::cuda
