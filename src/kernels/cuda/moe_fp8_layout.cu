// ops::repack_fp8_tiles: FP8 expert weights between row-major and the tiled layout of
// kernels/fp8_tiles.h (CPU twin in kernels/cpu/cpu_moe.cpp). Pure byte moves, 16 bytes a thread:
// a row's 16-byte piece stays whole in both layouts.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fp8_tiles.h"

namespace sieve::cuda {

namespace {

__global__ void repack_fp8_tiles_kernel(const uint4* src, uint4* dst, int64_t rows, int64_t cols, bool gate_up,
                                        bool untile) {
  const int64_t per_row = cols / 16, n = rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, k = (i - r * per_row) * 16;
    const int64_t t = ops::fp8_tile_offset(r, k, rows, cols, gate_up) / 16;
    if (untile) {
      dst[i] = src[t];
    } else {
      dst[t] = src[i];
    }
  }
}

}  // namespace

bool run_repack_fp8_tiles(const ops::RepackFp8TilesParams& p, void* stream) {
  if (p.rows <= 0 || p.cols <= 0) return true;
  if (!p.src || !p.dst) throw Error("repack_fp8_tiles: null operand");
  if (p.rows % (p.gate_up ? 128 : 64) != 0 || p.cols % 128 != 0) return false;
  if (reinterpret_cast<uintptr_t>(p.src) % 16 || reinterpret_cast<uintptr_t>(p.dst) % 16) return false;
  const int64_t n = p.rows * p.cols / 16;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, int64_t(num_sms()) * 16));
  repack_fp8_tiles_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(p.src), static_cast<uint4*>(p.dst), p.rows, p.cols, p.gate_up, p.untile);
  SIEVE_LAUNCH_CHECK("repack_fp8_tiles");
  return true;
}

}  // namespace sieve::cuda
