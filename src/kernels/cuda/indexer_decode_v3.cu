// Decode lightning indexer, variant 3 (placeholder until the kernel lands: reports "not
// supported", so run_indexer falls back to variant 2).
#include "kernels/cuda/internal.h"

namespace sieve::cuda {
bool run_indexer_decode_v3(const ops::IndexerParams&, void*) { return false; }
}  // namespace sieve::cuda
