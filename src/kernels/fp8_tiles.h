// The tiled layout of FP8 expert weights (ops::MoeExpertsParams::w_tiled; docs/kernels.md
// "FP8 MoE"), host and device. The FP8 MoE kernels read a weight matrix [R, K] as TMA boxes of
// 64 rows x 128 bytes; row-major, one box is 64 pieces of 128 bytes K bytes apart. Tiled, every
// box is one contiguous 8 KB piece (its 64 rows of 128 bytes in order) and the boxes are ordered
// as the kernels read them:
//  - row boxes ("slots", R / 64 of them) in the order of the kernels' 256-row blocks: down's rows
//    in order; gate_up's gate and up boxes interleaved, slot 2 j = gate rows 64 j .., slot
//    2 j + 1 = up rows 64 j .. (moe_fp8_work.h gate_up_row: block rb is slots 4 rb .. 4 rb + 3);
//  - a group of 4 slots (one 256-row block; the last group may hold fewer) takes its boxes k
//    block by k block: box (slot s, k block kb) = 4 nkb (s / 4) + gs kb + s % 4, gs the group's
//    slots. So a stream stage (kp k blocks of a 256-row block) and a tile kernel's k block are
//    one contiguous run, and a k split's range too.
// Needs R % 64 == 0 and K % 128 == 0 (gate_up: inter % 64 == 0); fp8_tiles_fit says when both
// matrices of an expert qualify.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_TILES_HD __host__ __device__ __forceinline__
#else
#define SIEVE_TILES_HD inline
#endif

namespace sieve::ops {

constexpr int kFp8TileRows = 64, kFp8TileBytes = 128;

// Whether an expert's gate_up [2 inter, hidden] and down [hidden, inter] both take the layout.
SIEVE_TILES_HD bool fp8_tiles_fit(int64_t hidden, int64_t inter) {
  return hidden > 0 && inter > 0 && hidden % 128 == 0 && inter % 128 == 0;
}

// The box of slot s, k block kb (slots row boxes, nkb k blocks); past the slots: slots * nkb, the
// first box past the matrix (a TMA read there gives zeros). 32-bit: the kernels' producers have
// few registers, and a matrix of 2^31 boxes would be 16 TB.
SIEVE_TILES_HD int fp8_tile_box(int s, int kb, int slots, int nkb) {
  if (s >= slots) return slots * nkb;
  const int grp = s >> 2, gs = slots - 4 * grp < 4 ? slots - 4 * grp : 4;
  return 4 * nkb * grp + kb * gs + (s & 3);
}

// The slot of row `row` of a matrix of `rows` rows (gate_up: [gate | up] halves interleaved).
SIEVE_TILES_HD int fp8_tile_slot(int64_t row, int64_t rows, bool gate_up) {
  if (!gate_up) return int(row / kFp8TileRows);
  const int64_t half = rows / 2;
  return row < half ? int(2 * (row / kFp8TileRows)) : int(2 * ((row - half) / kFp8TileRows) + 1);
}

// Byte offset of element (row, k) of a tiled [rows, cols] fp8 matrix.
SIEVE_TILES_HD int64_t fp8_tile_offset(int64_t row, int64_t k, int64_t rows, int64_t cols, bool gate_up) {
  const int slots = int(rows / kFp8TileRows), nkb = int(cols / kFp8TileBytes);
  const int64_t box = fp8_tile_box(fp8_tile_slot(row, rows, gate_up), int(k / kFp8TileBytes), slots, nkb);
  return box * (kFp8TileRows * kFp8TileBytes) + (row % kFp8TileRows) * kFp8TileBytes + k % kFp8TileBytes;
}

}  // namespace sieve::ops
