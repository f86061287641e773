// The kernel contract. Every op is declared here once, with a plain parameter struct (raw
// pointers with a shape comment, sizes, strides, dtypes), and has two implementations with the
// same meaning: `cpu::run_xxx(const XxxParams&)` (kernels/cpu/, the numerical oracle) and
// `cuda::run_xxx(const XxxParams&, cudaStream_t)` (kernels/cuda/). Model code calls only the
// dispatchers below (`ops::xxx(params, stream)`), never a backend.
//
// Conventions
// - Shapes in comments are row-major, innermost last. Strides are in elements.
// - "act" tensors (activations) are F32 on the CPU backend; the CUDA backend may use BF16 where
//   its kernels say so. Caches store F32, BF16 or FP8_E4M3 as configured.
// - A batch mixes sequences: sequence s owns the new tokens [query_start_loc[s],
//   query_start_loc[s+1]) and, after this step, seq_lens[s] keys in the paged caches (the cached
//   prefix plus its new tokens, which the cache-write op has already stored). New token i of a
//   sequence with q_len new tokens is at position seq_lens[s] - q_len + i and sees the keys
//   j <= its position. Decode is q_len = 1; speculative verification is q_len = Q.
// - Paged caches: block b of sequence s is physical block block_tables[s * max_blocks_per_seq + b];
//   token position p lives in block p / block_size at offset p % block_size.
// - CUDA streams: the decode-step kernels (qkv_norm_rope_cache, the decode indexer, attention)
//   may use programmatic dependent launch (by default the decode indexer, the cache write at
//   decode sizes, sparse attention for batches of at most 4 query tokens and dense attention for
//   up to 128; the tests and the benchmark may choose otherwise, cuda/tuning.h). Each
//   may then read the batch metadata (query_start_loc, seq_lens, block_tables, positions,
//   slot_mapping) and the cache blocks that hold only positions before its request's first new
//   token while the previous kernel of the stream is still running; everything else it reads or
//   writes waits for that kernel. So the kernel just before one of them must not write those
//   (the metadata comes from host copies; the cache-write op writes only the new tokens' slots).
//   The other small ops of a decode step (rms_norm, add, embedding, swiglu_oai, moe_route) and
//   the FP8 linear may be launched so too; before waiting they read only weights, which no
//   kernel writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace sieve::ops {

// Where an op runs. cuda_stream is a cudaStream_t (nullptr = default stream) for CUDA devices.
struct Stream {
  Device device;
  void* cuda_stream = nullptr;
  static Stream cpu() { return Stream{}; }
};

// ---------------------------------------------------------------------------------------------
// Caches

// Main KV cache of one layer.
struct KvCacheView {
  void* k = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  void* v = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  // FP8 only: one fp32 scale per (token, kv head) = amax / 448 (1 when amax is 0); the stored
  // value is sat_fp8(round_bf16(x) / scale) and reads as fp8 * scale. Null for other dtypes.
  float* k_scale = nullptr;  // [num_blocks, num_kv_heads, block_size]
  float* v_scale = nullptr;  // [num_blocks, num_kv_heads, block_size]
  DType dtype = DType::BF16;  // F32 (exact reference runs), BF16, FP8_E4M3
  int64_t num_blocks = 0;
  int block_size = 128;
  int num_kv_heads = 0;
  int head_dim = 0;
};

// Index-key cache of one sparse layer (one shared index-key head).
struct IndexCacheView {
  void* k = nullptr;  // [num_blocks, block_size, index_dim]
  // F32, BF16, or FP8_E4M3 = plain saturating cast of the bf16-rounded key, no scale.
  DType dtype = DType::BF16;
  int64_t num_blocks = 0;
  int block_size = 128;
  int index_dim = 0;
};

// Sequence layout of one forward step (see Conventions). All pointers are on the op's device.
struct BatchView {
  int num_seqs = 0;
  int64_t num_tokens = 0;
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;         // [num_seqs]
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  // Upper bounds, known on the host. Kernels that must be CUDA-graph safe size their grids from
  // these (never from live seq_lens): max_seq_len = max_model_len at capture.
  int max_seq_len = 0;
  int max_query_len = 0;
};

// ---------------------------------------------------------------------------------------------
// Dense math

// y[m, n] = x[m, k] . w[n, k]^T  (+ y when accumulate)
struct MatmulParams {
  const void* x = nullptr;  // [m, k], row stride ldx
  DType x_dtype = DType::F32;
  const void* w = nullptr;  // [n, k], contiguous (F32 or BF16)
  DType w_dtype = DType::F32;
  void* y = nullptr;  // [m, n], row stride ldy
  DType y_dtype = DType::F32;
  int64_t m = 0, n = 0, k = 0;
  int64_t ldx = 0, ldy = 0;
  bool accumulate = false;
};

// A weight matrix as kernels read it: w[n][k] = dequant(data[n][k]), n = rows, k = cols.
// FP8_E4M3: fp32 dequantization multipliers, one per (scale_block_rows x scale_block_cols) block,
//   row-major over blocks: w[n][k] = fp8[n][k] * scale[(n / br) * ceil(cols / bc) + k / bc]
//   (the product in fp32). Layouts:
//   (1, 32)    MXFP8 as published (E8M0 2^(e - 127) widened to fp32, exact); the CPU takes it,
//   (1, 128)   MXFP8 regrouped for the GPU at load (per row and 128 columns the largest of the
//              four E8M0 scales, each fp8 value rescaled by 2^(e_i - e_max)),
//   (128, 128) the Hugging Face fp8 block layout (DeepSeek-V3, Qwen3-FP8) and `--quantization
//              fp8` (online, scale = amax / 448 per block).
//   The CPU reference takes any block shape; the CUDA kernels (1, 128) and (128, 128).
// F32 / BF16: no scale. The data is contiguous (row stride = cols) and, on CUDA, 16-byte aligned.
// scale_lt (optional, CUDA): the same scales as cuBLASLt's block-scaled GEMM reads them, which the
//   CUDA prefill path (m > 64) needs for (1, 128) blocks and for (128, 128) blocks whose rows of
//   blocks are not a multiple of 4 long (without it those take the slower own kernel). Made once
//   at load by lt_weight_scales below and uploaded next to `scale`; the CPU ignores it.
struct WeightView {
  const void* data = nullptr;  // [rows, cols] row-major
  DType dtype = DType::BF16;   // F32, BF16, FP8_E4M3
  int64_t rows = 0, cols = 0;
  const float* scale = nullptr;  // FP8_E4M3 only: [ceil(rows / br), ceil(cols / bc)]
  int scale_block_rows = 0, scale_block_cols = 0;
  const float* scale_lt = nullptr;  // FP8_E4M3, optional: lt_weight_scales(*this, scale)
};

// The scales of an FP8 weight w (host copy `scale`, WeightView layout) rearranged for
// WeightView::scale_lt; empty when w needs none (other block shapes, or (128, 128) blocks whose
// rows of blocks are a multiple of 4 long: cuBLASLt reads `scale` itself).
//   (1, 128):   k-block major, [ceil(cols / 128)][rows]: out[kb * rows + r] = scale[r * KB + kb];
//   (128, 128): rows of blocks padded to a multiple of 4, [ceil(rows / 128)][round_up(KB, 4)]
//               (padding 1, never read for real columns).
std::vector<float> lt_weight_scales(const WeightView& w, const float* scale);
// (1, 128) scales of a [rows, cols] FP8 matrix, row-major [rows][ceil(cols / 128)] (host copy),
// k-block major: [ceil(cols / 128)][rows], out[kb * rows + r] = scale[r * KB + kb]. The layout of
// lt_weight_scales' (1, 128) case.
std::vector<float> fp8_scales_kmajor(const float* scale, int64_t rows, int64_t cols);
// The tiled layout of a routed expert's (1, 128) scales (MoeExpertsParams::scale_tiled): blocks
// of 256 weight rows in the CUDA MoE kernels' order, [rbs][ceil(cols / 128)][256], so that one
// k block of one row block is one contiguous 1 KB run. gate_up ([2 I, cols], gate rows then up
// rows): block rb holds units u0 = 128 rb .. u0 + 127 as [gate u0..u0+63 | up u0..u0+63 |
// gate u0+64.. | up u0+64..], rbs = ceil(I / 128); down ([H, cols]): block rb holds rows
// 256 rb .. + 255, rbs = ceil(H / 256). Slots of rows past the matrix hold 0.
// fp8_moe_tiled_size: the array's floats (rows: the matrix's, 2 I or H); fp8_scales_moe_tiled:
// the row-major [rows][ceil(cols / 128)] host copy `scale` rearranged.
int64_t fp8_moe_tiled_size(int64_t rows, int64_t cols, bool gate_up);
std::vector<float> fp8_scales_moe_tiled(const float* scale, int64_t rows, int64_t cols, bool gate_up);

// Activations quantized for the FP8 GEMMs: per-token groups of 128 columns (1 x 128).
// For row r and group g = c / 128 (the last group may be shorter):
//   amax  = max |x[r, c]| over the group (NaN ignored), scale = amax / 448 in fp32 (1 when amax
//           is 0), q[r, c] = sat_fp8(x[r, c] / scale) (fp32 division, round to nearest even,
//           finite values saturate to +-448), x[r, c] ~ q[r, c] * scale[r * ceil(cols / 128) + g].
// kernels/cpu defines it once (cpu::quantize_row_fp8); the CUDA kernels match it bit for bit.
constexpr int64_t kFp8Group = 128;
inline int64_t fp8_groups(int64_t cols) { return (cols + kFp8Group - 1) / kFp8Group; }

// Standalone quantization of activation rows (the FP8 GEMM input) as above.
struct QuantizeFp8Params {
  const void* x = nullptr;  // [rows, cols], row stride ldx
  DType x_dtype = DType::F32;  // F32 or BF16
  int64_t ldx = 0;
  void* y = nullptr;  // FP8_E4M3 [rows, cols], row stride ldy
  int64_t ldy = 0;
  float* y_scale = nullptr;  // [rows, fp8_groups(cols)], packed
  int64_t rows = 0, cols = 0;
};

// y[m, n] (+)= x[m, k] . w[n, k]^T with w a WeightView (n = w.rows, k = w.cols), fp32 accumulation.
// x: F32 or BF16 rows; or FP8_E4M3 rows with x_scale (already quantized as above, e.g. by
//    rms_norm or swiglu_oai with an FP8 output, or quantize_fp8).
//    The CPU reference multiplies the rows it is given exactly (F32/BF16 rows are not quantized;
//    FP8 rows are dequantized q * scale in fp32). The CUDA op quantizes F32/BF16 rows itself when
//    w is FP8 (per 1 x 128 group, into a private grow-only buffer), and rounds F32 rows to bf16
//    when w is BF16 (as matmul does); docs/kernels.md lists what each path rounds.
// y: F32 or BF16, row stride ldy; accumulate adds the product to y (rounded once when BF16).
struct LinearParams {
  const void* x = nullptr;  // [m, k], row stride ldx (in elements)
  DType x_dtype = DType::F32;
  int64_t ldx = 0;
  const float* x_scale = nullptr;  // FP8 x only: [m, fp8_groups(k)], packed
  WeightView w;
  void* y = nullptr;  // [m, n], row stride ldy
  DType y_dtype = DType::F32;
  int64_t ldy = 0;
  int64_t m = 0;
  bool accumulate = false;
};

// out[i, :] = table[ids[i] - vocab0, :]
// shard (vocabulary-parallel embedding): the table holds ids [vocab0, vocab0 + vocab) of a
// vocabulary split over tensor-parallel ranks; any other id gives a row of zeros (another rank
// holds it, and the all_reduce that follows adds it in). Without shard every id must be in the
// table.
struct EmbeddingParams {
  const int32_t* ids = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  const void* table = nullptr;  // [vocab, hidden]
  DType table_dtype = DType::BF16;
  int64_t vocab = 0, hidden = 0;
  bool shard = false;
  int64_t vocab0 = 0;  // shard only
  void* out = nullptr;  // [num_tokens, hidden]
  DType out_dtype = DType::F32;
};

// RMSNorm over the last dim, computed in fp32: y = x / sqrt(mean(x^2) + eps) * (gemma ? 1 + w : w).
// If residual is set, first x += residual is stored back into residual (pre-norm add) and the
// norm is taken of the sum as stored (rounded to the residual's dtype). The residual has x's
// dtype, or is F32 with residual_f32 (a bf16 sublayer output added to an fp32 residual stream:
// the sum in fp32, stored in fp32).
// y_dtype FP8_E4M3 (fused norm + quantization for an FP8 GEMM): the fp32 normed row is quantized
// per 1 x 128 group exactly as quantize_fp8 does, the scales go to y_scale [rows, fp8_groups(dim)]
// (packed); y must not alias x then.
struct RmsNormParams {
  const void* x = nullptr;  // [rows, dim], row stride ldx
  DType x_dtype = DType::F32;
  void* residual = nullptr;  // optional [rows, dim], row stride ldr: x_dtype, or F32 with residual_f32
  int64_t ldr = 0;
  bool residual_f32 = false;
  void* y = nullptr;  // [rows, dim], row stride ldy (may alias x)
  DType y_dtype = DType::F32;
  const void* weight = nullptr;  // [dim]
  DType weight_dtype = DType::BF16;
  int64_t rows = 0, dim = 0, ldx = 0, ldy = 0;
  float eps = 1e-6f;
  bool gemma = true;
  float* y_scale = nullptr;  // y_dtype FP8_E4M3 only
  // Optional second copy of the normed rows, quantized as an FP8_E4M3 y would be (from the fp32
  // normed values, not from y's stored ones): for rows that one op reads in fp32 and an FP8 GEMM
  // reads too (an MoE layer's router and its experts). y must not alias x, nor be FP8_E4M3 then.
  void* y_fp8 = nullptr;          // [rows, dim] e4m3 codes, row stride ld_fp8
  int64_t ld_fp8 = 0;
  float* y_fp8_scale = nullptr;  // [rows, fp8_groups(dim)] (packed)
};
// The residual's dtype: x's, or F32 with residual_f32.
inline DType rms_residual_dtype(const RmsNormParams& p) { return p.residual_f32 ? DType::F32 : p.x_dtype; }

// y[i] += alpha * x[i]; with assign, y[i] = alpha * x[i] (a copy when alpha is 1; y's old
// contents are not read, so they may be anything, NaN included).
struct AddParams {
  void* y = nullptr;
  const void* x = nullptr;
  DType dtype = DType::F32;
  int64_t n = 0;
  float alpha = 1.0f;
  bool assign = false;
};

// A hint that the ranges will be read soon (the next layer's weights during a decode step): the
// CUDA backend issues an L2 prefetch of every 128-byte line they touch (from a line's first
// byte in the range) and returns; nothing is written, so every op's results are the same with or
// without it. Nothing on the CPU.
struct PrefetchL2Params {
  static constexpr int kMaxRanges = 8;
  const void* ptr[kMaxRanges] = {};
  size_t bytes[kMaxRanges] = {};
  int count = 0;
};

// SwiGLU-OAI: g = min(gate, limit); u = clamp(up, -limit, limit);
// out = g * sigmoid(alpha * g) * (u + beta)
// With out_scale set (fused activation + quantization for the down projection): out is
// FP8_E4M3, the fp32 activations of a row quantized per 1 x 128 group exactly as quantize_fp8
// does, scales in out_scale [rows, fp8_groups(inter)] (packed).
struct SwigluOaiParams {
  const void* gate_up = nullptr;  // [rows, 2 * inter] = [gate | up], row stride ld_in
  void* out = nullptr;            // [rows, inter], row stride ld_out
  DType dtype = DType::F32;       // of gate_up, and of out unless out_scale is set
  int64_t rows = 0, inter = 0, ld_in = 0, ld_out = 0;
  float alpha = 1.702f, limit = 7.0f, beta = 1.0f;
  float* out_scale = nullptr;  // set: out is FP8_E4M3
};

// MoE routing, DeepSeek-V3 style without groups: s = sigmoid(logits); choose the top-k of
// s + bias (ties: lower expert id); weights = s of the chosen, renormalised to sum 1 when
// renormalize, times scaling.
// The logits come either from `logits`, or from the router GEMM fused into the op:
// logits = x . gate^T with fp32 products and sums (set x and gate, leave logits null).
struct MoeRouteParams {
  const float* logits = nullptr;  // [num_tokens, num_experts] (fp32 router GEMM output)
  const void* x = nullptr;        // fused router GEMM: [num_tokens, hidden], row stride ldx
  DType x_dtype = DType::F32;     // F32 or BF16
  int64_t hidden = 0, ldx = 0;
  const float* gate = nullptr;    // fused router GEMM: [num_experts, hidden] fp32 router weight
  const float* bias = nullptr;    // [num_experts] e_score_correction_bias, or null
  int64_t num_tokens = 0;
  int num_experts = 0, topk = 0;
  bool renormalize = true;
  float scaling = 1.0f;
  int32_t* ids = nullptr;    // [num_tokens, topk], by descending biased score
  float* weights = nullptr;  // [num_tokens, topk]
  // Expert parallelism: ids are written as expert - id_offset, so that a rank holding experts
  // [id_offset, id_offset + n) passes its n experts to moe_experts, which skips the ids outside
  // [0, n) (the experts of other ranks).
  int id_offset = 0;
};

// Routed experts: out[t] += sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) with
// expert(x) = w_down . swiglu_oai(w_gate_up . x). Pairs whose id is outside [0, num_experts)
// add nothing (expert parallelism: another rank's expert, see MoeRouteParams::id_offset).
// FP8_E4M3 weights (the WeightView layout, one block shape for every matrix): w[n][k] =
// fp8[n][k] * scale[(n / scale_block_rows) * ceil(cols / scale_block_cols) + k / scale_block_cols].
// The CPU dequantizes them exactly (fp32, any block shape); the CUDA kernels take blocks of
// (r, 128) for any r >= 1 (in practice (1, 128) and (128, 128)) and quantize the activations that
// enter each product (x, the SwiGLU output) per 1 x 128 token group as kFp8Group describes
// (docs/kernels.md says where CUDA rounds more than the CPU).
struct MoeExpertsParams {
  const void* x = nullptr;  // [num_tokens, hidden]: act_dtype, or FP8_E4M3 when x_scale is set
  DType act_dtype = DType::F32;  // F32 or BF16: x (unless FP8) and out (unless out_bf16)
  // FP8 x (already quantized as kFp8Group describes, e.g. by rms_norm with an FP8 output):
  // x = fp8 * x_scale[t * fp8_groups(hidden) + k / 128].
  const float* x_scale = nullptr;  // [num_tokens, fp8_groups(hidden)]
  int64_t num_tokens = 0, hidden = 0, inter = 0;
  int num_experts = 0, topk = 0;
  const int32_t* ids = nullptr;    // [num_tokens, topk]
  const float* weights = nullptr;  // [num_tokens, topk]
  // Each expert's weights start 16-byte aligned (the CUDA backend reads them in 16-byte runs).
  const void* const* w_gate_up = nullptr;  // [num_experts] -> [2 * inter, hidden] ([gate | up] rows)
  const void* const* w_down = nullptr;     // [num_experts] -> [hidden, inter]
  DType w_dtype = DType::BF16;             // F32, BF16 or FP8_E4M3
  // FP8_E4M3 only: per expert the dequant multipliers of its two matrices (row-major over blocks).
  const float* const* w_gate_up_scale = nullptr;  // [num_experts] -> [ceil(2 inter / br), ceil(hidden / bc)]
  const float* const* w_down_scale = nullptr;     // [num_experts] -> [ceil(hidden / br), ceil(inter / bc)]
  int scale_block_rows = 0, scale_block_cols = 0;  // br, bc
  // FP8 with (1, 128) blocks only: each expert's two scale arrays are tiled
  // (fp8_scales_moe_tiled: [ceil(inter / 128)][ceil(hidden / 128)][256] and
  // [ceil(hidden / 256)][ceil(inter / 128)][256], the CUDA kernels' 256-row blocks, zeros past the
  // rows), so that a kernel stage's scales of one k block are one 1 KB run. On CUDA each array then
  // starts 16-byte aligned. Other block shapes refuse it.
  bool scale_tiled = false;
  // CPU only, FP8 weights: quantize the activations entering each product (x unless already FP8,
  // and the SwiGLU output) per 1 x 128 token group as the CUDA kernels do, so that a parity test
  // compares like with like; false (the oracle): fp32 activations.
  bool quantize_act = false;
  float alpha = 1.702f, limit = 7.0f, beta = 1.0f;
  // [num_tokens, hidden], accumulated into: out += the fp32 sum of the token's weighted expert
  // outputs, rounded once at the store. act_dtype, or BF16 with out_bf16 whatever act_dtype (fp32
  // rows for the router, the sublayer output in bf16).
  void* out = nullptr;
  bool out_bf16 = false;
};
// out's dtype: act_dtype, or BF16 with out_bf16.
inline DType moe_out_dtype(const MoeExpertsParams& p) { return p.out_bf16 ? DType::BF16 : p.act_dtype; }

// ---------------------------------------------------------------------------------------------
// Attention path

// Per token of the packed projection rows [q | k | v | index_q | index_k]:
//   q (num_q_heads), k (num_kv_heads), index_q (num_index_heads), index_k (1 head):
//     Gemma RMSNorm with their own [head_dim] weight, then partial NeoX RoPE on the first
//     rotary_dim dims (pairs d, d + rotary_dim/2) with the fp32 table cos_sin;
//   v: raw.
// q_norm and k_norm both null: q and k are not normed, only roped (Llama-style layers, such as
// an EAGLE3 draft's); the index branch always has its norms.
// q and index_q are written back in place; k, v go to the KV cache at slot_mapping[t] and
// index_k to the index cache (when index_cache.k is set). slot_mapping[t] < 0 skips the writes.
struct QkvNormRopeCacheParams {
  void* qkv = nullptr;  // [num_tokens, row_stride]
  DType act_dtype = DType::F32;
  int64_t num_tokens = 0, row_stride = 0;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;  // column offsets in a row
  int num_index_heads = 0, index_dim = 0;             // 0 = this layer has no index branch
  int64_t index_q_offset = -1, index_k_offset = -1;
  const void* q_norm = nullptr;  // [head_dim], or null together with k_norm: no q/k norm
  const void* k_norm = nullptr;  // [head_dim]
  const void* index_q_norm = nullptr;  // [index_dim]
  const void* index_k_norm = nullptr;  // [index_dim]
  DType norm_dtype = DType::BF16;
  float eps = 1e-6f;
  const int32_t* positions = nullptr;  // [num_tokens]
  const float* cos_sin = nullptr;      // [max_position, rotary_dim] = [cos(rotary_dim/2) | sin(...)]
  int rotary_dim = 0;
  const int64_t* slot_mapping = nullptr;  // [num_tokens], block * block_size + offset
  KvCacheView kv;
  IndexCacheView index_cache;  // index_cache.k == nullptr: do not write index keys
  bool norm_rope_index = true;  // false: leave index_q/index_k untouched (shared top-k layers)
};

// Causal GQA attention over the paged KV cache, softmax scale sm_scale, no sink.
// topk_idx == nullptr: dense causal attention over all keys j <= position.
// Otherwise block-sparse: query token t of kv group g attends to the keys j <= position whose
// block j / block_size is one of topk_idx[t, g, 0..topk) (entries < 0 are padding).
struct AttentionParams {
  const void* q = nullptr;  // [num_tokens, num_q_heads, head_dim], token stride q_stride
  DType q_dtype = DType::F32;
  int64_t q_stride = 0;
  void* out = nullptr;  // [num_tokens, num_q_heads, head_dim], token stride out_stride
  DType out_dtype = DType::F32;
  int64_t out_stride = 0;
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float sm_scale = 0;
  KvCacheView kv;
  BatchView batch;
  const int32_t* topk_idx = nullptr;  // [num_tokens, num_kv_heads, topk]
  int topk = 0;
};

// Lightning indexer: block scores and per-token top-k block selection.
//   score(t, h, b) = max over keys j in block b with j <= position(t) of
//                    <index_q[t, h], index_k[j]> * score_scale
// (index keys as stored in the cache; index_q rounded to the cache dtype first when
// q_in_cache_dtype, the fp8-MMA mode). Candidates are blocks b < n_blk = position / block_size + 1.
// Forced blocks: b < init_blocks scores 1e30, b >= n_blk - local_blocks scores 1e29 (local wins
// when both); NaN scores become -1e30. Output: the top `topk` block ids by descending score, ties
// to the lower block id, left-packed, padded with -1 when n_blk < topk.
struct IndexerParams {
  const void* index_q = nullptr;  // [num_tokens, num_index_heads, index_dim], token stride q_stride
  DType q_dtype = DType::F32;
  int64_t q_stride = 0;
  int num_index_heads = 0, index_dim = 0;
  float score_scale = 1.0f;  // sm_scale * log2(e) in M3; positive, so it never changes the ranking
  bool q_in_cache_dtype = false;
  IndexCacheView cache;
  BatchView batch;
  int topk = 0, init_blocks = 0, local_blocks = 0;
  int32_t* topk_idx = nullptr;  // [num_tokens, num_index_heads, topk]
  // Optional: the block scores before selection (forced sentinels applied, -inf past n_blk).
  float* block_scores = nullptr;  // [num_tokens, num_index_heads, max_blocks_per_seq]
};

// ---------------------------------------------------------------------------------------------
// Sampling

// What `sample` does with one logits row.
enum class SampleMode : int32_t {
  Skip = 0,      // nothing read; the token is -1 (a row the host samples from its full logits)
  Greedy = 1,    // the first index of the largest value
  Draw = 2,      // one draw at temperature 1 / inv_t with the uniform u
  Filtered = 3,  // one draw from the top_k candidates after min-p and top-p, with the uniform u
};
// Filtered rows take at most this many candidates (rows with more go to the host; the CUDA op
// keeps this many per 8192 columns of each row in scratch).
inline constexpr int32_t kMaxDeviceTopK = 256;
// One row's parameters, as the op reads them (device memory on CUDA).
struct SampleRow {
  double inv_t = 1;   // Draw, Filtered: 1 / temperature, > 0
  double u = 0;       // Draw, Filtered: the uniform in [0, 1) that picks the token
  int32_t mode = 0;   // SampleMode
  int32_t top_k = 0;  // Filtered: the candidates, 1 .. kMaxDeviceTopK
  double top_p = 1;   // Filtered: in (0, 1]; 1 keeps every candidate
  double min_p = 0;   // Filtered: in [0, 1]; 0 keeps every candidate
};

// The token of each logits row, as engine/sampler.cpp picks it for a row it does not transform:
//   Greedy: the first index of the largest value (NaN never wins; 0 when no value is > -inf).
//   Draw:   weights w_i = exp(double(x_i) * inv_t - mx) with mx = max_i double(x_i) * inv_t (0 for
//           x_i = -inf), total = their sum in id order (double); the first id with w_i > 0 whose
//           running sum in id order exceeds u * total (the last id with w_i > 0 when none does);
//           -1 when total is not > 0 (every value -inf, or a NaN or +inf in the row).
//   Filtered: -1 when the row holds a NaN or +inf. Otherwise k = min(top_k, vocab) (top_k < 1
//           counts as 1, above kMaxDeviceTopK as kMaxDeviceTopK) candidates c_0 .. c_{k-1}: the
//           ids by value descending, ties to the lower id. mx = double(x_{c_0}) * inv_t, w_j =
//           exp(double(x_{c_j}) * inv_t - mx) (0 for -inf), S_j = w_0 + .. + w_j summed in that
//           order (double); keep = k, total = S_{keep-1}. min_p > 0: keep = the first j with
//           w_j < min_p * w_0 (k when none; at least 1), total = S_{keep-1}. top_p < 1: acc = 0;
//           for j = 0, 1, .. < keep: acc += w_j / total, and the first j where acc >= top_p ends
//           the prefix there (keep = j + 1); total = S_{keep-1}. Then -1 when total is not > 0;
//           else the first c_j (j < keep) with w_j > 0 and u * total < S_j (the last such c_j
//           with w_j > 0 when none).
//   Skip:   -1.
// Then out[r] = id_map[id] for id >= 0 when id_map is set (the EAGLE3 draft's draft-to-target map).
// Layout: shards == 1: column i of row r at logits[r * ld + i]. shards > 1 (the logits a tensor-
// parallel group gathered, [shards, rows, vocab / shards]): column i of row r at
// logits[((i / vs) * rows + r) * vs + i % vs], vs = vocab / shards.
// The CPU does exactly that arithmetic in that order (cpu::draw_row, cpu::filtered_draw; the host
// sampler calls the same functions). CUDA gives the same greedy ids; its draw sums in another
// order, so a u within rounding (~1e-13 relative) of the running sum at a boundary may pick the
// neighbouring id. Its filtered draw sums in the rule's order, but its exp may differ from the
// host's in the last bit, which moves a min-p, top-p or draw boundary that lies within that
// rounding of the value it is compared with.
struct SampleParams {
  const float* logits = nullptr;  // see Layout
  int64_t rows = 0, vocab = 0;
  int64_t ld = 0;  // shards == 1: row stride (0: vocab)
  int shards = 1;
  const SampleRow* row = nullptr;  // [rows]
  const int32_t* id_map = nullptr;  // optional [vocab]
  int32_t* out = nullptr;           // [rows]
  // false: no row is Filtered (the caller knows its rows; the CUDA op then launches only the
  // greedy / draw kernels). true is always right.
  bool any_filtered = true;
};

// ---------------------------------------------------------------------------------------------
// Communication (tensor parallelism)

// One rank's handle on its tensor-parallel group; src/parallel/ implements it (threads of one
// process on the CPU backend, NCCL on CUDA devices). Every rank of a group calls the same
// collectives in the same order with the same sizes. A collective that cannot complete (a peer
// failed, or never came) throws Error on every rank still running, never hangs.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[count] = the sum over ranks of data[count]; F32 or BF16.
  virtual void all_reduce_sum(void* data, DType dtype, int64_t count, const Stream& s) = 0;
  // out[size][count] = every rank's in[count], in rank order.
  virtual void all_gather(const void* in, void* out, DType dtype, int64_t count, const Stream& s) = 0;
  // Breaks the group from any thread (a rank failed): collectives waiting or enqueued on any rank
  // end with an Error instead of waiting for the failed one, and later ones throw.
  virtual void abort(const std::string& why) = 0;
};

struct AllReduceParams {
  void* data = nullptr;  // [count], summed in place
  DType dtype = DType::F32;
  int64_t count = 0;
  Collective* group = nullptr;  // null: nothing to do (a group of one is called: the identity)
};

struct AllGatherParams {
  const void* in = nullptr;  // [count]
  void* out = nullptr;       // [group size, count]; with no group (or one rank) a copy of in
  DType dtype = DType::F32;
  int64_t count = 0;
  Collective* group = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Dispatchers: run the op on the stream's device. A CUDA op that this build lacks throws Error.

void matmul(const MatmulParams& p, const Stream& s);
void linear(const LinearParams& p, const Stream& s);
void quantize_fp8(const QuantizeFp8Params& p, const Stream& s);
void embedding(const EmbeddingParams& p, const Stream& s);
void rms_norm(const RmsNormParams& p, const Stream& s);
void add(const AddParams& p, const Stream& s);
void swiglu_oai(const SwigluOaiParams& p, const Stream& s);
void moe_route(const MoeRouteParams& p, const Stream& s);
// Whether moe_route(p, s) runs the split-K router GEMM (CUDA, F32 x, decode batches up to the
// tuning field moe.route_splitk_max_tokens; docs/kernels.md "The router GEMM"); false on the CPU.
// The model runs a MoE layer's shared expert beside the routing on its side stream only then:
// the two together measured faster than either alone (docs/performance.md "The decode chain").
bool moe_route_splits(const MoeRouteParams& p, const Stream& s);
void moe_experts(const MoeExpertsParams& p, const Stream& s);
void prefetch_l2(const PrefetchL2Params& p, const Stream& s);
// The bytes a step of `rows` token rows may prefetch into L2 ahead of a layer: the tuning field
// launch.l2_prefetch_mib for decode steps (docs/kernels.md "L2 prefetch of the next layer's
// weights"), 0 for larger steps and on the CPU.
size_t l2_prefetch_budget(int64_t rows, const Stream& s);
void qkv_norm_rope_cache(const QkvNormRopeCacheParams& p, const Stream& s);
void attention(const AttentionParams& p, const Stream& s);
void indexer(const IndexerParams& p, const Stream& s);
void sample(const SampleParams& p, const Stream& s);
void all_reduce(const AllReduceParams& p, const Stream& s);
void all_gather(const AllGatherParams& p, const Stream& s);

// Profiling: when an observer is set, every dispatched op reports its name and host wall-clock
// interval (steady_clock, seconds since its epoch). CPU ops report their run time; CUDA ops the
// launch only (nothing synchronises for the observer).
using OpObserver = std::function<void(const char* op, double t0, double t1)>;
void set_op_observer(OpObserver fn);  // an empty function stops reporting
// Measurement (`sieve eval selections`): when set, called after every indexer op that ran on the
// CPU backend, with its parameters (host memory, the selections written). Not for serving.
using IndexerTap = std::function<void(const IndexerParams& p)>;
void set_indexer_tap(IndexerTap fn);  // an empty function stops it

// The table `cos_sin` [max_position, rotary_dim] used by qkv_norm_rope_cache, built in fp32 as
// transformers does: inv_freq[j] = 1 / theta^(2j / rotary_dim), angle = float(pos) * inv_freq[j].
void build_rope_table(float* cos_sin, int64_t max_position, int rotary_dim, double theta);

}  // namespace sieve::ops
