// The index arithmetic of the FP8 MoE kernels (moe_fp8_tile.cu, moe_fp8_stream.cu), host and
// device: which expert, weight-row block and row block a work item is, which weight row a tile
// row is, where a weight row's scale sits in a tile kernel's stage, and a k split's range.
// Plain C++ so that a CPU test can check it (tests/kernels/kernels_cpu_moe_test.cpp).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_MOE_HD __host__ __device__ __forceinline__
#else
#define SIEVE_MOE_HD inline
#endif

namespace sieve::cuda::moe_fp8 {

// Work item i of a product: expert e owns row blocks blk_start[e] .. blk_start[e + 1] - 1 and the
// items blk_start[e] * cols .. blk_start[e + 1] * cols - 1, ordered column (weight-row block, or
// weight-row block x k split) then row block, row blocks fastest.
struct WorkItem {
  int e, col, blk;
};
SIEVE_MOE_HD WorkItem work_item(const int32_t* blk_start, int E, int64_t i, int cols) {
  int lo = 0, hi = E - 1;  // the last e with blk_start[e] * cols <= i
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (int64_t(blk_start[mid]) * cols <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int nb = blk_start[lo + 1] - blk_start[lo];
  const int64_t local = i - int64_t(blk_start[lo]) * cols;
  return WorkItem{lo, int(local / nb), int(local % nb)};
}

// Weight row of row c (0..255) of a 256-row weight block rb. gate_up: the gate and up rows of
// units rb * 128 .. + 127 as [gate u0..u0+63 | up u0..u0+63 | gate u0+64.. | up u0+64..], so that
// row c < 64 (+128) and row c + 64 are one unit's gate and up; valid: the unit exists. down:
// hidden rows rb * 256 + c.
SIEVE_MOE_HD int gate_up_row(int rb, int c, int inter, bool& valid) {
  const int unit = rb * 128 + ((c >> 7) << 6) + (c & 63);
  valid = unit < inter;
  return ((c >> 6) & 1 ? inter : 0) + unit;
}
SIEVE_MOE_HD int down_row(int rb, int c, int hidden, bool& valid) {
  const int n = rb * 256 + c;
  valid = n < hidden;
  return n;
}

// Tile kernels: where the scale of weight row c (0..255) sits in a stage, so that the consumer
// thread of quad lane q finds the scales of its columns 8 j + 2 q + i (j < 16, i < 2) of half h
// (rows 128 h ..) as 32 consecutive floats at h * 128 + q * 32 (j-major, then i).
SIEVE_MOE_HD int wscale_slot(int c) {
  const int h = c >> 7, cc = c & 127;
  return h * 128 + ((cc & 7) >> 1) * 32 + (cc >> 3) * 2 + (cc & 1);
}

// Stream kernels: k blocks [kb0, kb1) of split ks of ksplit over nkb blocks (ksplit <= nkb: none
// is empty).
SIEVE_MOE_HD void split_range(int ks, int ksplit, int nkb, int& kb0, int& kb1) {
  kb0 = int(int64_t(ks) * nkb / ksplit);
  kb1 = int(int64_t(ks + 1) * nkb / ksplit);
}

// Stream kernels, the host's k split of a product of `units` units (experts x weight-row blocks)
// of nkb k blocks each: enough split units to give each of `sms` SMs two, 1 .. nkb.
SIEVE_MOE_HD int host_ksplit(int64_t units, int nkb, int sms) {
  const int64_t ks = (2 * int64_t(sms) + units - 1) / units;
  return int(ks < 1 ? 1 : (ks > nkb ? nkb : ks));
}

// Stream kernels, MoeTuning::fp8_ksplit_waves: the k split (1 .. max_split, at most nkb) of a
// product of `units` units (row blocks x weight-row blocks) of nkb k blocks each on `ctas`
// persistent CTAs. A CTA takes every ctas-th unit, so the busiest one works ceil(units x split /
// ctas) units of up to ceil(nkb / split) k blocks; the stream kernels' CTAs each run at a rate
// that their own pipeline sets, not the DRAM's, so a last wave that fills few CTAs is time lost.
// Cost in quarter k blocks, two more for a split unit: its partial sums' write, fence and count
// stall the consumers for about 1 us, half a k block's time at a CTA's rate (32 tokens at a TP4
// rank: about 2 us a k block). The least cost wins, ties the fewest splits.
SIEVE_MOE_HD int pick_ksplit(int64_t units, int nkb, int ctas, int max_split) {
  int best = 1;
  int64_t best_cost = -1;
  for (int ks = 1; ks <= max_split && ks <= nkb; ++ks) {
    const int64_t waves = (units * ks + ctas - 1) / ctas;
    const int64_t cost = waves * (4 * int64_t((nkb + ks - 1) / ks) + (ks > 1 ? 2 : 0));
    if (best_cost < 0 || cost < best_cost) best = ks, best_cost = cost;
  }
  return best;
}

}  // namespace sieve::cuda::moe_fp8
