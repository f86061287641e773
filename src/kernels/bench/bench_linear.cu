// `sieve bench kernels` rows of the FP8 GEMM ("fp8 linear ..."): ops::linear with FP8 weights at
// the per-rank shapes of MiniMax-M3 (TP4 and TP8: qkv, o_proj, the dense MLP's gate_up and down,
// the shared expert's gate_up and down) for m = 1, 32, 64 and 8192 tokens, next to cuBLASLt FP8
// GEMMs of the same shapes (per-row scales as torch._scaled_mm's rowwise; 1 x 128 / 128 x 128
// block scaling where cuBLASLt takes it), and the FP8 matrix rate measured through cuBLASLt.
// Floors: m <= 64 the bytes (FP8 weights and their scales, x, y) over the measured copy rate;
// m = 8192 the FLOPs over the measured FP8 rate. Weight sets rotate so that a row's weights over
// all sets exceed 4 x the L2 (every call reads its weights from DRAM, as a decode step does).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/bench/bench.h"
#include "kernels/bench/harness.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear.h"

namespace sieve::kernels_bench {

namespace {

// Weights and rows: fp8 codes of values spread over [-448, 448] (harness fill kind 1); scales
// f32 in [lo, lo + a) (kind 2).
void fill_fp8(void* p, size_t n, uint64_t seed) {
  fill(p, 1, n, seed);
}
void fill_f32(void* p, size_t n, uint64_t seed, float lo, float a) {
  fill(p, 2, n, seed, a, lo);
}

// Median microseconds a call: eagerly, or with `batch` > 1 per call of a graph of `batch` calls.
double time_calls(int iters, int sets, const std::function<void(int, cudaStream_t)>& fn,
                  cudaStream_t st, int batch = 1) {
  return time_it(iters, sets, fn, batch > 1, st, batch);
}

constexpr const char* kRate = "fp8 matrix rate (cuBLASLt)";
constexpr const char* kOwn = "fp8 linear";
constexpr const char* kLtRow = "fp8 linear, cuBLASLt rowwise";
constexpr const char* kLtBlock = "fp8 linear, cuBLASLt 1x128/128x128";

// The FP8 rate: an 8192^3 cuBLASLt GEMM with per-tensor scales, bf16 out, random data (TFLOP/s;
// 0 when cuBLASLt has none).
double measure_fp8_rate(int iters, cudaStream_t st, double* us_out) {
  const int64_t N = 8192;
  DevPtr a = dev(size_t(N * N)), b = dev(size_t(N * N)), c = dev(size_t(N * N) * 2), s = dev(16);
  fill_fp8(a->p, size_t(N * N), 1);
  fill_fp8(b->p, size_t(N * N), 2);
  fill_f32(s->p, 4, 3, 1.0f / 448, 0.0f);
  cuda::LtGemm g;
  g.x = a->p, g.ldx = N, g.x_scale = s->as<float>(), g.w = b->p, g.w_scale = s->as<float>();
  g.y = c->p, g.y_dtype = DType::BF16, g.ldy = N, g.m = N, g.n = N, g.k = N,
  g.scaling = cuda::LtScaling::kTensor;
  std::string why;
  if (!cuda::cublaslt_fp8_gemm(g, st, &why)) return 0;
  const double us = time_calls(
      std::max(20, iters / 5), 1, [&](int, cudaStream_t t) { cuda::cublaslt_fp8_gemm(g, t); }, st);
  *us_out = us;
  return 2.0 * double(N) * N * N / (us * 1e-6) / 1e12;
}

struct Shape {
  const char* name;
  int tp;
  int64_t n, k;
};

// One shape's inputs: `sets` FP8 weights with both scale layouts, FP8 and BF16 rows, outputs.
struct LinearSet {
  DevPtr w, ws128, ws1, x, xs, xb, y, xs_lt, wrow, xrow;
};

}  // namespace

void run_linear_rows(const Options& opt, const Env& env,
                     const std::function<void(const Row&)>& on_row) {
  auto row_wanted = [&](const char* kernel) {
    return opt.rows.empty() || std::string(kernel).find(opt.rows) != std::string::npos;
  };
  auto case_wanted = [&](const std::string& c) {
    return opt.filter.empty() || c.find(opt.filter) != std::string::npos;
  };
  const bool want_own = row_wanted(kOwn), want_lt = row_wanted(kLtRow) || row_wanted(kLtBlock);
  // The rate row belongs to the "fp8 linear" cases (their prefill floors use it).
  const bool want_rate = row_wanted(kRate) && case_wanted("fp8 linear: fp8 matrix rate 8192^3 fp8");
  if (!want_own && !want_lt && !want_rate) return;
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  const int iters = std::max(50, opt.iters);
  const double bw = env.copy_gbps * 1e9;
  double rate_us = 0;
  double rate = measure_fp8_rate(iters, st, &rate_us);
  if (want_rate) {
    Row r{kRate, "8192^3 per-tensor", "fp8", "bf16 out", rate_us, 0, "-"};
    r.target_note = rate > 0 ? std::to_string(int(rate)) + " TFLOP/s" : "cuBLASLt has no fp8 GEMM";
    r.runs = std::max(20, iters / 5), r.input_sets = 1;
    on_row(r);
  }
  if (rate <= 0) rate = 1000;  // the prefill floors still need a rate
  rate *= 1e12;

  const Shape shapes[] = {
      {"qkv", 4, 2560, 6144},
      {"o_proj", 4, 6144, 2048},
      {"mlp gate_up", 4, 6144, 6144},
      {"mlp down", 4, 6144, 3072},
      {"shared gate_up", 4, 1536, 6144},
      {"shared down", 4, 6144, 768},
      {"qkv", 8, 1536, 6144},
      {"o_proj", 8, 6144, 1024},
      {"mlp gate_up", 8, 3072, 6144},
      {"mlp down", 8, 6144, 1536},
      {"shared gate_up", 8, 768, 6144},
      {"shared down", 8, 6144, 384},
  };
  const double l2 = env.l2_mb * 1048576.0;
  for (const Shape& sh : shapes) {
    for (int64_t m : {1, 32, 64, 8192}) {
      const std::string shape = std::string("tp") + std::to_string(sh.tp) + " " + sh.name + " " +
                                std::to_string(sh.n) + "x" + std::to_string(sh.k) + " m" +
                                std::to_string(m);
      if (!(want_own || want_lt) || !case_wanted("fp8 linear " + shape + " fp8")) continue;
      const int64_t n = sh.n, k = sh.k, kb = (k + 127) / 128, nb = (n + 127) / 128,
                    kb4 = (kb + 3) / 4 * 4;
      const bool decode = m <= 64;
      const double wbytes = double(n) * k;
      const int sets = decode ? std::clamp(int(std::ceil(4.0 * l2 / wbytes)), 2, 64) : 2;
      std::vector<LinearSet> in(static_cast<size_t>(sets));
      uint64_t seed = 100;
      for (LinearSet& s : in) {
        s.w = dev(size_t(n * k));
        fill_fp8(s.w->p, size_t(n * k), seed++);
        s.ws128 = dev(size_t(nb * kb4) * 4);
        fill_f32(s.ws128->p, size_t(nb * kb4), seed++, 0.5f / 448, 1.0f / 448);
        s.ws1 = dev(size_t(n * kb) * 4);
        fill_f32(s.ws1->p, size_t(n * kb), seed++, 0.5f / 448, 1.0f / 448);
        s.wrow = dev(size_t(n) * 4);
        fill_f32(s.wrow->p, size_t(n), seed++, 0.5f / 448, 1.0f / 448);
        s.x = dev(size_t(m * k));
        fill_fp8(s.x->p, size_t(m * k), seed++);
        s.xs = dev(size_t(m * kb) * 4);
        fill_f32(s.xs->p, size_t(m * kb), seed++, 0.5f / 448, 1.0f / 448);
        s.xs_lt = dev(size_t(m * kb) * 4);
        cuda::transpose_scales(s.xs->as<float>(), m, kb, s.xs_lt->as<float>(), nullptr);
        s.xrow = dev(size_t(m) * 4);
        fill_f32(s.xrow->p, size_t(m), seed++, 0.5f / 448, 1.0f / 448);
        s.y = dev(size_t(m * n) * 2);
        if (decode) {
          s.xb = dev(size_t(m * k) * 2);
          cuda_check(cudaMemsetAsync(s.xb->p, 0x3c, size_t(m * k) * 2, nullptr),
                     "bf16 rows");  // ~0.0116
        }
      }
      cuda_check(cudaDeviceSynchronize(), "bench linear inputs");
      // Floors: decode the bytes that must move; prefill the FLOPs at the measured FP8 rate.
      const double flops = 2.0 * double(m) * n * k;
      auto bytes_floor = [&](double scale_bytes, double x_elem) {
        return (wbytes + scale_bytes + double(m) * k * x_elem + double(m) * kb * 4 +
                double(m) * n * 2) /
               bw * 1e6;
      };
      auto emit = [&](const char* kernel, const std::string& mode, double us, double floor_us,
                      int runs) {
        Row r{kernel, shape, "fp8", mode, us, floor_us, decode ? "bytes" : "flops"};
        r.target_us = decode ? 1.3 * floor_us : floor_us / 0.6;
        r.target_note = decode ? "1.3 x bytes floor" : "60 % of the fp8 rate";
        r.runs = runs, r.input_sets = sets;
        on_row(r);
      };
      const int runs = decode ? iters : std::max(20, iters / 5);
      // Own kernels: both scale layouts, FP8 rows (as rms_norm / swiglu_oai hand them over) and,
      // at decode, BF16 rows (quantized first).
      if (row_wanted(kOwn)) {
        for (int br : {1, 128}) {
          // variant 0: FP8 rows; 1: BF16 rows (decode, 1 x 128); 2: two consumer warpgroups
          // (128 weight rows a CTA: half the token-tile reads from L2; m 32 and 64, 1 x 128).
          for (int variant = 0; variant < 3; ++variant) {
            const bool bf16_x = variant == 1;
            if (variant > 0 && (!decode || br == 128)) continue;
            if (variant == 2 && m < 32) continue;
            auto params = [&](int s) {
              ops::LinearParams p;
              const LinearSet& d = in[size_t(s)];
              p.x = bf16_x ? d.xb->p : d.x->p;
              p.x_dtype = bf16_x ? DType::BF16 : DType::FP8_E4M3;
              p.ldx = k;
              p.x_scale = bf16_x ? nullptr : d.xs->as<float>();
              p.w.data = d.w->p, p.w.dtype = DType::FP8_E4M3, p.w.rows = n, p.w.cols = k;
              p.w.scale = br == 1 ? d.ws1->as<float>() : d.ws128->as<float>();
              p.w.scale_block_rows = br, p.w.scale_block_cols = 128;
              p.y = d.y->p, p.y_dtype = DType::BF16, p.ldy = n, p.m = m;
              return p;
            };
            cuda::LinearTuning t;
            t.backend = 1;
            t.wgs = variant == 2 ? 2 : 0;
            cuda::set_linear_tuning(t);
            const cuda::fp8::Plan pl = cuda::linear_fp8_plan(m, n, k);
            auto fn = [&](int s, cudaStream_t t2) {
              if (!cuda::run_linear(params(s), t2))
                throw Error("bench: fp8 linear refused its own shape");
            };
            // "<scale layout>[ bf16 x| 2wg] | <plan>": what varies, then the plan it ran.
            const std::string mode = std::string(br == 1 ? "1x128" : "128x128") +
                                     (bf16_x         ? " bf16 x"
                                      : variant == 2 ? " 2wg"
                                                     : "") +
                                     " | w" + std::to_string(pl.wgs) + " bn" +
                                     std::to_string(pl.bn) + " s" + std::to_string(pl.splits) +
                                     " st" + std::to_string(pl.stages);
            const double scale_bytes = br == 1 ? double(n) * kb * 4 : double(nb) * kb * 4;
            const double floor_us =
                decode ? bytes_floor(scale_bytes, bf16_x ? 2.0 : 1.0) : flops / rate * 1e6;
            // The GPU idled while the host built the case: the first row of a decode case
            // would read high (harness warm_up).
            if (decode && br == 1 && variant == 0) warm_up(sets, fn, st, 20);
            emit(kOwn, mode, time_calls(runs, sets, fn, st), floor_us, runs);
            if (decode)
              emit(kOwn, mode + ", graph x16", time_calls(runs, sets, fn, st, kGraphBatch),
                   floor_us, runs);
            cuda::set_linear_tuning(cuda::LinearTuning{});
          }
        }
      }
      if (want_lt) {
        for (cuda::LtScaling sc : {cuda::LtScaling::kOuterVec, cuda::LtScaling::kBlock}) {
          auto gemm = [&](int s) {
            const LinearSet& d = in[size_t(s)];
            cuda::LtGemm g;
            g.x = d.x->p, g.ldx = k, g.w = d.w->p, g.y = d.y->p, g.y_dtype = DType::BF16, g.ldy = n;
            g.m = m, g.n = n, g.k = k, g.scaling = sc;
            g.x_scale = sc == cuda::LtScaling::kBlock ? d.xs_lt->as<float>() : d.xrow->as<float>();
            g.w_scale = sc == cuda::LtScaling::kBlock ? d.ws128->as<float>() : d.wrow->as<float>();
            return g;
          };
          const char* kernel = sc == cuda::LtScaling::kBlock ? kLtBlock : kLtRow;
          if (!row_wanted(kernel)) continue;
          std::string why;
          if (!cuda::cublaslt_fp8_gemm(gemm(0), st, &why)) {
            Row r{kernel, shape, "fp8", "refused: " + why, 0, 0, "-"};
            on_row(r);
            continue;
          }
          const double scale_bytes =
              sc == cuda::LtScaling::kBlock ? double(nb) * kb * 4 : double(n) * 4;
          const double floor_us = decode ? bytes_floor(scale_bytes, 1.0) : flops / rate * 1e6;
          auto fn = [&](int s, cudaStream_t t2) { cuda::cublaslt_fp8_gemm(gemm(s), t2); };
          emit(kernel, "eager", time_calls(runs, sets, fn, st), floor_us, runs);
          if (decode)
            emit(kernel, "graph x16", time_calls(runs, sets, fn, st, kGraphBatch), floor_us, runs);
        }
      }
    }
  }
  cuda_check(cudaStreamSynchronize(st), "bench linear end");
  cudaStreamDestroy(st);
}

}  // namespace sieve::kernels_bench
