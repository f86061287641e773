// FP8 GEMMs through cuBLASLt (linear.h): the per-tensor, per-row (outer vector, as
// torch._scaled_mm's rowwise) and block (1 x 128 tokens; 128 x 128 or 1 x 128 weights) scalings,
// for linear's prefill path and the benchmark's side-by-side rows. Descriptors and the heuristic's
// algorithm are made once per shape and kept, so that a call costs the launch only (the
// benchmark's events would otherwise time the host's set-up too); the workspace is a private
// grow-only buffer, so calls can be captured in a CUDA graph after one eager call.
#include <cuda_runtime.h>
#ifdef SIEVE_HAVE_CUBLAS
#include <cublasLt.h>
#endif

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/linear.h"

namespace sieve::cuda {

#ifndef SIEVE_HAVE_CUBLAS

bool cublaslt_fp8_gemm(const LtGemm&, void*, std::string* why) {
  if (why) *why = "this build has no cuBLASLt";
  return false;
}
bool cublaslt_fp8_accepts(const LtGemm&, std::string* why) {
  if (why) *why = "this build has no cuBLASLt";
  return false;
}

#else

namespace {

constexpr size_t kLtWorkspace = size_t(32) << 20;

// A shape's descriptors and algorithm (or why cuBLASLt has none).
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  std::string why;
  ~LtPlan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int>;

std::mutex g_mu;
std::map<int, cublasLtHandle_t> g_handles;
std::map<Key, std::unique_ptr<LtPlan> > g_plans;

std::string status_text(const char* what, cublasStatus_t s) {
  return std::string(what) + " failed (cuBLAS status " + std::to_string(int(s)) + ")";
}

int32_t scale_mode(LtScaling s, bool weights) {
  switch (s) {
    case LtScaling::kTensor:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case LtScaling::kOuterVec:
      return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    case LtScaling::kBlock:
      return weights ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case LtScaling::kVec128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// Builds the descriptors of g's shape and asks the heuristic for one algorithm (under g_mu).
void build(LtPlan& pl, cublasLtHandle_t h, const LtGemm& g) {
  cublasStatus_t s = cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) {
    pl.why = status_text("cublasLtMatmulDescCreate", s);
    return;
  }
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t am = scale_mode(g.scaling, true), bm = scale_mode(g.scaling, false);
  const int8_t fast = g.fast_accum ? 1 : 0;
  cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
  s = cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am));
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm));
  if (s != CUBLAS_STATUS_SUCCESS) {
    pl.why = status_text("setting the scale modes", s);
    return;
  }
  // The heuristic looks at the scale pointers' presence; the real ones are set at each call.
  const void* sa = g.w_scale;
  const void* sb = g.x_scale;
  cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
  cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  const cudaDataType yt = g.y_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  s = cublasLtMatrixLayoutCreate(&pl.a, CUDA_R_8F_E4M3, uint64_t(g.k), uint64_t(g.n), g.k);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutCreate(&pl.b, CUDA_R_8F_E4M3, uint64_t(g.k), uint64_t(g.m), g.ldx);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutCreate(&pl.c, yt, uint64_t(g.n), uint64_t(g.m), g.ldy);
  if (s != CUBLAS_STATUS_SUCCESS) {
    pl.why = status_text("cublasLtMatrixLayoutCreate", s);
    return;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const size_t ws = kLtWorkspace;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(h, pl.desc, pl.a, pl.b, pl.c, pl.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    pl.why = s != CUBLAS_STATUS_SUCCESS
                 ? status_text("cublasLtMatmulAlgoGetHeuristic", s)
                 : std::string("cuBLASLt has no algorithm for this scaling on this GPU");
    return;
  }
  pl.algo = res.algo;
  pl.ok = true;
}

// g's plan (built on first use) and the device's handle.
LtPlan* plan_for(const LtGemm& g, cublasLtHandle_t* handle) {
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(g_mu);
  auto& hh = g_handles[dev];
  if (!hh && cublasLtCreate(&hh) != CUBLAS_STATUS_SUCCESS)
    throw Error("cuBLASLt: cannot create a handle");
  *handle = hh;
  const Key key{dev,          g.m,         g.n, g.k, g.ldx, g.ldy, int(g.y_dtype), int(g.scaling),
                g.accumulate, g.fast_accum};
  auto& slot = g_plans[key];
  if (!slot) {
    slot = std::make_unique<LtPlan>();
    build(*slot, hh, g);
  }
  return slot.get();
}

}  // namespace

bool cublaslt_fp8_accepts(const LtGemm& g, std::string* why) {
  cublasLtHandle_t h = nullptr;
  const LtPlan* pl = plan_for(g, &h);
  if (!pl->ok && why) *why = pl->why;
  return pl->ok;
}

bool cublaslt_fp8_gemm(const LtGemm& g, void* stream, std::string* why) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cublasLtHandle_t h = nullptr;
  LtPlan* pl = plan_for(g, &h);
  if (!pl->ok) {
    if (why) *why = pl->why;
    return false;
  }
  void* ws = private_scratch(st, kScratchLinearLt, kLtWorkspace);
  const void* sa = g.w_scale;
  const void* sb = g.x_scale;
  cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
  cublasLtMatmulDescSetAttribute(pl->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t s = cublasLtMatmul(h, pl->desc, &alpha, g.w, pl->a, g.x, pl->b, &beta, g.y,
                                          pl->c, g.y, pl->c, &pl->algo, ws, kLtWorkspace, st);
  if (s != CUBLAS_STATUS_SUCCESS) {
    if (why) *why = status_text("cublasLtMatmul", s);
    return false;
  }
  return true;
}

#endif

}  // namespace sieve::cuda
