// Tensor-core prefill indexer (placeholder until the kernel lands: reports "not supported", so
// run_indexer falls back to the first prefill kernel).
#include "kernels/cuda/internal.h"

namespace sieve::cuda {
bool run_indexer_prefill_v2(const ops::IndexerParams&, void*) { return false; }
}  // namespace sieve::cuda
