// Entry points of the CUDA kernels beyond cuda_ops.h, for the benchmark and the tests: forcing
// one implementation path, and the unfused baselines the benchmark compares against.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace sieve::cuda {

enum class IndexerPath {
  kAuto,            // what run_indexer picks
  kDecodeFused,     // score + partial top-k + last-CTA merge, one kernel
  kDecodeBaseline,  // score kernel -> score tensor -> chunk top-k kernel -> merge kernel
  kPrefill,         // tiled tensor-core scoring with a running per-row top-k
  kDecodeFusedV2,   // variant 2 of the fused decode kernel (indexer_decode_v2.cu)
  kDecodeFusedV3,   // variant 3: cluster CTAs per request, merge in distributed shared memory
                    // (indexer_decode_v3.cu)
  kDecodeFusedV4,   // variant 4: persistent grid taking work units from a counter, per-request
                    // selection from global score rows (indexer_decode_v4.cu)
  kPrefillV1,       // the first prefill kernel (kPrefill uses indexer_prefill.cu when it
                    // supports the parameters, else this one)
};
// What every CUDA indexer kernel supports: index_dim and block_size 128, a bf16 or fp8 cache,
// bf16 or f32 q, 1 <= topk <= 32, at least one index head (the op returns false otherwise).
bool indexer_supported(const ops::IndexerParams& p);
// Decode path applies when max_query_len * num_index_heads <= 16.
bool use_decode_indexer(const ops::IndexerParams& p);
bool run_indexer_path(const ops::IndexerParams& p, void* stream, IndexerPath path);

}  // namespace sieve::cuda

namespace sieve::cuda {
// Captures the fused decode indexer into a CUDA graph on a private stream, replays it twice and
// waits; for the test that the captured grid gives the eager result.
bool run_indexer_graph_check(const ops::IndexerParams& p,
                             IndexerPath path = IndexerPath::kDecodeFused);

// Process-wide variant of the fused decode indexer that IndexerPath::kAuto picks: kVariantAuto
// (default: chosen by shape), or 1, 2, 3, 4 forced. Read once from SIEVE_CUDA_KERNELS=v1|v2|v3|v4
// unless set first; set_kernel_variant overrides it (tests and the benchmark switch it between
// calls; not meant to change during a capture).
constexpr int kVariantAuto = 5;
int kernel_variant();
void set_kernel_variant(int v);

// Variant-2 entry point (also reachable through run_indexer when selected).
bool run_indexer_decode_v2(const ops::IndexerParams& p, void* stream);
// Variant-3 entry point (indexer_decode_v3.cu); false where it does not support the parameters.
bool run_indexer_decode_v3(const ops::IndexerParams& p, void* stream);
// Variant-4 entry point (indexer_decode_v4.cu); false where it does not support the parameters.
bool run_indexer_decode_v4(const ops::IndexerParams& p, void* stream);
// Decode indexer v4's shape rules: resident CTAs per SM (3 with an fp8 cache below 256 blocks
// per request, else 2; SIEVE_V4_CTAS), and the smallest unit of at most 32 key blocks that gives
// every request's `blocks` at most one unit per CTA of `ctas` (0: none does).
int v4_ctas_per_sm(bool fp8, int64_t blocks);
int v4_single_unit(int64_t num_seqs, int64_t blocks, int64_t ctas);
// Tensor-core prefill indexer (indexer_prefill.cu); false where it does not support the
// parameters (the caller then runs the first prefill kernel).
bool run_indexer_prefill_v2(const ops::IndexerParams& p, void* stream);
// Programmatic dependent launch of the decode-step kernels (common.cuh): a mask, 1 cache write,
// 2 decode indexers, 4 attention; SIEVE_PDL, else by default the indexers, and attention for at
// most 4 query tokens. set_pdl(mask) forces a mask, set_pdl(-1) returns to the environment's or
// the default choice.
void set_pdl(int mask);
// Test hook: caps the v2 decode indexer's chunks per request (0 = automatic grid).
void set_indexer_v2_max_chunks(int n);
// Test hook: forces the v3 decode indexer's cluster size (1, 2, 4, 8) and groups per request
// (G > 1: a second, global merge level); 0 = automatic grid.
void set_indexer_v3_split(int cluster, int groups);
// Test hook: forces the v4 decode indexer's blocks per unit, ring stages, CTAs in the grid (at
// most) and static units per CTA; 0 = automatic for each.
void set_indexer_v4_shape(int unit, int stages, int grid, int statics);
// Test hook: attention rows split over several clusters merge through flagged records when the
// whole grid is resident (1, the default) or always through partials and a last-CTA counter (0);
// -1 returns to the environment's choice (SIEVE_ATTN_LL=0 turns the flagged merge off).
void set_attention_flagged_merge(int on);
// Prefill attention over tiles of 8 tokens that share K/V blocks (attention_prefill.cu): bf16 KV,
// 16 q heads per kv head, head_dim and block_size 128, topk <= 32. run_attention uses it for
// batches with a chunk of at least 8 new tokens and at least 512 new tokens in all
// (SIEVE_ATTN_PREFILL=0: never). Test hook: 1 = for every batch it supports, 0 = never, -1 = the
// automatic rule.
void set_attention_prefill_kernel(int mode);
bool prefill_attention_supported(const ops::AttentionParams& p);
bool use_prefill_attention(const ops::AttentionParams& p);
bool run_attention_prefill(const ops::AttentionParams& p, void* stream);

// Test hook: forces the development knobs of the tensor-core prefill indexer
// (indexer_prefill.cu), which are otherwise read once from the environment. -1 = the
// environment's value (or the default where unset). mma: 0 ss, 1 rs, 2 sync, 3 rs3
// (SIEVE_PREFILL_V2_MMA); kb: key blocks per split, 0 = automatic (SIEVE_PREFILL_V2_KB);
// order: 0 or 1 (SIEVE_PREFILL_V2_ORDER); merge: 0 rounds, 1 rank (SIEVE_PREFILL_V2_MERGE);
// select: 0 split lists + merge, 1 global score rows + per-row selection by the tile's last
// split, 2 the same with the selection as its own kernel (SIEVE_PREFILL_V2_SELECT); rows: query
// rows per CTA of the select path with a bf16 cache, 128 or 256 (SIEVE_PREFILL_V2_ROWS); pipe:
// 0 or 1, the 256-row kernel's cross-block pipeline (SIEVE_PREFILL_V2_WIDE_PIPE, default 1).
// overlap: 0 or 1, the selection kernel overlapping the stream-K scoring grid
// (SIEVE_PREFILL_V2_SELECT_OVERLAP, default 1).
struct PrefillV2Knobs {
  int mma = -1, kb = -1, order = -1, merge = -1, select = -1, rows = -1, pipe = -1, streamk = -1, overlap = -1;
};
void set_indexer_prefill_v2_knobs(const PrefillV2Knobs& k);

// Test hook: moe_experts processes at most `tokens` tokens a chunk (0: as many as its 1 GiB
// scratch holds), so the tests cover several chunks with small batches.
void set_moe_chunk_tokens(int64_t tokens);
// Test hook: moe_experts uses its fp32 SIMT products for BF16 weights too (by default these go to
// the tensor cores when hidden and inter are multiples of 8).
void set_moe_force_simt(bool on);
// Test hook: moe_experts' tensor-core tiles of 16 or 64 rows for every batch (0: 16 while a chunk
// has at most 8 (token, expert) pairs an expert on average, else 64).
void set_moe_tile_rows(int rows);

// Development aids of the kernels (common.cu). env_int: the integer value of an environment
// variable, `unset` (default 0) when unset or empty. indexer_trace_enabled: SIEVE_INDEXER_TRACE=1 (read once): the
// decode indexers v3 and v4 synchronise every call made outside a stream capture and print where
// their CTAs spent their time, never on in serving. print_trace_quantiles (those traces and
// SIEVE_ATTN_TRACE's): for each of `points` trace
// points, the quantiles of the CTAs' timestamps tr[c * slots + i] (ns; 0 = not recorded), in µs
// from the earliest point-0 timestamp (trace_origin), to stderr.
int env_int(const char* name, int unset = 0);
bool indexer_trace_enabled();
// Whether the fused decode indexers (v2, v3, v4) score with the narrow MMA
// (warp_block_max_narrow): every request has at most 8 query vectors (query rows x index heads),
// e.g. one decode token with up to 8 index heads. Same outputs bit for bit, half the MMAs a key
// block. SIEVE_INDEXER_NARROW=-1 (development, read once) or the test hook
// set_indexer_narrow(false): never.
bool indexer_narrow(const ops::IndexerParams& p);
void set_indexer_narrow(bool allowed);
// Whether a decode kernel streams its cache blocks (each read once a call) with an L2
// evict-first policy, so that the stream does not push out what is read again (metadata, query
// rows, scores, merge records): when the call streams at least kL2HintMinBytes (smaller streams
// measured as fast or faster without it). `knob`: the environment variable that forces it
// (0 off, 1 on; development, read once by the caller).
// set_l2_evict_first (the tests): 1 / 0 forces it on / off for every such kernel, over the
// knob; -1 restores the rule.
constexpr int64_t kL2HintMinBytes = int64_t(4) << 20;
bool l2_evict_first(int64_t stream_bytes, int knob);
void set_l2_evict_first(int forced);
// SIEVE_INDEXER_L2HINT (decode indexers v3, v4): -1 when unset.
int indexer_l2_knob();
unsigned long long trace_origin(const std::vector<unsigned long long>& tr, int slots, int64_t ctas);
void print_trace_quantiles(const char* const* names, int points, int slots, const std::vector<unsigned long long>& tr,
                           int64_t ctas);
}  // namespace sieve::cuda
