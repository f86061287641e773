// CPU reference implementations of kernels/ops.h: fp32 arithmetic, obvious loops, the oracle the
// CUDA kernels are tested against. Each function has the meaning documented in ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace sieve::cpu {

void run_matmul(const ops::MatmulParams& p);
void run_linear(const ops::LinearParams& p);
void run_quantize_fp8(const ops::QuantizeFp8Params& p);
void run_embedding(const ops::EmbeddingParams& p);
void run_rms_norm(const ops::RmsNormParams& p);
void run_add(const ops::AddParams& p);
void run_swiglu_oai(const ops::SwigluOaiParams& p);
void run_moe_route(const ops::MoeRouteParams& p);
void run_moe_experts(const ops::MoeExpertsParams& p);
inline void run_prefetch_l2(const ops::PrefetchL2Params&) {}  // the CPU has no L2 to fill
void run_qkv_norm_rope_cache(const ops::QkvNormRopeCacheParams& p);
void run_attention(const ops::AttentionParams& p);
void run_indexer(const ops::IndexerParams& p);
void run_sample(const ops::SampleParams& p);

// The sampling rule of ops::sample on one contiguous row (cpu_sample.cpp); engine/sampler.cpp
// samples with these, so the op and the host sampler agree bit for bit.
// The first index of the largest value (NaN never wins; 0 when no value is > -inf).
int32_t first_argmax(const float* x, int64_t n);
// A token's unnormalised weight exp(double(logit) * inv_t - mx); 0 for a -inf logit.
double token_weight(float logit, double inv_t, double mx);
// One draw with the uniform u in [0, 1) (ops.h, SampleMode::Draw); -1 when the row has no mass.
int32_t draw_row(const float* x, int64_t n, double inv_t, double u);
// The candidate order of top-k, top-p and min-p (sampler.cpp; ops.h, SampleMode::Filtered):
// reorders ids[0..n) so that its first k are the ids of the k largest values of x, largest first,
// ties to the lower id.
void sort_candidates(const float* x, int32_t* ids, int64_t n, int64_t k);
// The weights w[0..keep) of candidates ids[0..keep) (token_weight at mx), then the min-p cut and
// the top-p prefix over them (top-p's norm adds tail_mass, the mass of candidates past `keep`
// that were not sorted). Returns the count kept; *total is their weights' sum in order.
int64_t filter_candidates(const float* x, const int32_t* ids, int64_t keep, double inv_t, double mx,
                          double min_p, double top_p, double tail_mass, double* w, double* total);
// The draw over candidates: the first id with w > 0 whose running sum exceeds target, the last
// such id when none does, ids[0] when no weight is > 0.
int32_t draw_candidates(const int32_t* ids, const double* w, int64_t n, double target);
// One filtered draw (ops.h, SampleMode::Filtered) from a contiguous row; -1 as the rule says.
int32_t filtered_draw(const float* x, int64_t n, const ops::SampleRow& row);
// Argument checks shared by both backends (throw Error naming the field).
void validate_sample(const ops::SampleParams& p);

// Pieces of the indexer, exposed for tests and for the unfused CUDA baseline's checks.
// Selects the top-k of one row of block scores (the sentinels already applied) with the ops.h
// tie rule; writes topk ids, -1 padded. `n_blk` candidates.
void select_topk_blocks(const float* scores, int n_blk, int topk, int32_t* out);

// FP8 pieces (cpu_linear.cpp), the definitions the CUDA kernels and tests are held to.
// The activation quantizer of ops.h: n values of one row -> n fp8 bytes and fp8_groups(n) scales.
void quantize_row_fp8(const float* x, int64_t n, uint8_t* q, float* scale);
// The scale of one group: max |x| / 448 in fp32 (NaN ignored), 1 when that max is 0.
float fp8_group_scale(const float* x, int64_t n);
// The dequantization multiplier of w[r][c] (FP8 weights), and rows [r0, r1) of w as packed fp32.
float weight_scale(const ops::WeightView& w, int64_t r, int64_t c);
void dequantize_weight_rows(const ops::WeightView& w, int64_t r0, int64_t r1, float* out);
// Argument checks shared by both backends (throw Error naming the field).
void validate_weight_view(const ops::WeightView& w, const char* op);
void validate_linear(const ops::LinearParams& p);

}  // namespace sieve::cpu
