// CPU reference implementations of kernels/ops.h: fp32 arithmetic, obvious loops, the oracle the
// CUDA kernels are tested against. Each function has the meaning documented in ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cpu {

void run_matmul(const ops::MatmulParams& p);
void run_embedding(const ops::EmbeddingParams& p);
void run_rms_norm(const ops::RmsNormParams& p);
void run_add(const ops::AddParams& p);
void run_swiglu_oai(const ops::SwigluOaiParams& p);
void run_moe_route(const ops::MoeRouteParams& p);
void run_moe_experts(const ops::MoeExpertsParams& p);
void run_qkv_norm_rope_cache(const ops::QkvNormRopeCacheParams& p);
void run_attention(const ops::AttentionParams& p);
void run_indexer(const ops::IndexerParams& p);

// The FP8 activation quantizer (docs/kernels.md): per row, per group of kFp8GroupSize columns
// (the last one may be short), scale = amax / 448 (1 when amax is 0; NaN is ignored by the amax)
// and q = sat_fp8(x / scale), the division in fp32 and the cast rounding to nearest even.
// scale: [rows, ceil(cols / kFp8GroupSize)]. The CUDA kernels match it bit for bit.
constexpr int64_t kFp8GroupSize = 128;
void quantize_fp8_1x128(const float* x, int64_t rows, int64_t cols, int64_t ldx, uint8_t* q, int64_t ldq,
                        float* scale);

// Pieces of the indexer, exposed for tests and for the unfused CUDA baseline's checks.
// Selects the top-k of one row of block scores (the sentinels already applied) with the ops.h
// tie rule; writes topk ids, -1 padded. `n_blk` candidates.
void select_topk_blocks(const float* scores, int n_blk, int topk, int32_t* out);

}  // namespace sieve::cpu
