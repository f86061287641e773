// Entry points of the CUDA kernels beyond cuda_ops.h, for the benchmark and the tests: forcing
// one implementation path, and the unfused baselines the benchmark compares against.
#pragma once

#include "kernels/ops.h"

namespace sieve::cuda {

enum class IndexerPath {
  kAuto,            // what run_indexer picks
  kDecodeFused,     // score + partial top-k + last-CTA merge, one kernel
  kDecodeBaseline,  // score kernel -> score tensor -> chunk top-k kernel -> merge kernel
  kPrefill,         // tiled tensor-core scoring with a running per-row top-k
};
// Decode path applies when max_query_len * num_index_heads <= 16.
bool use_decode_indexer(const ops::IndexerParams& p);
bool run_indexer_path(const ops::IndexerParams& p, void* stream, IndexerPath path);

}  // namespace sieve::cuda

namespace sieve::cuda {
// Captures the fused decode indexer into a CUDA graph on a private stream, replays it twice and
// waits; for the test that the captured grid gives the eager result.
bool run_indexer_graph_check(const ops::IndexerParams& p);
}  // namespace sieve::cuda
