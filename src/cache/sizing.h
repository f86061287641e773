// How many cache blocks to allocate, and which block sizes a model accepts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sieve::cache {

// Default CPU cache budget when --kv-cache-memory is not given.
inline constexpr uint64_t kDefaultCpuCacheBytes = 512ull << 20;

// "536870912", "512MiB", "512M", "4GiB", "1.5G" (K/M/G/T, binary multiples; "B" optional).
// Throws Error naming `flag` on anything else.
uint64_t parse_bytes(const std::string& text, const std::string& flag);

// Blocks that fit in `bytes`; throws Error naming `what` when not even one does.
int64_t blocks_for_bytes(uint64_t bytes, size_t bytes_per_block, const std::string& what);

// vLLM's rule on a GPU: the engine may use `utilization` of the device's total memory; what is
// already in use (weights, workspace, other processes) comes off that budget, the rest is cache.
int64_t blocks_for_gpu(size_t total_bytes, size_t free_bytes, double utilization,
                       size_t bytes_per_block);

// Sparse models need one cache page per sparse block; the block size must equal it (128).
void check_block_size(int block_size, int model_block_size, bool sparse_model);

}  // namespace sieve::cache
