// What the decode attention kernel (decode_kernel.cu) and its host planner (planner.cu) share:
// the limits, the shared-memory geometry, the argument struct, and the launch entry points.
// The design is described at the top of decode_kernel.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace sieve::cuda::attn {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kGroupWarps = 4;  // warps of a consumer group (32 keys each)
// Consumer groups (kGroups, a template parameter: 1 or 2) take alternate units; a CTA has
// kGroups * 4 consumer warps and one producer warp.
template <int kGroups>
constexpr int threads_of() {
  return (kGroupWarps * kGroups + 1) * 32;
}
constexpr int kMaxConsumers = 2 * kGroupWarps;
constexpr int kMaxSplits = 128;
constexpr int kMaxCluster = 8;
constexpr int kMaxStages = 12;
constexpr int kRing = 16;  // unit ids in flight between producer and consumers (>= stages / 2 + 1)
constexpr int kCoStride = kDim + 4;
__host__ __device__ constexpr int co_index(int r, int d) { return r * kCoStride + d + (d >> 5); }
// Shared memory for the merges (reusing the slot ring after the loop): the 4 warps' O, then
// the CTA's O (at a fixed offset: other CTAs of the cluster read it).
constexpr size_t kWarpOBytes = size_t(kMaxConsumers) * 64 * 32 * 4;
constexpr size_t kMergeBytes = kWarpOBytes + size_t(16) * kCoStride * 4;
// The Q rows of one kv group (up to 16 heads, f32 at most), after the slot ring and the merge space.
constexpr size_t kQBytes = size_t(16) * kDim * 4;

template <bool kFp8>
struct Geo {
  static constexpr int kRowBytes = kFp8 ? kDim : kDim * 2;
  static constexpr int kDataBytes = kBlock * kRowBytes;
  static constexpr int kScaleBytes = kFp8 ? kBlock * 4 : 0;
  static constexpr int kSlotBytes = kDataBytes + kScaleBytes;
  // Slots per CTA: ~200 KB with one CTA per SM (two consumer groups), ~100 KB with two.
  static constexpr int kMaxSlots2 = kFp8 ? 12 : 6;
  static constexpr int kMaxSlots1 = kFp8 ? 6 : 3;
};
// Offset of the Q rows in dynamic shared memory: past the slot ring and the merge space.
template <bool kFp8>
__host__ __device__ constexpr size_t q_offset(int stages) {
  const size_t ring = size_t(stages) * Geo<kFp8>::kSlotBytes;
  return ((ring > kMergeBytes ? ring : kMergeBytes) + 127) / 128 * 128;
}

struct AttnArgs {
  const void* q;
  bool q_bf16;
  bool q_vec;  // q and q_stride allow 8-byte (bf16) / 16-byte (f32) loads of 4 elements
  bool q_bulk;  // a kv group's Q rows come by one bulk copy into shared memory (16-byte aligned rows)
  int64_t q_stride;
  void* out;
  bool out_bf16;
  int64_t out_stride;
  bool out_vec;  // out and out_stride allow 16-byte (f32) / 8-byte (bf16) stores
  int nkv, gqa;
  float scale_log2;  // sm_scale * log2(e)
  const uint8_t* k;
  const uint8_t* v;
  const float* k_scale;
  const float* v_scale;
  const int32_t* qsl;
  const int32_t* seq_lens;
  const int32_t* block_tables;
  int mbps, num_seqs;
  const int32_t* topk_idx;
  int topk;
  int splits, cluster, groups, per_split, stages;
  int cgroups;  // consumer groups of the launched kernel (host side)
  float* part_o;      // [rows, groups, 16, 128]
  float* part_ml;     // [rows, groups, 16, 2]
  int32_t* counters;  // [rows], zero between calls
  // Flagged merge (ll): partials go to `ll_buf` as flagged records that the row's first cluster
  // waits for, instead of through part_o / part_ml and the last-CTA counter (see cluster_merge).
  bool ll;
  uint4* ll_buf;  // [rows][groups - 1][16][kDim / kN] records of kLLChunks x 16 bytes, zero between calls
  bool l2_first;  // K/V copies with an L2 evict-first policy (one query row a request)
  unsigned long long* trace;  // optional (AttentionTuning::trace): [grid CTAs][kTraceSlots] timestamps, SM id + 1
};

constexpr int kTracePoints = 9;
constexpr int kTraceSlots = kTracePoints + 1;  // the last slot: the CTA's SM id + 1

// 16-byte chunks of a flagged record (merge.cuh): up to 4 values + max + sum.
constexpr int kLLChunks = 3;

template <bool kFp8>
size_t smem_bytes(int stages) {
  return q_offset<kFp8>(stages) + kQBytes;
}

// How many clusters of `cluster` CTAs of the kernel with `groups` consumer groups and `stages`
// ring slots the device runs at once (cached).
int max_active_clusters(bool fp8, int groups, int cluster, int stages);
// Launches the kernel of a.cgroups consumer groups: grid (a.splits * tokens, nkv) in clusters of
// a.cluster, with programmatic dependent launch where pdl_enabled says so.
void launch(const AttnArgs& a, bool fp8, int64_t tokens, int nkv, cudaStream_t stream);

}  // namespace sieve::cuda::attn
