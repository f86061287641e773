// The MoE kernels' tuning and test knobs (FP8 moe_experts in moe_fp8*.cu, the fused routing in
// moe_route.cu) and the entry points the tests and the benchmark call beyond cuda_ops.h. The
// knobs are set only by tests and the benchmark; the defaults are the kernels' own choices.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cuda {

struct MoeKnobs {
  // FP8 moe_experts.
  int path = 0;                  // 0: by the batch; 1: stream kernels (decode); 2: tile kernels (prefill)
  int stream_pairs_per_expert = 48;  // path 0: stream kernels while (token, expert) pairs <= this x experts
  int stream_rows = 0;           // token rows of a stream unit: 8, 16, 32 or 64; 0: by the batch
  int ksplit_gate_up = 0;        // stream kernels' k splits (0: enough units to fill the GPU twice)
  int ksplit_down = 0;
  bool pdl = true;               // programmatic dependent launch along sort -> quantize -> gate_up -> down -> combine
  int64_t chunk_tokens = 0;      // tokens a chunk at most; 0: as many as the 1 GiB scratch holds
  // moe_route: the router GEMM fused into the routing kernel up to this many tokens (0: never).
  int64_t route_fused_max_tokens = 64;
};
void set_moe_knobs(const MoeKnobs& k);
MoeKnobs moe_knobs();

// FP8 moe_experts (called by run_moe_experts for FP8_E4M3 weights); false when the kernels do not
// take the parameters: scale blocks other than (r, 128), hidden or inter not a multiple of 16,
// activations other than F32 / BF16 (or FP8 x with scales), more than 32 experts a token or 4096
// experts.
bool run_moe_experts_fp8(const ops::MoeExpertsParams& p, void* stream);

// The device 1 x 128 quantizer on its own (tests): x [rows, cols] (F32 or BF16, row stride ldx,
// 16-byte aligned rows, cols % 16 == 0) -> q [rows, cols] fp8 and scale [rows, ceil(cols / 128)].
void quantize_fp8_1x128(const void* x, DType dtype, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q,
                        float* scale, void* stream);

}  // namespace sieve::cuda
