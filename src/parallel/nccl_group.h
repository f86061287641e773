// NCCL communicators for tensor-parallel ranks on CUDA devices (ops::Collective over NCCL), one
// rank per GPU. Collectives are enqueued on the op's stream, so CUDA graphs capture them.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace sieve::parallel {

// Whether this build links NCCL.
bool have_nccl();
// A new unique id for a group (rank 0 makes it and hands it to the others: in-process, or
// through parallel::rendezvous across nodes). Its bytes are opaque.
std::string nccl_unique_id();
// Joins the group `unique_id` as `rank` of `size` on CUDA device `device` (the calling thread's
// current device becomes `device`). Throws Error when the group does not form within `timeout`
// (a peer never joined) instead of waiting forever.
std::unique_ptr<ops::Collective> nccl_collective(const std::string& unique_id, int rank, int size, int device,
                                                 std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace sieve::parallel
