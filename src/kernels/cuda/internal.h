// Entry points of the CUDA kernels beyond cuda_ops.h, for the tests and the benchmark: running
// one kernel of an op rather than the one its planner picks, and the development aids the
// kernels share. What the kernels may be tuned by is in tuning.h.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace sieve::cuda {

// ---- Lightning indexer (cuda/indexer/; the planner: indexer/planner.cu).
enum class IndexerKernel {
  kAuto,              // what run_indexer runs: the planner's choice for the shape
  kDecodeChunked,     // decode, chunks of a request ranked per CTA + last-CTA merge ("v2")
  kDecodeCluster,     // decode, a thread-block cluster per request merging in shared memory ("v3")
  kDecodePersistent,  // decode, a persistent grid of work units, per-request selection ("v4")
  kPrefill,           // the stream-K prefill kernel (the long-context one where it does not apply)
  kPrefillLong,       // the long-context prefill kernel
};
// What every CUDA indexer kernel supports: index_dim and block_size 128, a bf16 or fp8 cache,
// bf16 or f32 q, 1 <= topk <= 32, at least one index head (the op returns false otherwise).
bool indexer_supported(const ops::IndexerParams& p);
// The decode kernels apply when max_query_len * num_index_heads <= 16.
bool use_decode_indexer(const ops::IndexerParams& p);
// The kernel kAuto tries first for the shape (a decode kernel, or kPrefill).
IndexerKernel planned_indexer_kernel(const ops::IndexerParams& p);
// Runs `kernel` (kAuto: as run_indexer); false where it does not support the parameters (a
// decode kernel on a batch of more query vectors, the cluster or persistent kernel where it has
// no plan for the shape).
bool run_indexer_kernel(const ops::IndexerParams& p, void* stream, IndexerKernel kernel);
// Captures run_indexer_kernel into a CUDA graph on a private stream, replays it twice and waits;
// for the test that the captured grid gives the eager result.
bool run_indexer_graph_check(const ops::IndexerParams& p, IndexerKernel kernel = IndexerKernel::kAuto);

// ---- Attention prefill tiles (attention_prefill.cu): tiles of tokens that share K/V blocks;
// bf16 or fp8 KV, 16 q heads per kv head (tiles of 8 tokens) or 8 (tiles of 16), head_dim and
// block_size 128, tile tokens * topk <= 256.
// run_attention uses them for batches with a chunk of at least 8 new tokens and at least 512 new
// tokens in all (AttentionTuning::prefill_tiles forces them on or off).
bool prefill_attention_supported(const ops::AttentionParams& p);
bool use_prefill_attention(const ops::AttentionParams& p);
bool run_attention_prefill(const ops::AttentionParams& p, void* stream);

// ---- Development aids shared by the kernels (common.cu).
// Whether a decode kernel streams its cache blocks (each read once a call) with an L2
// evict-first policy, so that the stream does not push out what is read again (metadata, query
// rows, scores, merge records): when the call streams at least kL2HintMinBytes (smaller streams
// measured as fast or faster without it). `forced`: a tuning field, -1 for the rule, 0 off, 1 on.
constexpr int64_t kL2HintMinBytes = int64_t(4) << 20;
bool l2_evict_first(int64_t stream_bytes, int forced);
// The traces (the trace fields of tuning.h): for each of `points` trace points, the quantiles of
// the CTAs' timestamps tr[c * slots + i] (ns; 0 = not recorded), in µs from the earliest point-0
// timestamp (trace_origin), to stderr.
unsigned long long trace_origin(const std::vector<unsigned long long>& tr, int slots, int64_t ctas);
void print_trace_quantiles(const char* const* names, int points, int slots, const std::vector<unsigned long long>& tr,
                           int64_t ctas);

}  // namespace sieve::cuda
