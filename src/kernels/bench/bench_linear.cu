// `sieve bench kernels` rows of the FP8 GEMM ("fp8 linear ..."): ops::linear with FP8 weights at
// the per-rank shapes of MiniMax-M3 (TP4 and TP8: qkv, o_proj, the dense MLP's gate_up and down,
// the shared expert's gate_up and down) for m = 1, 32, 64 and 8192 tokens, next to cuBLASLt FP8
// GEMMs of the same shapes (per-row scales as torch._scaled_mm's rowwise; 1 x 128 / 128 x 128
// block scaling where cuBLASLt takes it), the FP8 matrix rate measured through cuBLASLt, and a
// read probe of each shape's weight bytes (what a lone kernel gets for them).
// Decode (m <= 64) rows are graphs of 16 calls (per call): the default plan and, side by side,
// the knobs' alternatives (no programmatic dependent launch, the split rule aiming at 1 or 3
// CTAs an SM, a shallower or the deepest ring, BF16 rows quantized inside the GEMM rather than
// by a kernel first), so that one run shows which is fastest per shape. Prefill (m = 8192) rows
// are eager: the path the op takes by default with each scale layout (cuBLASLt given
// WeightView::scale_lt), and the wgmma kernel it falls back to.
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
DevPtr scales(size_t n, uint64_t seed) {
  DevPtr d = dev(n * 4);
  fill_f32(d->p, n, seed, 0.5f / 448, 1.0f / 448);
  return d;
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
constexpr const char* kProbe = "read probe (fp8 linear's weight bytes)";

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

// One shape's inputs: an FP8 weight with both scale layouts and cuBLASLt's copies of them, FP8
// rows (token-major and k-block-major scales) and BF16 rows, per-row scales, the output.
struct LinearSet {
  DevPtr w, ws128, ws128_lt, ws1, ws1_lt, wrow, x, xs, xs_lt, xb, xrow, y;
};

const char* path_name(cuda::LinearPath p) {
  switch (p) {
    case cuda::LinearPath::kOwn:
      return "own";
    case cuda::LinearPath::kOwnFused:
      return "own, fused quant";
    case cuda::LinearPath::kLtBlock:
      return "cuBLASLt blk128";
    case cuda::LinearPath::kLtVec128:
      return "cuBLASLt vec128";
    case cuda::LinearPath::kMatmul:
      return "matmul";
    default:
      return "unsupported";
  }
}

// A variant of the op's rows: scale layout, BF16 rows or FP8, and the knobs it edits.
struct Variant {
  const char* label;
  int br;
  bool bf16_x;
  std::function<void(cuda::LinearTuning&)> edit;
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
  const bool want_own = row_wanted(kOwn), want_lt = row_wanted(kLtRow) || row_wanted(kLtBlock),
             want_probe = row_wanted(kProbe);
  // The rate row belongs to the "fp8 linear" cases (their prefill floors use it).
  const bool want_rate = row_wanted(kRate) && case_wanted("fp8 linear: fp8 matrix rate 8192^3 fp8");
  if (!want_own && !want_lt && !want_rate && !want_probe) return;
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
  // Decode: the default, then the alternatives of each knob (graph x16 each).
  const std::vector<Variant> decode_variants = {
      {"1x128", 1, false, nullptr},
      {"1x128, no pdl", 1, false, [](cuda::LinearTuning& t) { t.pdl = false; }},
      {"1x128, 1 cta/sm", 1, false, [](cuda::LinearTuning& t) { t.max_ctas_per_sm = 1; }},
      {"1x128, 3 ctas/sm", 1, false, [](cuda::LinearTuning& t) { t.max_ctas_per_sm = 3; }},
      {"1x128, 4 stages", 1, false, [](cuda::LinearTuning& t) { t.stages = 4; }},
      {"1x128, 8 stages", 1, false, [](cuda::LinearTuning& t) { t.stages = 8; }},
      {"128x128", 128, false, nullptr},
      {"1x128 bf16 x", 1, true, nullptr},
      {"1x128 bf16 x, fused quant", 1, true,
       [](cuda::LinearTuning& t) { t.fuse_quant_max_m = 64; }},
      {"1x128 bf16 x, no pdl", 1, true, [](cuda::LinearTuning& t) { t.pdl = false; }},
  };
  // Prefill: the default path with each layout (given cuBLASLt's scale copies), BF16 rows, and
  // the wgmma kernel alone.
  const std::vector<Variant> prefill_variants = {
      {"128x128", 128, false, nullptr},
      {"1x128", 1, false, nullptr},
      {"1x128 bf16 x", 1, true, nullptr},
      {"128x128 own kernel", 128, false, [](cuda::LinearTuning& t) { t.backend = 1; }},
  };
  const double l2 = env.l2_mb * 1048576.0;
  for (const Shape& sh : shapes) {
    for (int64_t m : {1, 32, 64, 8192}) {
      const std::string shape = std::string("tp") + std::to_string(sh.tp) + " " + sh.name + " " +
                                std::to_string(sh.n) + "x" + std::to_string(sh.k) + " m" +
                                std::to_string(m);
      if (!(want_own || want_lt || want_probe) || !case_wanted("fp8 linear " + shape + " fp8"))
        continue;
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
        s.ws128 = scales(size_t(nb * kb), seed++);
        s.ws128_lt = scales(size_t(nb * kb4), seed++);
        s.ws1 = scales(size_t(n * kb), seed++);
        s.ws1_lt = scales(size_t(n * kb), seed++);
        s.wrow = scales(size_t(n), seed++);
        s.x = dev(size_t(m * k));
        fill_fp8(s.x->p, size_t(m * k), seed++);
        s.xs = scales(size_t(m * kb), seed++);
        s.xs_lt = dev(size_t(m * kb) * 4);
        cuda::transpose_scales(s.xs->as<float>(), m, kb, s.xs_lt->as<float>(), nullptr);
        s.xrow = scales(size_t(m), seed++);
        s.y = dev(size_t(m * n) * 2);
        s.xb = dev(size_t(m * k) * 2);
        cuda_check(cudaMemsetAsync(s.xb->p, 0x3c, size_t(m * k) * 2, nullptr),
                   "bf16 rows");  // ~0.0116
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
      if (want_probe && m == 1) {
        // The weight bytes in 16 KB items (every shape's are a multiple of 16 KB).
        ReadProbe pr;
        const uint32_t item = 16384;
        std::vector<int32_t> ids(size_t(n * k / item));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
        for (int s = 0; s < sets; ++s) {
          pr.add(size_t(s), in[size_t(s)].w->p, item);
          pr.ids.push_back(upload(ids));
        }
        emit(kProbe, "graph x16", time_calls(runs, sets, pr.fn(true), st, kGraphBatch),
             bytes_floor(0, 0), runs);
      }
      if (want_own) {
        for (const Variant& v : decode ? decode_variants : prefill_variants) {
          auto params = [&](int s) {
            ops::LinearParams p;
            const LinearSet& d = in[size_t(s)];
            p.x = v.bf16_x ? d.xb->p : d.x->p;
            p.x_dtype = v.bf16_x ? DType::BF16 : DType::FP8_E4M3;
            p.ldx = k;
            p.x_scale = v.bf16_x ? nullptr : d.xs->as<float>();
            p.w.data = d.w->p, p.w.dtype = DType::FP8_E4M3, p.w.rows = n, p.w.cols = k;
            p.w.scale = v.br == 1 ? d.ws1->as<float>() : d.ws128->as<float>();
            p.w.scale_lt = v.br == 1 ? d.ws1_lt->as<float>() : d.ws128_lt->as<float>();
            p.w.scale_block_rows = v.br, p.w.scale_block_cols = 128;
            p.y = d.y->p, p.y_dtype = DType::BF16, p.ldy = n, p.m = m;
            return p;
          };
          cuda::Tuning tuned = cuda::tuning();
          if (v.edit) v.edit(tuned.linear);
          cuda::TuningScope scope(tuned);
          const cuda::LinearPath path = cuda::linear_path(params(0));
          std::string mode = std::string(v.label) + " | " + path_name(path);
          if (path == cuda::LinearPath::kOwn || path == cuda::LinearPath::kOwnFused) {
            const cuda::fp8::Plan pl = cuda::linear_fp8_plan(m, n, k);
            mode += " w" + std::to_string(pl.wgs) + " bn" + std::to_string(pl.bn) + " s" +
                    std::to_string(pl.splits) + " st" + std::to_string(pl.stages);
          }
          auto fn = [&](int s, cudaStream_t t2) {
            if (!cuda::run_linear(params(s), t2))
              throw Error("bench: fp8 linear refused its own shape");
          };
          const double scale_bytes = v.br == 1 ? double(n) * kb * 4 : double(nb) * kb * 4;
          const double floor_us =
              decode ? bytes_floor(scale_bytes, v.bf16_x ? 2.0 : 1.0) : flops / rate * 1e6;
          // The GPU idled while the host built the case: the first row of a decode case
          // would read high (harness warm_up).
          if (decode && &v == &decode_variants[0]) {
            warm_up(sets, fn, st, 20);
            emit(kOwn, mode, time_calls(runs, sets, fn, st), floor_us, runs);
          }
          if (decode)
            emit(kOwn, mode + ", graph x16", time_calls(runs, sets, fn, st, kGraphBatch), floor_us,
                 runs);
          else
            emit(kOwn, mode, time_calls(runs, sets, fn, st), floor_us, runs);
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
            g.w_scale =
                sc == cuda::LtScaling::kBlock ? d.ws128_lt->as<float>() : d.wrow->as<float>();
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
          if (decode)
            emit(kernel, "graph x16", time_calls(runs, sets, fn, st, kGraphBatch), floor_us, runs);
          else
            emit(kernel, "eager", time_calls(runs, sets, fn, st), floor_us, runs);
        }
      }
    }
  }
  cuda_check(cudaStreamSynchronize(st), "bench linear end");
  cudaStreamDestroy(st);
}

}  // namespace sieve::kernels_bench
