// Which scratch set a stream's kernels use: the workspace, counters and private scratch of
// common.cu and dense.cu's cuBLAS handle. Every stream shares set 0 of its device unless it was
// given a set of its own: a side stream (kernels/memory.h SideStream), whose kernels run while
// the main stream's do and so must never share a counter, a partial or a workspace with them.
#pragma once

#include <cuda_runtime.h>

namespace sieve::cuda {

// Gives `stream` a set of its own until release_own_scratch (a set an earlier stream released,
// with what it had grown to, else a new empty one).
void claim_own_scratch(cudaStream_t stream);
void release_own_scratch(cudaStream_t stream);
// The set of `stream`'s kernels: 0 unless the stream has claimed one.
int scratch_set(cudaStream_t stream);

}  // namespace sieve::cuda
