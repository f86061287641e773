// CUDA FP8 MoE against the CPU twin (label gpu: skipped without a CUDA device): the 1 x 128
// quantizer bit for bit, moe_experts with FP8 weights on both kernel families (stream kernels for
// decode batches in every token-row width, with and without k splits and programmatic dependent
// launch; tile kernels for prefill batches), and moe_route with the fused router GEMM.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/tuning.h"
#include "moe_fp8_emulation.h"
#include "moe_test_util.h"

namespace sieve {
namespace {

using namespace sieve::test;

ops::Stream gpu_stream() {
  ops::Stream s;
  s.device = kGpu;
  return s;
}

bool same_fp8(uint8_t a, uint8_t b) {
  return a == b || (std::isnan(fp8e4m3_to_f32(a)) && std::isnan(fp8e4m3_to_f32(b)));
}

// ---------------------------------------------------------------------------------------------
// The quantizer

TEST(CudaFp8Quantizer, BitExactWithCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  for (DType t : {DType::F32, DType::BF16}) {
    for (int64_t cols : {16, 128, 144, 384, 6144}) {
      const int64_t rows = 37, ld = cols + 16, groups = (cols + 127) / 128;
      std::vector<float> xf(size_t(rows * ld));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < ld; ++k) xf[size_t(r * ld + k)] = rng.normal(1.0f) * std::ldexp(1.0f, int(r % 9) - 4);
      for (int64_t k = 0; k < std::min<int64_t>(cols, 128); ++k) xf[size_t(2 * ld + k)] = 0.0f;  // scale 1
      xf[size_t(3 * ld + 5)] = kNaN;
      xf[size_t(4 * ld + 1)] = 3e38f;
      xf[size_t(5 * ld + 0)] = 1e-42f;  // a denormal group maximum
      for (int64_t k = 1; k < std::min<int64_t>(cols, 128); ++k) xf[size_t(5 * ld + k)] = 0.0f;
      TypedBuffer x = TypedBuffer::from(t, xf);
      // The CPU quantizes the values as the GPU reads them (bf16 rounded first).
      std::vector<float> xr(xf.size());
      for (size_t i = 0; i < xf.size(); ++i) xr[i] = x.get(i);
      std::vector<uint8_t> q(size_t(rows * cols));
      std::vector<float> sc(size_t(rows * groups));
      for (int64_t r = 0; r < rows; ++r)
        cpu::quantize_row_fp8(&xr[size_t(r * ld)], cols, &q[size_t(r * cols)], &sc[size_t(r * groups)]);
      Dev dx = Dev::of(x), dq(q.size()), ds(sc.size() * 4);
      dq.poison(0xAB);
      ds.poison(0xFF);
      cuda::quantize_fp8_1x128(dx.p(), t, rows, cols, ld, dq.as<uint8_t>(), ds.as<float>(), nullptr);
      const std::vector<uint8_t> gq = dq.bytes(q.size());
      const std::vector<float> gs = ds.get<float>(sc.size());
      int bad = 0;
      for (size_t i = 0; i < sc.size() && bad < 5; ++i)
        if (!(gs[i] == sc[i])) ADD_FAILURE() << name(t) << " cols " << cols << " scale " << i << ": gpu " << gs[i] << " cpu " << sc[i], ++bad;
      for (size_t i = 0; i < q.size() && bad < 5; ++i)
        if (!same_fp8(gq[i], q[i]))
          ADD_FAILURE() << name(t) << " cols " << cols << " q[" << i / size_t(cols) << "," << i % size_t(cols) << "]: gpu "
                        << int(gq[i]) << " cpu " << int(q[i]),
              ++bad;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_experts, FP8 weights

struct GpuRun {
  cuda::MoeTuning knobs;  // fp8_* and chunk_tokens
  std::string what;
  // >= 0: this run's output and quantized SwiGLU rows must be the same bytes as those of run
  // `same_as` of the list (a variant that promises the same arithmetic).
  int same_as = -1;
  // The weights' scales tiled (MoeExpertsParams::scale_tiled; (1, 128) blocks only: the run is
  // left out for other cases).
  bool tiled = false;
};

// `runs`, then each again with tiled weight scales, the same bytes as its row-major twin.
std::vector<GpuRun> with_tiled(const std::vector<GpuRun>& runs) {
  std::vector<GpuRun> r = runs;
  for (size_t i = 0; i < runs.size(); ++i) {
    GpuRun g = runs[i];
    g.tiled = true;
    g.same_as = int(i);
    g.what += ", tiled scales";
    r.push_back(g);
  }
  return r;
}

cuda::Tuning with_moe(const cuda::MoeTuning& m) {
  cuda::Tuning t = cuda::tuning();
  t.moe = m;
  return t;
}

// A case's operands on the device; run() launches moe_experts on them (out back to out0 and the
// probe buffers poisoned first) and checks the result.
struct DevMoe {
  const MoeCaseData& c;
  std::vector<Dev> gu, dn, gus, dns, gus_tiled, dns_tiled;
  Dev x, xs, ids, w, gup{16}, dnp{16}, gusp{16}, dnsp{16}, gusp_tiled{16}, dnsp_tiled{16}, aq, as, out;
  explicit DevMoe(const MoeCaseData& cd)
      : c(cd),
        x(Dev::of(cd.x)),
        xs(Dev::of(cd.x_scale)),
        ids(Dev::of(cd.ids)),
        w(Dev::of(cd.weights)),
        aq(size_t(cd.s.T * cd.s.K * cd.s.I)),
        as(size_t(cd.s.T * cd.s.K * ((cd.s.I + 127) / 128)) * 4),
        out(Dev::of(cd.out0)) {
    gup = upload_each(c.gu, gu), dnp = upload_each(c.dn, dn);
    gusp = upload_each(c.gu_scale, gus), dnsp = upload_each(c.dn_scale, dns);
    if (!c.gu_scale_tiled.empty())
      gusp_tiled = upload_each(c.gu_scale_tiled, gus_tiled), dnsp_tiled = upload_each(c.dn_scale_tiled, dns_tiled);
  }
  // Each of an expert list's host arrays on the device (kept in `arrays`), and the device array of
  // their addresses (what MoeExpertsParams points to).
  template <class H>
  static Dev upload_each(const std::vector<H>& host, std::vector<Dev>& arrays) {
    std::vector<const void*> ptrs;
    for (const H& h : host) {
      arrays.push_back(Dev::of(h));
      ptrs.push_back(arrays.back().p());
    }
    return Dev::of(ptrs);
  }
  // tiled: the tiled copies of the scales (FP8 with (1, 128) blocks).
  ops::MoeExpertsParams params(bool tiled = false) const {
    ops::MoeExpertsParams p = c.params(tiled);
    p.x = x.p();
    p.x_scale = c.s.fp8_x ? xs.as<float>() : nullptr;
    p.ids = ids.as<int32_t>();
    p.weights = w.as<float>();
    p.w_gate_up = gup.as<const void*>();
    p.w_down = dnp.as<const void*>();
    p.w_gate_up_scale = tiled ? gusp_tiled.as<const float*>() : gusp.as<const float*>();
    p.w_down_scale = tiled ? dnsp_tiled.as<const float*>() : dnsp.as<const float*>();
    p.out = out.p();
    return p;
  }
  cuda::MoeFp8Probe probe() const {
    cuda::MoeFp8Probe pr;
    pr.act_q = aq.as<uint8_t>();
    pr.act_scale = as.as<float>();
    return pr;
  }
  // In place: a captured graph holds these addresses.
  void reset() {
    ASSERT_EQ(cudaMemcpy(out.p(), c.out0.bytes.data(), c.out0.bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    aq.poison(0x7f);
    as.poison(0xFF);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // The output after a run, checked; the output bytes in *bytes when set, followed by the
  // quantized SwiGLU rows when `with_act`.
  void check(std::vector<uint8_t>* bytes = nullptr, bool with_act = false) const {
    const int64_t T = c.s.T, K = c.s.K, I = c.s.I, gi = (I + 127) / 128;
    TypedBuffer got(c.s.out_dtype(), size_t(T * c.s.H));
    got.bytes = out.bytes(got.bytes.size());
    const std::vector<uint8_t> q = aq.bytes(size_t(T * K * I));
    const std::vector<float> sc = as.get<float>(size_t(T * K * gi));
    MoeFp8CheckStats st;
    EXPECT_EQ(check_moe_fp8(c, got, q.data(), sc.data(), &st), "");
    if (bytes) {
      *bytes = got.bytes;
      if (with_act) {
        bytes->insert(bytes->end(), q.begin(), q.end());
        const uint8_t* sb = reinterpret_cast<const uint8_t*>(sc.data());
        bytes->insert(bytes->end(), sb, sb + sc.size() * 4);
      }
    }
  }
  // One call on `stream` under `knobs`, checked.
  void run(const cuda::MoeTuning& knobs, cudaStream_t stream = nullptr, std::vector<uint8_t>* bytes = nullptr,
           bool with_act = false, bool tiled = false) {
    reset();
    const cuda::MoeFp8Probe pr = probe();
    {
      cuda::TuningScope scope(with_moe(knobs));
      ASSERT_TRUE(cuda::run_moe_experts_fp8(params(tiled), stream, &pr));
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    check(bytes, with_act);
  }
};

// One case on the GPU under each knob setting, checked by moe_fp8_emulation.h's two-stage check
// against exact arithmetic: the quantized SwiGLU rows the kernels wrote (read back by pair through
// MoeFp8Probe) each one of the two fp8 neighbours of the exact value, and the output tight against
// those rows times the exact down weights. (Against the CPU twin's output alone no tight bound
// holds: Hopper's fp8 tensor-core sums are truncated to about 13 fraction bits, which moves some
// SwiGLU values to the other side of an fp8 rounding boundary and with them a token's whole row;
// the emulation test reproduces the GPU's counts of such elements.) The default run goes through
// ops::moe_experts as well and must give the same bits.
void gpu_fp8_case(const MoeShape& shape, const std::vector<GpuRun>& runs, uint64_t seed) {
  SCOPED_TRACE(shape.describe());
  MoeCaseData c(shape, seed);
  DevMoe d(c);
  std::vector<std::vector<uint8_t>> outs;  // each run's output and quantized SwiGLU rows
  for (const GpuRun& run : runs) {
    SCOPED_TRACE(run.what);
    std::vector<uint8_t> got;
    if (run.tiled && c.gu_scale_tiled.empty()) {  // tiled scales need (1, 128) blocks
      outs.emplace_back();
      continue;
    }
    d.run(run.knobs, nullptr, &got, true, run.tiled);
    outs.push_back(got);
    if (run.same_as >= 0) {
      const std::vector<uint8_t>& ref = outs[size_t(run.same_as)];
      size_t first = 0;
      while (first < got.size() && first < ref.size() && got[first] == ref[first]) ++first;
      EXPECT_TRUE(got == ref) << "not the same bytes as \"" << runs[size_t(run.same_as)].what << "\" (first difference at byte "
                              << first << " of " << got.size() << ")";
    }
    got.resize(c.out0.bytes.size());  // the output alone
    if (run.what == "default") {
      Dev dout2 = Dev::of(c.out0);
      ops::MoeExpertsParams p = d.params();
      p.out = dout2.p();
      ops::moe_experts(p, gpu_stream());
      EXPECT_TRUE(dout2.bytes(got.size()) == got) << "ops::moe_experts differs from the same kernels";
    }
  }
}

// Stage depths and stream widths of the stream kernels: stages of 1 to 4 k blocks at every width
// (partial last stages; 4 at 64 token rows: one stage in the ring), and k splits of 2 to 5.
std::vector<GpuRun> stage_runs() {
  std::vector<GpuRun> r;
  for (int nt : {8, 16, 32, 64})
    for (int kp : {1, 2, 3, 4}) {
      GpuRun g;
      g.knobs.fp8_path = 1;
      g.knobs.fp8_stream_rows = nt;
      g.knobs.fp8_stream_kblocks = kp;
      g.what = "stream " + std::to_string(nt) + ", stages of " + std::to_string(kp) + " k blocks";
      r.push_back(g);
    }
  for (int ks : {2, 3, 5}) {
    GpuRun g;
    g.knobs.fp8_path = 1;
    g.knobs.fp8_stream_rows = 16;
    g.knobs.fp8_ksplit_gate_up = ks;
    g.knobs.fp8_ksplit_down = ks > 2 ? ks - 1 : ks;
    g.what = "stream 16, k splits " + std::to_string(ks);
    r.push_back(g);
  }
  return r;
}

std::vector<GpuRun> stream_runs() {
  std::vector<GpuRun> r;
  for (int nt : {8, 16, 32, 64}) {
    GpuRun g;
    g.knobs.fp8_path = 1;
    g.knobs.fp8_stream_rows = nt;
    g.what = "stream " + std::to_string(nt);
    r.push_back(g);
  }
  GpuRun g;
  g.knobs.fp8_path = 1;
  g.knobs.fp8_stream_rows = 8;
  g.knobs.fp8_ksplit_gate_up = 3;
  g.knobs.fp8_ksplit_down = 2;
  g.what = "stream 8, k splits 3 / 2";
  r.push_back(g);
  g.knobs.fp8_pdl = false;
  g.what = "stream 8, k splits 3 / 2, no pdl";
  r.push_back(g);
  // Other stage depths: 1 k block a stage at 8 token rows, 3 (a partial last stage) at 32.
  g = GpuRun{};
  g.knobs.fp8_path = 1;
  g.knobs.fp8_stream_rows = 8;
  g.knobs.fp8_stream_kblocks = 1;
  g.what = "stream 8, stages of 1 k block";
  r.push_back(g);
  g.knobs.fp8_stream_rows = 32;
  g.knobs.fp8_stream_kblocks = 3;
  g.what = "stream 32, stages of 3 k blocks";
  r.push_back(g);
  // The sort as before (plain launch, one thread's prefix, every map written every call), and
  // k splits picked by the kernels for the busiest CTA.
  g = GpuRun{};
  g.knobs.fp8_path = 1;
  g.knobs.fp8_stream_rows = 8;
  g.knobs.fp8_sort_pdl = false;
  g.knobs.fp8_sort_scan = false;
  g.knobs.fp8_map_cache = false;
  g.what = "stream 8, plain sort, serial prefix, no map cache";
  r.push_back(g);
  for (int nt : {8, 16}) {
    g = GpuRun{};
    g.knobs.fp8_path = 1;
    g.knobs.fp8_stream_rows = nt;
    g.knobs.fp8_ksplit_waves = 16;
    g.what = "stream " + std::to_string(nt) + ", k splits by waves";
    r.push_back(g);
  }
  g = GpuRun{};
  g.what = "default";
  r.push_back(g);
  return r;
}

// The tile kernels under each scale layout and map source (MoeTuning::fp8_tile_*), whole and in
// chunks; then the first again with one weight multiplier a column, the first two with the
// epilogue's fragments stored directly and in the static tile order (the same bytes: same_as, an
// index into this list).
std::vector<GpuRun> tile_runs() {
  std::vector<GpuRun> r;
  struct Layout {
    bool kmajor, bulk, param_maps;
    const char* what;
  };
  for (const Layout& l : {Layout{true, true, true, "tiles"}, Layout{true, true, false, "tiles, device maps"},
                          Layout{true, false, true, "tiles, k-major scales by cp.async"},
                          Layout{false, false, false, "tiles, row-major scales"}}) {
    GpuRun g;
    g.knobs.fp8_path = 2;
    g.knobs.fp8_tile_staged_out = 1;  // staged at every size (where bulk scales allow it)
    g.knobs.fp8_tile_kmajor_scales = l.kmajor;
    g.knobs.fp8_tile_bulk_scales = l.bulk;
    g.knobs.fp8_tile_param_maps = l.param_maps;
    g.what = l.what;
    r.push_back(g);
    g.knobs.chunk_tokens = 7;
    g.what = std::string(l.what) + ", chunks of 7 tokens";
    r.push_back(g);
  }
  // Weight blocks of 128 rows or more take one multiplier a run of rows in the promotion
  // (MoeTuning::fp8_tile_block_scales); one a column gives the same bytes (other blocks: the
  // knob changes nothing).
  GpuRun g = r[0];
  g.knobs.fp8_tile_block_scales = false;
  g.same_as = 0;
  g.what += ", a weight multiplier a column";
  r.push_back(g);
  // The epilogue's rows stored straight from the fragments (MoeTuning::fp8_tile_staged_out off),
  // whole and in chunks: the same bytes as staged through shared memory.
  for (int i : {0, 1}) {
    GpuRun d = r[size_t(i)];
    d.knobs.fp8_tile_staged_out = 0;
    d.same_as = i;
    d.what += ", fragments stored directly";
    r.push_back(d);
  }
  // The static tile order (MoeTuning::fp8_tile_dynamic off) under the bulk, cp.async and
  // row-major scales, whole and in chunks, and with the fragments stored directly: the same bytes
  // as the dynamic order (the default; in chunks each launch claims from zero: the last CTA of
  // each returns its counters to zero).
  for (int i : {0, 1, 3, 4, 6}) {
    GpuRun sr = r[size_t(i)];
    sr.knobs.fp8_tile_dynamic = false;
    sr.same_as = i;
    sr.what += ", static tile order";
    r.push_back(sr);
  }
  GpuRun sd = r[0];
  sd.knobs.fp8_tile_dynamic = false;
  sd.knobs.fp8_tile_staged_out = 0;
  sd.same_as = 0;
  sd.what += ", static tile order, fragments stored directly";
  r.push_back(sd);
  return r;
}

std::vector<GpuRun> all_runs() {
  std::vector<GpuRun> r = stream_runs(), t = tile_runs();
  for (GpuRun& g : t)
    if (g.same_as >= 0) g.same_as += int(r.size());
  r.insert(r.end(), t.begin(), t.end());
  return r;
}

TEST(CudaMoeExpertsFp8, BlockShapesAndActivations) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2000;
  for (int br : {1, 128}) {
    for (DType act : {DType::F32, DType::BF16}) {
      MoeShape s;
      s.T = 9, s.H = 384, s.I = 256, s.E = 8, s.K = 2, s.br = br, s.act = act, s.pow2_scales = br == 1;
      gpu_fp8_case(s, all_runs(), seed++);
    }
  }
  MoeShape f;
  f.T = 5, f.H = 256, f.I = 128, f.E = 8, f.K = 4, f.fp8_x = true, f.act = DType::BF16;
  gpu_fp8_case(f, all_runs(), seed++);
  // A bf16 out beside fp32 (or FP8) x: the model's MoE layers on CUDA (out_bf16; the combine's
  // 16-byte bf16 stores).
  MoeShape o;
  o.T = 9, o.H = 384, o.I = 256, o.E = 8, o.K = 2, o.act = DType::F32, o.out_bf16 = true;
  gpu_fp8_case(o, all_runs(), seed++);
  o.fp8_x = true;
  gpu_fp8_case(o, all_runs(), seed++);
}

// Partial groups and k blocks (inter 144, hidden 400), units past the last 128-unit group, a
// scale block height that is neither 1 nor 128.
TEST(CudaMoeExpertsFp8, PartialBlocks) {
  SKIP_WITHOUT_GPU();
  MoeShape s;
  s.T = 11, s.H = 400, s.I = 144, s.E = 6, s.K = 3, s.br = 48, s.skipped = 3;
  gpu_fp8_case(s, all_runs(), 2100);
}

// Tiled weight scales on every path (stream widths, stage depths, k splits, tiles whole and in
// chunks), the same bytes as row-major: row blocks with absent rows (inter 144 and 400, hidden 400
// and 656: inter % 128, hidden % 256 != 0; their slots hold zeros), empty experts, skipped ids, 1
// to 256 tokens.
TEST(CudaMoeExpertsFp8, TiledScales) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2150;
  MoeShape s;
  s.H = 400, s.I = 144, s.E = 6, s.K = 3, s.skipped = 3, s.empty_every = 3;
  for (int64_t T : {1, 11, 256}) {
    s.T = T;
    gpu_fp8_case(s, with_tiled(all_runs()), seed++);
  }
  MoeShape b;
  b.T = 40, b.H = 656, b.I = 400, b.E = 9, b.K = 4, b.empty_every = 4, b.act = DType::BF16, b.fp8_x = true;
  gpu_fp8_case(b, with_tiled(all_runs()), seed++);
}

// Empty experts, every token to one expert (several row blocks and tiles of one expert), a hot
// expert, odd token counts, skipped ids, top-10.
TEST(CudaMoeExpertsFp8, Routings) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2200;
  MoeShape s;
  s.H = 256, s.I = 128, s.E = 16, s.K = 4;
  s.T = 1;
  gpu_fp8_case(s, all_runs(), seed++);
  s.T = 33, s.empty_every = 2, s.skipped = 2;
  gpu_fp8_case(s, all_runs(), seed++);
  MoeShape o = s;
  o.T = 301, o.K = 1, o.only = 5, o.empty_every = 0, o.skipped = 0;  // 301 rows: 3 tiles, 5+ stream blocks
  gpu_fp8_case(o, all_runs(), seed++);
  MoeShape h = s;
  h.T = 150, h.hot = 2, h.empty_every = 0;
  gpu_fp8_case(h, all_runs(), seed++);
  MoeShape w = s;  // top-10: more slots than the combine orders in registers (8)
  w.T = 21, w.K = 10, w.empty_every = 0, w.skipped = 3;
  gpu_fp8_case(w, all_runs(), seed++);
}

// The expert shapes of one TP4 and one TP8 rank of MiniMax-M3 (hidden 6144, 768 / 384 units,
// top-4) at a decode size, and the bundled model's (hidden 256, 128 units, 128 experts, top-8).
TEST(CudaMoeExpertsFp8, ModelShapes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2300;
  for (int64_t I : {768, 384}) {
    MoeShape s;  // 8 experts: the kernels see the same expert shapes, the test builds fewer weights
    s.H = 6144, s.I = I, s.E = 8, s.K = 4, s.br = 1, s.pow2_scales = true;
    s.T = 3;
    std::vector<GpuRun> runs = stream_runs();
    runs.resize(2);
    runs.push_back(GpuRun{});
    gpu_fp8_case(s, with_tiled(runs), seed++);
  }
  MoeShape b;
  b.T = 40, b.H = 256, b.I = 128, b.E = 128, b.K = 8, b.br = 128;
  gpu_fp8_case(b, all_runs(), seed++);
}

// The stream kernels' stage depths and k splits (stage_runs) at 1 to 256 tokens: units of 1 to 9
// k blocks (hidden 1040 and 656, inter 272 and 400: partial k blocks), several token blocks an
// expert, empty experts and skipped ids, and one TP8 rank's expert shape.
TEST(CudaMoeExpertsFp8, StreamStages) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2600;
  const std::vector<GpuRun> runs = with_tiled(stage_runs());  // tiled: (1, 128) shapes only
  MoeShape a;
  a.T = 1, a.H = 1040, a.I = 272, a.E = 8, a.K = 4;
  gpu_fp8_case(a, runs, seed++);
  MoeShape b;
  b.T = 33, b.H = 656, b.I = 400, b.E = 16, b.K = 4, b.empty_every = 2, b.skipped = 2, b.act = DType::BF16;
  gpu_fp8_case(b, runs, seed++);
  MoeShape c;
  c.T = 256, c.H = 384, c.I = 144, c.E = 8, c.K = 2, c.br = 128;
  gpu_fp8_case(c, runs, seed++);
  MoeShape m;
  m.T = 5, m.H = 6144, m.I = 384, m.E = 8, m.K = 4, m.br = 1, m.pow2_scales = true;
  gpu_fp8_case(m, runs, seed++);
}

// Prefill batches that the default rule sends to the tile kernels (pairs > 48 x experts): odd
// token counts up to 8191, empty experts, an expert with one row, a hot expert (tiles of one
// expert across many row blocks), skipped ids, partial k blocks and units, and the same batch in
// chunks (the chunk loop reuses the transposed weight scales and the parameter maps).
TEST(CudaMoeExpertsFp8, PrefillBatches) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2400;
  std::vector<GpuRun> base = tile_runs();
  base.push_back(GpuRun{});  // "default": the rule, and ops::moe_experts bit for bit
  const std::vector<GpuRun> runs = with_tiled(base);  // tiled: (1, 128) shapes only
  MoeShape a;
  a.T = 1031, a.H = 512, a.I = 256, a.E = 16, a.K = 4, a.empty_every = 5, a.lone = 3, a.skipped = 1;
  gpu_fp8_case(a, runs, seed++);
  MoeShape b;
  b.T = 769, b.H = 400, b.I = 144, b.E = 12, b.K = 3, b.br = 128, b.hot = 7, b.lone = 2, b.act = DType::BF16;
  gpu_fp8_case(b, runs, seed++);
  MoeShape c;
  c.T = 8191, c.H = 256, c.I = 128, c.E = 32, c.K = 4, c.empty_every = 9, c.lone = 4, c.pow2_scales = true;
  // (and in the static order: many tiles a CTA either way)
  GpuRun fixed = base.front();
  fixed.knobs.fp8_tile_dynamic = false;
  fixed.same_as = 0;
  fixed.what += ", static tile order";
  gpu_fp8_case(c, with_tiled({base.front(), fixed, base.back()}), seed++);
  MoeShape f;
  f.T = 517, f.H = 256, f.I = 256, f.E = 8, f.K = 2, f.fp8_x = true, f.act = DType::BF16, f.lone = 6;
  gpu_fp8_case(f, runs, seed++);
}

// The decode path's fixed costs (MoeTuning::fp8_sort_pdl, fp8_sort_scan, fp8_map_cache,
// fp8_ksplit_waves) on and off, at 1, 3, 32, 33 and 256 tokens over 128 experts (the model's
// count) and over 1100 (several experts a thread in the sort's prefix).
std::vector<GpuRun> fixed_cost_runs() {
  std::vector<GpuRun> r;
  GpuRun on;
  on.knobs.fp8_path = 1;
  on.knobs.fp8_ksplit_waves = 16;
  on.what = "new sort, map cache, k splits by waves";
  r.push_back(on);
  r.push_back(on);  // the cache's maps again
  GpuRun off;
  off.knobs.fp8_path = 1;
  off.knobs.fp8_sort_pdl = off.knobs.fp8_sort_scan = off.knobs.fp8_map_cache = false;
  off.what = "old sort, maps every call";
  r.push_back(off);
  GpuRun mixed = off;
  mixed.knobs.fp8_sort_pdl = true;
  mixed.knobs.fp8_map_cache = true;
  mixed.what = "pdl sort, serial prefix, map cache";
  r.push_back(mixed);
  r.push_back(GpuRun{});
  r.back().what = "default";
  return r;
}

TEST(CudaMoeExpertsFp8, DecodeFixedCosts) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2500;
  for (int64_t T : {1, 3, 32, 33, 256}) {
    MoeShape s;
    s.T = T, s.H = 384, s.I = 256, s.E = 128, s.K = 4, s.br = 128, s.skipped = T == 33 ? 1 : 0;
    gpu_fp8_case(s, fixed_cost_runs(), seed++);
  }
  MoeShape b;
  b.T = 40, b.H = 256, b.I = 128, b.E = 1100, b.K = 4, b.act = DType::BF16;
  gpu_fp8_case(b, fixed_cost_runs(), seed++);
}

// The map cache across weight sets: two sets of the same shapes used in turn (each its own
// entry), a set whose pointer arrays are rewritten in place to point at the other set's experts
// (the sort must see the moved experts and write their maps again), and a set made and freed
// between calls (its arrays' addresses may come back with other experts).
TEST(CudaMoeExpertsFp8, MapCacheFollowsTheWeights) {
  SKIP_WITHOUT_GPU();
  MoeShape s;
  s.T = 33, s.H = 384, s.I = 256, s.E = 16, s.K = 4, s.br = 128;
  MoeCaseData c1(s, 2600), c2(s, 2601);
  DevMoe d1(c1), d2(c2);
  cuda::MoeTuning knobs;
  knobs.fp8_path = 1;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    d1.run(knobs);
    d2.run(knobs);
  }
  {
    // d2's operands with d1's pointer arrays, now holding d2's experts.
    SCOPED_TRACE("pointer arrays rewritten in place");
    const size_t n = size_t(s.E) * sizeof(void*);
    ASSERT_EQ(cudaMemcpy(d1.gup.p(), d2.gup.p(), n, cudaMemcpyDeviceToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d1.dnp.p(), d2.dnp.p(), n, cudaMemcpyDeviceToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d1.gusp.p(), d2.gusp.p(), n, cudaMemcpyDeviceToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d1.dnsp.p(), d2.dnsp.p(), n, cudaMemcpyDeviceToDevice), cudaSuccess);
    std::swap(d1.gup, d2.gup);
    std::swap(d1.dnp, d2.dnp);
    std::swap(d1.gusp, d2.gusp);
    std::swap(d1.dnsp, d2.dnsp);
    d2.run(knobs);
  }
  for (uint64_t seed : {2602, 2603, 2604}) {
    SCOPED_TRACE("a fresh weight set, seed " + std::to_string(seed));
    MoeCaseData c(s, seed);
    DevMoe d(c);
    d.run(knobs);
    d.run(knobs);
  }
}

// Graph capture and replay: a weight set the cache knows (eager call first) and one it has not
// seen (the captured call writes the maps in its scratch), each replayed twice against the eager
// result, bit for bit, and checked.
TEST(CudaMoeExpertsFp8, GraphReplay) {
  SKIP_WITHOUT_GPU();
  MoeShape s;
  s.T = 32, s.H = 384, s.I = 256, s.E = 128, s.K = 4, s.br = 128;
  cudaStream_t st;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  for (int waves : {0, 16}) {
    for (bool seen : {true, false}) {
      SCOPED_TRACE(std::string(seen ? "cached weight set" : "weight set first seen in the capture") +
                   (waves ? ", k splits by waves" : ""));
      MoeCaseData c(s, 2700 + (seen ? 0 : 1) + 2 * waves);
      DevMoe d(c);
      cuda::MoeTuning knobs;
      knobs.fp8_ksplit_waves = waves;
      std::vector<uint8_t> eager;
      if (seen) {
        d.run(knobs, st, &eager);
      } else {
        // Sizes the scratch outside the capture with another weight set of the same shapes.
        MoeCaseData other(s, 2800 + waves);
        DevMoe o(other);
        o.run(knobs, st);
      }
      cudaGraph_t g;
      {
        cuda::TuningScope scope(with_moe(knobs));
        const cuda::MoeFp8Probe pr = d.probe();
        ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        const bool ok = cuda::run_moe_experts_fp8(d.params(), st, &pr);
        ASSERT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
        ASSERT_TRUE(ok);
      }
      cudaGraphExec_t e;
      ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
      std::vector<std::vector<uint8_t>> replays(2);
      for (int replay = 0; replay < 2; ++replay) {
        SCOPED_TRACE("replay " + std::to_string(replay));
        d.reset();
        ASSERT_EQ(cudaGraphLaunch(e, st), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
        d.check(&replays[size_t(replay)]);
      }
      if (!seen) d.run(knobs, st, &eager);  // now through the cache
      for (const std::vector<uint8_t>& r : replays) EXPECT_TRUE(r == eager) << "a replay differs from the eager call";
      cudaGraphExecDestroy(e);
      cudaGraphDestroy(g);
    }
  }
  cudaStreamDestroy(st);
}

TEST(CudaMoeExpertsFp8, UnsupportedShapesAreRefused) {
  SKIP_WITHOUT_GPU();
  MoeShape s;
  s.bc = 32;  // MXFP8 blocks: the CUDA kernels take (r, 128)
  MoeCaseData c(s, 1);
  std::vector<const void*> none(size_t(s.E), nullptr);
  std::vector<const float*> nones(size_t(s.E), nullptr);
  Dev dx = Dev::of(c.x), dout = Dev::of(c.out0), dids = Dev::of(c.ids), dw = Dev::of(c.weights);
  Dev dp = Dev::of(none), dps = Dev::of(nones);
  ops::MoeExpertsParams p = c.params();
  p.x = dx.p();
  p.out = dout.p();
  p.ids = dids.as<int32_t>();
  p.weights = dw.as<float>();
  p.w_gate_up = p.w_down = dp.as<const void*>();
  p.w_gate_up_scale = p.w_down_scale = dps.as<const float*>();
  EXPECT_THROW(ops::moe_experts(p, gpu_stream()), Error);
  p.scale_block_rows = 128, p.scale_block_cols = 128, p.scale_tiled = true;  // tiled: (1, 128) only
  EXPECT_THROW(ops::moe_experts(p, gpu_stream()), Error);
}

// ---------------------------------------------------------------------------------------------
// moe_route with the fused router GEMM

// ids: the CPU's, except that the GPU may pick another expert whose biased score is within 1e-5
// of the CPU's pick at that rank (the logits' fp32 sums run in another order); with `ties`
// (experts whose router rows are identical) exactly the CPU's. Weights within 1e-4 relative.
// id_offset: ids written less it (expert parallelism), on both sides. splitk_max:
// MoeTuning::route_splitk_max_tokens (F32 x), splitk_warps its route_splitk_warps. with_bias
// false: no correction bias.
void gpu_fused_route_case(int64_t T, int64_t H, int E, int K, DType xt, bool ties, int64_t fused_max, uint64_t seed,
                          int id_offset = 0, int64_t splitk_max = 0, bool with_bias = true, int splitk_warps = 8) {
  SCOPED_TRACE("split-K (" + std::to_string(splitk_warps) + " warps) up to " + std::to_string(splitk_max) + (with_bias ? " bias" : " no bias") + " id_offset " +
               std::to_string(id_offset) + " " + "T " + std::to_string(T) + " H " + std::to_string(H) + " E " + std::to_string(E) + " K " +
               std::to_string(K) + " x " + name(xt) + (ties ? " ties" : "") + " fused up to " + std::to_string(fused_max));
  Rng rng(seed);
  const int64_t ldx = H + 4;
  TypedBuffer x = TypedBuffer::from(xt, random_vector(size_t(T * ldx), rng, -1, 1));
  std::vector<float> gate = random_vector(size_t(E) * size_t(H), rng, -0.05f, 0.05f);
  std::vector<float> bias = random_vector(size_t(E), rng, -0.02f, 0.02f);
  if (ties) {
    // Experts come in identical pairs (e, e + E / 2) with identical biases: the lower id first.
    for (int e = E / 2; e < E; ++e) {
      for (int64_t k = 0; k < H; ++k) gate[size_t(e) * size_t(H) + size_t(k)] = gate[size_t(e - E / 2) * size_t(H) + size_t(k)];
      bias[size_t(e)] = bias[size_t(e - E / 2)];
    }
  }
  std::vector<int32_t> ids(size_t(T * K), -7);
  std::vector<float> w(size_t(T * K), kNaN);
  ops::MoeRouteParams p;
  p.x = x.data(), p.x_dtype = xt, p.hidden = H, p.ldx = ldx, p.gate = gate.data();
  p.bias = with_bias ? bias.data() : nullptr;
  p.num_tokens = T, p.num_experts = E, p.topk = K, p.scaling = 2.0f;
  p.ids = ids.data(), p.weights = w.data();
  p.id_offset = id_offset;
  cpu::run_moe_route(p);
  for (int32_t& id : ids) id += id_offset;  // compared as experts
  std::vector<float> logits(size_t(T * E));
  {
    ops::MatmulParams mm;
    mm.x = x.data(), mm.x_dtype = xt, mm.w = gate.data(), mm.w_dtype = DType::F32, mm.y = logits.data();
    mm.y_dtype = DType::F32, mm.m = T, mm.n = E, mm.k = H, mm.ldx = ldx, mm.ldy = E;
    cpu::run_matmul(mm);
  }
  Dev dx = Dev::of(x), dg = Dev::of(gate), db = Dev::of(bias), di = Dev::of(std::vector<int32_t>(ids.size(), -7)),
      dw = Dev::of(std::vector<float>(w.size(), kNaN));
  p.x = dx.p(), p.gate = dg.as<float>(), p.bias = with_bias ? db.as<float>() : nullptr, p.ids = di.as<int32_t>(), p.weights = dw.as<float>();
  {
    cuda::MoeTuning m;
    m.route_fused_max_tokens = fused_max;
    m.route_splitk_max_tokens = splitk_max;
    m.route_splitk_warps = splitk_warps;
    cuda::TuningScope scope(with_moe(m));
    ops::moe_route(p, gpu_stream());
  }
  std::vector<int32_t> gi = di.get<int32_t>(ids.size());
  for (int32_t& id : gi) id += id_offset;
  const std::vector<float> gw = dw.get<float>(w.size());
  auto score = [&](int64_t t, int e) {
    return 1.0 / (1.0 + std::exp(-double(logits[size_t(t * E + e)]))) + (with_bias ? double(bias[size_t(e)]) : 0.0);
  };
  int bad = 0;
  for (int64_t t = 0; t < T && bad < 5; ++t) {
    bool same = true;
    for (int j = 0; j < K; ++j) {
      const size_t o = size_t(t * K + j);
      if (gi[o] == ids[o]) continue;
      same = false;
      if (ties || gi[o] < 0 || gi[o] >= E || std::fabs(score(t, gi[o]) - score(t, ids[o])) > 1e-5)
        ADD_FAILURE() << "token " << t << " rank " << j << ": gpu expert " << gi[o] << " cpu " << ids[o], ++bad;
    }
    if (!same) continue;
    for (int j = 0; j < K; ++j) {
      const size_t o = size_t(t * K + j);
      if (!close(gw[o], w[o], 1e-6, 1e-4)) ADD_FAILURE() << "token " << t << " rank " << j << ": gpu weight " << gw[o] << " cpu " << w[o], ++bad;
    }
  }
}

TEST(CudaMoeRoute, FusedRouterGemm) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 3000;
  for (DType xt : {DType::F32, DType::BF16}) {
    for (int64_t T : {1, 7, 33, 64}) gpu_fused_route_case(T, 6144, 128, 4, xt, false, 64, seed++);
    gpu_fused_route_case(5, 300, 13, 3, xt, false, 64, seed++);  // a partial slice, a partial group
    gpu_fused_route_case(65, 1000, 130, 8, xt, false, 64, seed++);  // F32: matmul then routing
    gpu_fused_route_case(20, 6144, 128, 4, xt, true, 64, seed++);
    gpu_fused_route_case(20, 520, 64, 4, xt, true, 0, seed++);  // ties, unfused (F32)
    gpu_fused_route_case(33, 6144, 128, 4, xt, false, 64, seed++, 32);  // rank 1 of 4, expert-parallel
  }
}

// The split-K router GEMM (F32 x, up to route_splitk_max_tokens tokens): whole and partial
// slices of 128 columns and groups of 32 experts, unaligned x rows (scalar loads), bias or none.
TEST(CudaMoeRoute, SplitKRouterGemm) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 3100;
  const DType f = DType::F32;
  for (int64_t T : {1, 3, 32, 33, 64}) {
    for (bool b : {true, false}) {
      gpu_fused_route_case(T, 6144, 128, 4, f, false, 0, seed++, 0, 64, b);
      gpu_fused_route_case(T, 6144, 72, 8, f, false, 0, seed++, 0, 64, b);
    }
  }
  gpu_fused_route_case(5, 300, 13, 3, f, false, 0, seed++, 0, 64);      // a partial slice, a partial group
  gpu_fused_route_case(17, 301, 40, 4, f, false, 0, seed++, 0, 64);     // hidden % 4 != 0: scalar loads
  gpu_fused_route_case(64, 1000, 130, 8, f, false, 0, seed++, 0, 64, false);
  gpu_fused_route_case(20, 6144, 128, 4, f, true, 0, seed++, 0, 64);    // ties: exactly the CPU's
  gpu_fused_route_case(20, 520, 64, 4, f, true, 0, seed++, 0, 64, false);
  gpu_fused_route_case(33, 6144, 128, 4, f, false, 0, seed++, 32, 64);  // rank 1 of 4, expert-parallel
  gpu_fused_route_case(65, 6144, 128, 4, f, false, 0, seed++, 0, 64);   // past the limit: matmul
  gpu_fused_route_case(32, 6144, 128, 4, f, false, 0, seed++, 0, 128);  // a larger limit
  gpu_fused_route_case(100, 6144, 128, 8, f, false, 0, seed++, 0, 128);
  // Four warps a CTA (slices of 64).
  for (int64_t T : {1, 33, 64}) gpu_fused_route_case(T, 6144, 128, 4, f, false, 0, seed++, 0, 64, T != 33, 4);
  gpu_fused_route_case(17, 301, 72, 8, f, false, 0, seed++, 0, 64, true, 4);
  gpu_fused_route_case(20, 6144, 128, 4, f, true, 0, seed++, 0, 64, true, 4);
}

// The split-K knobs through the bench's --tune names (no GPU needed).
TEST(CudaMoeRoute, SplitKTuningFields) {
  cuda::Tuning t;
  EXPECT_EQ(t.moe.route_splitk_max_tokens, 32);
  EXPECT_EQ(t.moe.route_splitk_warps, 8);
  cuda::set_tuning_field(t, "moe.route_splitk_max_tokens", "0");
  cuda::set_tuning_field(t, "moe.route_splitk_warps", "4");
  EXPECT_EQ(t.moe.route_splitk_max_tokens, 0);
  EXPECT_EQ(t.moe.route_splitk_warps, 4);
  EXPECT_THROW(cuda::set_tuning_field(t, "moe.route_splitk_warps", "5"), Error);
  EXPECT_EQ(t.moe.route_splitk_warps, 4);
}

// ops::moe_route_splits (the model's side-stream rule) answers what run_moe_route picks: F32 x
// with the router GEMM in the op, decode batches up to the limit, never BF16 x or given logits.
TEST(CudaMoeRoute, SplitsAnswersThePath) {
  float dummy = 0;
  ops::MoeRouteParams p;
  p.x = &dummy, p.x_dtype = DType::F32, p.hidden = 6144, p.ldx = 6144, p.gate = &dummy;
  p.num_experts = 128, p.topk = 4;
  cuda::MoeTuning m;
  m.route_splitk_max_tokens = 32;
  cuda::TuningScope scope(with_moe(m));
  for (int64_t T : {1, 32}) {
    p.num_tokens = T;
    EXPECT_TRUE(cuda::moe_route_splits(p)) << T;
  }
  p.num_tokens = 33;
  EXPECT_FALSE(cuda::moe_route_splits(p));
  p.num_tokens = 8;
  p.x_dtype = DType::BF16;
  EXPECT_FALSE(cuda::moe_route_splits(p));
  p.x_dtype = DType::F32;
  p.logits = &dummy;
  EXPECT_FALSE(cuda::moe_route_splits(p));
  p.logits = nullptr;
  p.num_experts = 2000;  // past the routing kernel's 1024
  EXPECT_FALSE(cuda::moe_route_splits(p));
}

}  // namespace
}  // namespace sieve
