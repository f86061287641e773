// CUDA implementations of kernels/ops.h for sm_90a. Same meaning as the CPU reference; where a
// kernel rounds more (bf16 activations, fp8 operands) docs/kernels.md says so. `stream` is a
// cudaStream_t. Only declared when the build has CUDA (SIEVE_HAVE_CUDA).
#pragma once

#include "kernels/ops.h"

namespace sieve::cuda {

// Each returns false when it does not support the given parameters (dtype, shape), so the
// dispatcher can report which op and why; true when it launched.
bool run_matmul(const ops::MatmulParams& p, void* stream);
bool run_linear(const ops::LinearParams& p, void* stream);
bool run_quantize_fp8(const ops::QuantizeFp8Params& p, void* stream);
bool run_embedding(const ops::EmbeddingParams& p, void* stream);
bool run_rms_norm(const ops::RmsNormParams& p, void* stream);
bool run_add(const ops::AddParams& p, void* stream);
bool run_swiglu_oai(const ops::SwigluOaiParams& p, void* stream);
bool run_moe_route(const ops::MoeRouteParams& p, void* stream);
bool moe_route_splits(const ops::MoeRouteParams& p);  // ops::moe_route_splits
bool run_moe_experts(const ops::MoeExpertsParams& p, void* stream);
bool run_prefetch_l2(const ops::PrefetchL2Params& p, void* stream);
size_t l2_prefetch_budget(int64_t rows);  // ops::l2_prefetch_budget
bool run_qkv_norm_rope_cache(const ops::QkvNormRopeCacheParams& p, void* stream);
bool run_attention(const ops::AttentionParams& p, void* stream);
bool run_indexer(const ops::IndexerParams& p, void* stream);
bool run_sample(const ops::SampleParams& p, void* stream);

}  // namespace sieve::cuda
