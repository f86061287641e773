// Ops that have no CUDA kernel yet answer "unsupported"; kernels/ops.cpp turns that into an
// Error naming the op. Each kernel file replaces its op's entry here when it lands.
#include "kernels/cuda/cuda_ops.h"

namespace sieve::cuda {

bool run_matmul(const ops::MatmulParams&, void*) { return false; }
bool run_embedding(const ops::EmbeddingParams&, void*) { return false; }
bool run_rms_norm(const ops::RmsNormParams&, void*) { return false; }
bool run_add(const ops::AddParams&, void*) { return false; }
bool run_swiglu_oai(const ops::SwigluOaiParams&, void*) { return false; }
bool run_moe_route(const ops::MoeRouteParams&, void*) { return false; }
bool run_moe_experts(const ops::MoeExpertsParams&, void*) { return false; }

}  // namespace sieve::cuda
