// `sieve bench kernels` rows "moe route + router gemm" (the fused routing against matmul + routing,
// 1 / 32 / 64 tokens) and "moe experts fp8" (see bench_moe_fp8.h): FP8 moe_experts at one TP4
// and one TP8 rank of MiniMax-M3 (hidden 6144, 768 / 384 units of each of 128 experts, top-4,
// (1, 128) weight scales as MXFP8 regrouped for the GPU, tiled as the model uploads them
// (MoeExpertsParams::scale_tiled; a "row-major scales" row at 1, 32, 256 and 8192 tokens), fp32
// activations as the model runs them),
// for 1, 32, 256, 1024 and 8192 tokens routed to 4 distinct experts drawn uniformly (fixed seed).
// Floor: the touched experts' fp8 bytes and scales read once at the measured copy rate, or at 8192
// tokens the products' FLOPs at the measured FP8 matrix rate (cuBLASLt, e4m3 8192^3, per-tensor
// scales, random data), whichever is larger. Each case: the default kernels eagerly and replayed
// from a CUDA graph, and the other kernel family (or the stream kernels without programmatic
// dependent launch) for comparison; at decode sizes also the sort's knobs off and on and the k
// split picked by the kernels (MoeTuning::fp8_sort_*, fp8_map_cache, fp8_ksplit_waves).
// At decode sizes also a read probe: a kernel that only TMA-reads the touched experts' weight
// boxes in the stream kernels' order (their units, k splits, stages of 2 k blocks and ring depth;
// no math, no scales), which tells how much of the gap to the floor is the DRAM access pattern.
#include "kernels/bench/bench_moe_fp8.h"

#include <cuda_runtime.h>
#ifdef SIEVE_HAVE_CUBLAS
#include <cublasLt.h>
#endif

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/bench/harness.cuh"
#include "kernels/cuda/moe_fp8.cuh"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/moe_fp8_work.h"
#include "kernels/cuda/tuning.h"

namespace sieve::kernels_bench {

using cuda::cuda_check;

namespace {

// Tuning for the scope of a row: the values in force with `edit` applied.
cuda::Tuning tuned(const std::function<void(cuda::MoeTuning&)>& edit) {
  cuda::Tuning t = cuda::tuning();
  edit(t.moe);
  return t;
}

// The FP8 matrix rate (TFLOP/s): cuBLASLt e4m3 x e4m3 -> bf16, 8192^3, fp32 accumulation; 0 when
// cuBLASLt is missing or refuses.
double measure_fp8_tflops(cudaStream_t st) {
#ifdef SIEVE_HAVE_CUBLAS
  const int N = 8192;
  DevMem A(size_t(N) * N), B(size_t(N) * N), C(size_t(N) * N * 2), ws(size_t(64) << 20);
  fill(A.p, 1, size_t(N) * N, 41, 0.5f);
  fill(B.p, 1, size_t(N) * N, 42, 0.5f);
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  double tflops = 0;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const size_t ws_bytes = size_t(64) << 20;
  bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, N, N, N) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, N, N, N) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, N, N) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof(ws_bytes)) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS &&
       found > 0;
  if (ok) {
    const float alpha = 1.0f, beta = 0.0f;
    bool run_ok = true;
    const double us = time_it(
        20, 1,
        [&](int, cudaStream_t s) {
          run_ok = run_ok && cublasLtMatmul(h, op, &alpha, A.p, la, B.p, lb, &beta, C.p, lc, C.p, lc, &heur.algo, ws.p,
                                            ws_bytes, s) == CUBLAS_STATUS_SUCCESS;
        },
        false, st);
    if (run_ok) tflops = 2.0 * N * double(N) * N / (us * 1e-6) / 1e12;
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (op) cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
  (void)cudaGetLastError();
  return tflops;
#else
  (void)st;
  return 0;
#endif
}

// The read probe (see the top): per unit (int4: expert, 256-row block, k blocks [x, y)), 4 weight
// boxes a k block through the expert's map (the stream producer's rows: moe_fp8_work.h), kp k
// blocks a stage, into a ring of S stages; warp 0's lane 0 loads (L2 evict-first, as the stream
// kernels), warp 1's lane 0 waits for each stage and frees it. inter, hidden: the weight rows of
// gate_up's units, down's rows.
constexpr int kProbeKp = 2, kProbeStage = kProbeKp * 4 * 64 * 128;
__global__ void read_probe_kernel(const CUtensorMap* maps, const int4* units, int n_units, bool gate_up, int inter,
                                  int hidden, int S) {
  extern __shared__ uint8_t probe_smem_raw[];
  uint8_t* const ring = cuda::moe_fp8::align1024(probe_smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(ring + S * kProbeStage);
  uint64_t* const empty = full + S;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      cuda::mbar_init(&full[s], 1);
      cuda::mbar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x % 32 != 0) return;
  const bool producer = threadIdx.x == 0;
  const uint64_t policy = cuda::l2_policy_evict_first();
  int s = 0;
  uint32_t ph = producer ? 1 : 0;
  for (int i = blockIdx.x; i < n_units; i += gridDim.x) {
    const int4 u = units[i];
    for (int kb = u.z; kb < u.w; kb += kProbeKp) {
      const int nk = min(kProbeKp, u.w - kb);
      if (producer) {
        cuda::mbar_wait(&empty[s], ph);
        cuda::mbar_expect_tx(&full[s], uint32_t(nk * 4 * 64 * 128));
        for (int ii = 0; ii < nk; ++ii)
          for (int b = 0; b < 4; ++b) {
            bool unused;
            const int y = gate_up ? cuda::moe_fp8::gate_up_row(u.y, 64 * b, inter, unused)
                                  : cuda::moe_fp8::down_row(u.y, 64 * b, hidden, unused);
            cuda::moe_fp8::tma_load_hint(ring + s * kProbeStage + (4 * ii + b) * 64 * 128, maps + u.x,
                                         (kb + ii) * 128, y, &full[s], policy);
          }
      } else {
        cuda::mbar_wait(&full[s], ph);
        cuda::mbar_arrive(&empty[s]);
      }
      if (++s == S) s = 0, ph ^= 1;
    }
  }
}

// The probe of one call's two products over the touched experts (`used`), k splits by the stream
// path's host rule (moe_fp8_work.h host_ksplit) over the experts it touches.
struct MoeReadProbe {
  DevMem maps_gu, maps_dn, units_gu, units_dn;
  int n_gu = 0, n_dn = 0, S = 0, sms = 0, inter = 0, hidden = 0;
  size_t smem = 0;
  MoeReadProbe(const std::vector<const void*>& gu, const std::vector<const void*>& dn, const std::vector<char>& used,
               int64_t H, int64_t I)
      : maps_gu(used.size() * sizeof(CUtensorMap)), maps_dn(used.size() * sizeof(CUtensorMap)),
        units_gu(size_t(1) << 20), units_dn(size_t(1) << 20) {
    const int E = int(used.size()), gh = int(H / 128), gi = int(I / 128);
    std::vector<CUtensorMap> mg(static_cast<size_t>(E)), md(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e)
      if (!cuda::moe_fp8::weight_map(&mg[size_t(e)], gu[size_t(e)], 2 * I, H) ||
          !cuda::moe_fp8::weight_map(&md[size_t(e)], dn[size_t(e)], H, I))
        throw Error("bench: the read probe's tensor maps");
    cuda_check(cudaMemcpy(maps_gu.p, mg.data(), mg.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(maps_dn.p, md.data(), md.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "bench: SMs");
    const int experts = int(std::count(used.begin(), used.end(), 1));
    auto units = [&](int rbs, int nkb, DevMem& d) {
      const int ks = cuda::moe_fp8::host_ksplit(int64_t(experts) * rbs, nkb, sms);
      std::vector<int4> u;
      for (int e = 0; e < E; ++e) {
        if (!used[size_t(e)]) continue;
        for (int rb = 0; rb < rbs; ++rb)
          for (int k = 0; k < ks; ++k) {
            int kb0, kb1;
            cuda::moe_fp8::split_range(k, ks, nkb, kb0, kb1);
            u.push_back(make_int4(e, rb, kb0, kb1));
          }
      }
      cuda_check(cudaMemcpy(d.p, u.data(), u.size() * sizeof(int4), cudaMemcpyHostToDevice), "upload");
      return int(u.size());
    };
    n_gu = units(int((I + 127) / 128), gh, units_gu);
    n_dn = units(int((H + 255) / 256), gi, units_dn);
    inter = int(I), hidden = int(H);
    S = 210 * 1024 / (kProbeStage + 3 * 1024);  // the stream kernels' ring (a stage with its token rows and scales)
    smem = 1024 + size_t(S) * kProbeStage + 2 * size_t(S) * 8;
    cuda_check(cudaFuncSetAttribute(read_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
               "bench: the read probe's shared memory");
  }
  void run(cudaStream_t st) const {
    read_probe_kernel<<<std::min(n_gu, sms), 64, smem, st>>>(static_cast<const CUtensorMap*>(maps_gu.p),
                                                            static_cast<const int4*>(units_gu.p), n_gu, true, inter,
                                                            hidden, S);
    read_probe_kernel<<<std::min(n_dn, sms), 64, smem, st>>>(static_cast<const CUtensorMap*>(maps_dn.p),
                                                            static_cast<const int4*>(units_dn.p), n_dn, false, inter,
                                                            hidden, S);
    cuda_check(cudaGetLastError(), "bench: the read probe");
  }
};

}  // namespace

// moe_route with the router GEMM (fp32 router weight [128, 6144], fp32 x): fused into one kernel,
// split over K (two kernels) and matmul (cuBLAS fp32) + the routing kernel; floor: the router
// weight read once.
void run_route(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row, cudaStream_t st) {
  constexpr const char* kKernel = "moe route + router gemm";
  if (!opt.rows.empty() && std::string(kKernel).find(opt.rows) == std::string::npos) return;
  constexpr int64_t H = 6144;
  constexpr int E = 128, K = 4;
  DevMem gate(size_t(E * H) * 4), bias(E * 4);
  fill(gate.p, 2, size_t(E * H), 51, 0.04f, -0.02f);
  fill(bias.p, 2, E, 52, 0.02f, -0.01f);
  for (int tokens : {1, 32, 64}) {
    const std::string shape = std::to_string(tokens) + " tokens";
    if (!opt.filter.empty() && ("moe route " + shape).find(opt.filter) == std::string::npos) continue;
    DevMem x(size_t(tokens * H) * 4), ids(size_t(tokens) * K * 4), w(size_t(tokens) * K * 4);
    fill(x.p, 2, size_t(tokens * H), 53, 2.0f, -1.0f);
    ops::MoeRouteParams p;
    p.x = x.p, p.x_dtype = DType::F32, p.hidden = H, p.ldx = H, p.gate = static_cast<const float*>(gate.p);
    p.bias = static_cast<const float*>(bias.p);
    p.num_tokens = tokens, p.num_experts = E, p.topk = K, p.scaling = 2.0f;
    p.ids = static_cast<int32_t*>(ids.p), p.weights = static_cast<float*>(w.p);
    cuda_check(cudaDeviceSynchronize(), "bench inputs");
    const double floor_us = double(E * H) * 4 / (env.copy_gbps * 1e9) * 1e6;
    // 0: fused, 1: split-K router GEMM (8 warps a CTA, the default) + summing routing kernel, 2:
    // the same with 4 warps a CTA, 3: cuBLAS + routing.
    for (int mode : {0, 1, 2, 3}) {
      cuda::TuningScope scope(tuned([&](cuda::MoeTuning& m) {
        m.route_fused_max_tokens = mode == 0 ? 64 : 0;
        m.route_splitk_max_tokens = mode == 1 || mode == 2 ? 64 : 0;
        m.route_splitk_warps = mode == 2 ? 4 : 8;
      }));
      static constexpr const char* kModes[] = {"fused (one kernel), ", "split-K 8 warps + routing, ",
                                               "split-K 4 warps + routing, ", "matmul + routing, "};
      Row r{kKernel, shape, "f32", std::string(kModes[mode]) + kBatchMode, 0, floor_us, "bytes"};
      r.runs = opt.iters, r.input_sets = 1;
      r.us = time_it(opt.iters, 1, [&](int, cudaStream_t s) { cuda::run_moe_route(p, s); }, true, st, kGraphBatch);
      on_row(r);
    }
  }
}

void run_moe_fp8(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row, cudaStream_t st) {
  run_route(opt, env, on_row, st);
  constexpr const char* kKernel = "moe experts fp8";
  if (!opt.rows.empty() && std::string(kKernel).find(opt.rows) == std::string::npos) return;
  auto wanted = [&](const std::string& what) { return opt.filter.empty() || what.find(opt.filter) != std::string::npos; };
  constexpr int64_t H = 6144;
  constexpr int E = 128, K = 4;
  double fp8_tflops = measure_fp8_tflops(st);
  std::string rate_note = "cublasLt e4m3 8192^3";
  if (fp8_tflops <= 0) {
    fp8_tflops = 2 * env.bf16_tflops;
    rate_note = "assumed 2 x the bf16 rate";
  }
  std::fprintf(stderr, "moe experts fp8: FP8 matrix rate %.0f TFLOP/s (%s), copy %.0f GB/s\n", fp8_tflops,
               rate_note.c_str(), env.copy_gbps);
  const double bw = env.copy_gbps * 1e9, rate = fp8_tflops * 1e12;
  for (int64_t I : {768, 384}) {
    const std::string rank = I == 768 ? "TP4" : "TP8";
    const int64_t gh = (H + 127) / 128, gi = (I + 127) / 128;
    const size_t gu_bytes = size_t(2 * I * H), dn_bytes = size_t(H * I);
    const size_t gus_n = size_t(2 * I * gh), dns_n = size_t(H * gi);
    DevMem wgu(gu_bytes * E), wdn(dn_bytes * E), sgu(gus_n * 4 * E), sdn(dns_n * 4 * E);
    fill(wgu.p, 1, gu_bytes * E, 900 + I);
    fill(wdn.p, 1, dn_bytes * E, 1900 + I);
    // Multipliers that make the dequantized weights about +-0.02 (gate_up) / +-0.05 (down).
    fill(sgu.p, 2, gus_n * E, 2900 + I, 0.02f / 448.0f, 0.02f / 448.0f);
    fill(sdn.p, 2, dns_n * E, 3900 + I, 0.05f / 448.0f, 0.05f / 448.0f);
    std::vector<const void*> gu_p(E), dn_p(E);
    std::vector<const float*> gus_p(E), dns_p(E);
    for (int e = 0; e < E; ++e) {
      gu_p[size_t(e)] = static_cast<uint8_t*>(wgu.p) + gu_bytes * e;
      dn_p[size_t(e)] = static_cast<uint8_t*>(wdn.p) + dn_bytes * e;
      gus_p[size_t(e)] = static_cast<float*>(sgu.p) + gus_n * e;
      dns_p[size_t(e)] = static_cast<float*>(sdn.p) + dns_n * e;
    }
    // The same scales tiled (ops::fp8_scales_moe_tiled), as the model uploads them.
    const size_t gut_n = size_t(ops::fp8_moe_tiled_size(2 * I, H, true));
    const size_t dnt_n = size_t(ops::fp8_moe_tiled_size(H, I, false));
    DevMem sgu_tiled(gut_n * 4 * E), sdn_tiled(dnt_n * 4 * E);
    auto tiled_copy = [&](const DevMem& src, DevMem& dst, int64_t n_rows, int64_t k, bool gate_up, size_t per_t) {
      const size_t per = size_t(n_rows * ((k + 127) / 128));
      std::vector<float> h(per * E);
      cuda_check(cudaMemcpy(h.data(), src.p, h.size() * 4, cudaMemcpyDeviceToHost), "bench scales");
      for (int e = 0; e < E; ++e) {
        const std::vector<float> t = ops::fp8_scales_moe_tiled(h.data() + per * e, n_rows, k, gate_up);
        cuda_check(cudaMemcpy(static_cast<float*>(dst.p) + per_t * e, t.data(), per_t * 4, cudaMemcpyHostToDevice),
                   "bench scales");
      }
    };
    tiled_copy(sgu, sgu_tiled, 2 * I, H, true, gut_n);
    tiled_copy(sdn, sdn_tiled, H, I, false, dnt_n);
    std::vector<const float*> gus_tiled(E), dns_tiled(E);
    for (int e = 0; e < E; ++e) {
      gus_tiled[size_t(e)] = static_cast<float*>(sgu_tiled.p) + gut_n * e;
      dns_tiled[size_t(e)] = static_cast<float*>(sdn_tiled.p) + dnt_n * e;
    }
    DevMem d_gu(E * 8), d_dn(E * 8), d_gus(E * 8), d_dns(E * 8), d_gus_tiled(E * 8), d_dns_tiled(E * 8);
    cuda_check(cudaMemcpy(d_gu.p, gu_p.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(d_dn.p, dn_p.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(d_gus.p, gus_p.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(d_dns.p, dns_p.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(d_gus_tiled.p, gus_tiled.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaMemcpy(d_dns_tiled.p, dns_tiled.data(), E * 8, cudaMemcpyHostToDevice), "upload");
    std::mt19937 rng(77);
    for (int tokens : {1, 32, 256, 1024, 8192}) {
      const std::string shape = std::to_string(tokens) + " tokens " + rank;
      if (!wanted("moe fp8 " + shape)) continue;
      std::vector<int32_t> ids(size_t(tokens) * K);
      std::vector<float> wts(ids.size(), 0.25f);
      std::vector<char> used(E, 0);
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> perm(E);
        std::iota(perm.begin(), perm.end(), 0);
        for (int j = 0; j < K; ++j) {
          std::swap(perm[size_t(j)], perm[size_t(j) + rng() % size_t(E - j)]);
          ids[size_t(t) * K + size_t(j)] = perm[size_t(j)];
          used[size_t(perm[size_t(j)])] = 1;
        }
      }
      const double experts = double(std::count(used.begin(), used.end(), 1));
      DevMem d_ids(ids.size() * 4), d_w(wts.size() * 4), x(size_t(tokens) * H * 4), out(size_t(tokens) * H * 4);
      cuda_check(cudaMemcpy(d_ids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "upload");
      cuda_check(cudaMemcpy(d_w.p, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice), "upload");
      fill(x.p, 2, size_t(tokens) * H, 31, 2.0f, -1.0f);
      fill(out.p, 2, size_t(tokens) * H, 32, 2.0f, -1.0f);
      ops::MoeExpertsParams p;
      p.x = x.p;
      p.act_dtype = DType::F32;
      p.num_tokens = tokens, p.hidden = H, p.inter = I, p.num_experts = E, p.topk = K;
      p.ids = static_cast<const int32_t*>(d_ids.p);
      p.weights = static_cast<const float*>(d_w.p);
      p.w_gate_up = static_cast<const void* const*>(d_gu.p);
      p.w_down = static_cast<const void* const*>(d_dn.p);
      p.w_dtype = DType::FP8_E4M3;
      p.w_gate_up_scale = static_cast<const float* const*>(d_gus.p);
      p.w_down_scale = static_cast<const float* const*>(d_dns.p);
      p.scale_block_rows = 1;
      p.scale_block_cols = 128;
      p.out = out.p;
      cuda_check(cudaDeviceSynchronize(), "bench inputs");
      const double bytes = experts * (double(3 * H * I) + 4.0 * double(gus_n + dns_n));
      const double flops = double(tokens) * K * 2.0 * 3.0 * double(H * I);
      const bool by_flops = tokens >= 8192 || flops / rate > bytes / bw;
      const double floor_us = (by_flops ? flops / rate : bytes / bw) * 1e6;
      auto fn = [&](int, cudaStream_t s) {
        if (!cuda::run_moe_experts(p, s)) throw Error("bench: moe_experts fp8 refused its parameters");
      };
      // The default, then the other kernel family (decode sizes: the tiles; prefill sizes: the
      // stream kernels) and at 32 tokens the stream kernels without PDL.
      const bool stream_default = int64_t(tokens) * K <= int64_t(cuda::tuning().moe.fp8_stream_pairs_per_expert) * E;
      // At prefill sizes also the tile kernels' other scale layouts and map sources
      // (MoeTuning::fp8_tile_*; the default: bulk copies of the tiled weight scales and the
      // k-block-major token scales, parameter maps): the row-major scales and device-written maps
      // are the kernels before; under a graph the parameter maps are not used (they read the
      // expert pointers on the host), so the graph row times the device maps.
      struct Variant {
        int path;  // MoeTuning::fp8_path
        bool pdl, graph;
        std::string mode;
        bool kmajor = true, bulk = true, param_maps = true;
        // The sort's knobs (fp8_sort_pdl, fp8_sort_scan, fp8_map_cache) all off (0) or on (1),
        // and MoeTuning::fp8_ksplit_waves; -1: as tuned.
        int sort = -1, waves = -1;
        int experiment = 0;  // MoeTuning::fp8_stream_experiment
        bool rowmajor = false;  // the weights' scales row-major (not MoeExpertsParams::scale_tiled)
        // Weight blocks of (128, 128) (the row-major arrays read as such; tiled a call) with
        // MoeTuning::fp8_tile_block_scales off (0) or on (1); -1: (1, 128) blocks.
        int block = -1;
        int staged = -1;  // MoeTuning::fp8_tile_staged_out
        int dynamic = -1;  // MoeTuning::fp8_tile_dynamic (-1: as tuned)
        bool out_bf16 = false;  // MoeExpertsParams::out_bf16 (the model's bf16 sublayer output)
      };
      const std::string def = stream_default ? "stream kernels (default)" : "tile kernels (default)";
      std::vector<Variant> variants = {{0, true, false, def}, {0, true, true, def + ", " + kBatchMode}};
      // The output in bf16, as the model hands it (its sublayer outputs are bf16 on CUDA).
      if (tokens == 32 || tokens == 8192) {
        const std::string mode = def + ", bf16 output (as the model)" + (tokens == 32 ? ", " + kBatchMode : "");
        Variant ob{0, true, tokens == 32, mode};
        ob.out_bf16 = true;
        variants.push_back(ob);
      }
      if (tokens <= 1024) variants.push_back({stream_default ? 2 : 1, true, false, stream_default ? "tile kernels" : "stream kernels"});
      if (tokens == 32) variants.push_back({1, false, true, "stream kernels, no PDL, " + kBatchMode});
      // Decode sizes: the fixed costs of the call (issue 44) as before and now, and the k split
      // picked by the kernels, all replayed from graphs as the model runs them.
      if (stream_default && tokens <= 256) {
        variants.push_back({0, true, true, "stream, sort before (plain, serial prefix, maps every call), " + kBatchMode,
                            true, true, true, 0, 0});
        variants.push_back({0, true, true, "stream, sort pdl + scan + map cache, " + kBatchMode, true, true, true, 1, 0});
        variants.push_back({0, true, true, "stream, sort pdl + scan + map cache, k splits by waves, " + kBatchMode, true,
                            true, true, 1, 16});
        Variant rm{0, true, true, "stream, row-major scales, " + kBatchMode};
        rm.rowmajor = true;
        variants.push_back(rm);
        Variant x1{0, true, true, "stream experiment (wrong results): no weight scales, " + kBatchMode};
        x1.experiment = 1;
        variants.push_back(x1);
        Variant x2{0, true, true, "stream experiment (wrong results): no weight scales, no products, " + kBatchMode};
        x2.experiment = 2;
        variants.push_back(x2);
      }
      if (tokens >= 1024) {
        for (int dv : {0, 1}) {
          Variant dt{2, true, false, dv ? "tiles, dynamic tile order" : "tiles, static tile order"};
          dt.dynamic = dv;
          variants.push_back(dt);
        }
        Variant d{2, true, false, "tiles, epilogue fragments stored directly (before)"};
        d.staged = 0;
        variants.push_back(d);
        variants.push_back({2, true, false, "tiles, bulk tiled scales, device maps", true, true, false});
        variants.push_back({2, true, false, "tiles, cp.async tiled scales, parameter maps", true, false, true});
        variants.push_back({2, true, false, "tiles, cp.async tiled scales, device maps", true, false, false});
        variants.push_back({2, true, false, "tiles, row-major scales, device maps (before)", false, false, false});
      }
      if (tokens == 8192) {
        Variant rm{0, true, false, "tiles, row-major scales (transposed a call), bulk copies, parameter maps"};
        rm.rowmajor = true;
        variants.push_back(rm);
        // (128, 128) weight blocks (HF fp8, --quantization fp8): one multiplier a run of rows in
        // the promotion, and one a column as before.
        for (int b : {1, 0}) {
          Variant bv{0, true, false, b ? "tiles, (128, 128) weight blocks, a multiplier a run of rows"
                                       : "tiles, (128, 128) weight blocks, a multiplier a column"};
          bv.rowmajor = true;
          bv.block = b;
          variants.push_back(bv);
        }
        for (int dv : {1, 0}) {
          Variant bd{0, true, false,
                     std::string("tiles, (128, 128) weight blocks, a multiplier a run of rows, ") +
                         (dv ? "dynamic tile order" : "static tile order")};
          bd.rowmajor = true;
          bd.block = 1;
          bd.dynamic = dv;
          variants.push_back(bd);
        }
      }
      for (const Variant& v : variants) {
        cuda::TuningScope scope(tuned([&](cuda::MoeTuning& m) {
          m.fp8_path = v.path;
          m.fp8_pdl = v.pdl;
          m.fp8_tile_kmajor_scales = v.kmajor;
          m.fp8_tile_bulk_scales = v.bulk;
          m.fp8_tile_param_maps = v.param_maps;
          if (v.sort >= 0) m.fp8_sort_pdl = m.fp8_sort_scan = m.fp8_map_cache = v.sort == 1;
          if (v.waves >= 0) m.fp8_ksplit_waves = v.waves;
          m.fp8_stream_experiment = v.experiment;
          if (v.block >= 0) m.fp8_tile_block_scales = v.block == 1;
          m.fp8_tile_staged_out = v.staged;
          if (v.dynamic >= 0) m.fp8_tile_dynamic = v.dynamic == 1;
        }));
        p.scale_block_rows = v.block >= 0 ? 128 : 1;
        p.out_bf16 = v.out_bf16;
        // (The tile kernels' row-major scale mode takes row-major weight scales only.)
        const bool rowmajor = v.rowmajor || !v.kmajor;
        p.scale_tiled = !rowmajor;
        p.w_gate_up_scale = static_cast<const float* const*>(rowmajor ? d_gus.p : d_gus_tiled.p);
        p.w_down_scale = static_cast<const float* const*>(rowmajor ? d_dns.p : d_dns_tiled.p);
        Row r{kKernel, shape, v.block >= 0 ? "fp8 (128,128)" : "fp8 (1,128)", v.mode, 0, floor_us,
              by_flops ? "flops" : "bytes"};
        r.runs = tokens >= 1024 ? std::min(opt.iters, 30) : opt.iters;
        r.input_sets = 1;
        if (tokens == 32 && rank == "TP4") {
          r.target_us = 1.15 * floor_us;
          r.target_note = "<= 1.15 x the touched experts' bytes (issue 44)";
        } else if (tokens == 8192) {
          r.target_us = 2.0 * floor_us;
          r.target_note = ">= 50 % of the FP8 matrix rate (issue 44)";
        }
        r.us = time_it(r.runs, 1, fn, v.graph, st, v.graph ? kGraphBatch : 1);
        on_row(r);
      }
      // The read probe (graph replays; floor as the rows above, which also counts the scales that
      // the probe does not read).
      if (stream_default && tokens <= 256) {
        const MoeReadProbe probe(gu_p, dn_p, used, H, I);
        Row r{kKernel, shape, "fp8 (1,128)", "read probe (weight boxes only, stream order), row-major, " + kBatchMode,
              0, floor_us, "bytes"};
        r.runs = opt.iters;
        r.input_sets = 1;
        r.us = time_it(r.runs, 1, [&](int, cudaStream_t s) { probe.run(s); }, true, st, kGraphBatch);
        on_row(r);
      }
    }
  }
}

}  // namespace sieve::kernels_bench
