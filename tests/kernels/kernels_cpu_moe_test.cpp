// CPU reference of the FP8 MoE pieces against plain double-precision implementations written here:
// moe_experts with FP8 weights (every scale block shape, FP8 x, the quantize_act emulation of the
// CUDA kernels) and moe_route's fused router GEMM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/moe_fp8_work.h"
#include "kernel_test_util.h"
#include "moe_test_util.h"

namespace sieve {
namespace {

using namespace sieve::test;

// ---------------------------------------------------------------------------------------------
// moe_experts with FP8 weights

// The CPU op against the double reference: fp32 arithmetic, so within 1e-4 of 1 + the summed
// magnitude of the token's expert terms (plus a bf16 rounding of out).
void cpu_fp8_case(const MoeShape& shape, bool quantize_act, uint64_t seed) {
  SCOPED_TRACE(shape.describe() + (quantize_act ? " quantize_act" : ""));
  MoeCaseData c(shape, seed);
  std::vector<double> mag;
  const std::vector<double> ref = c.reference(quantize_act, &mag);
  TypedBuffer out = c.out0;
  ops::MoeExpertsParams p = c.params();
  p.quantize_act = quantize_act;
  p.out = out.data();
  cpu::run_moe_experts(p);
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
    const double tol = 1e-4 * (1 + mag[i]) + (shape.out_dtype() == DType::BF16 ? std::fabs(ref[i]) / 256 : 0.0);
    if (std::fabs(out.get(i) - ref[i]) <= tol) continue;
    ADD_FAILURE() << "out[" << i / size_t(shape.H) << "," << i % size_t(shape.H) << "] got " << out.get(i) << " want "
                  << ref[i];
    ++bad;
  }
}

// out_bf16 (fp32 x, a bf16 out: the model's MoE layers on CUDA) is the fp32 op on the same bf16
// values of out, its result rounded to bf16 once: bit for bit.
TEST(CpuMoeExperts, Bf16OutBesideF32X) {
  MoeShape s;
  s.T = 7, s.H = 200, s.I = 72, s.E = 6, s.K = 3, s.skipped = 2, s.act = DType::F32, s.out_bf16 = true;
  for (DType w : {DType::BF16, DType::FP8_E4M3}) {
    s.w = w;
    SCOPED_TRACE(s.describe());
    const MoeCaseData c(s, 950);
    TypedBuffer out_b = c.out0;  // bf16
    std::vector<float> out_f(c.out0.count);
    for (size_t i = 0; i < out_f.size(); ++i) out_f[i] = float(c.out0.get(i));
    ops::MoeExpertsParams p = c.params();
    p.out = out_b.data();
    cpu::run_moe_experts(p);
    p.out_bf16 = false;
    p.out = out_f.data();
    cpu::run_moe_experts(p);
    for (size_t i = 0; i < out_f.size(); ++i) ASSERT_EQ(float(out_b.get(i)), round_bf16(out_f[i])) << i;
  }
  cpu_fp8_case(s, false, 951);
}

TEST(CpuMoeExpertsFp8, EveryBlockShapeMatchesDoubleReference) {
  uint64_t seed = 900;
  const int shapes[][2] = {{1, 32}, {1, 128}, {128, 128}, {32, 64}, {3, 128}, {128, 32}};
  for (auto& bs : shapes) {
    for (bool pow2 : {true, false}) {
      MoeShape s;
      s.T = 7, s.H = 200, s.I = 72, s.E = 6, s.K = 3;
      s.br = bs[0], s.bc = bs[1];
      s.pow2_scales = pow2;
      s.skipped = 2;
      cpu_fp8_case(s, false, seed++);
    }
  }
}

TEST(CpuMoeExpertsFp8, RoutingsAndActivations) {
  uint64_t seed = 950;
  MoeShape s;
  s.T = 9, s.H = 256, s.I = 128, s.E = 8, s.K = 2;
  for (DType act : {DType::F32, DType::BF16}) {
    s.act = act;
    cpu_fp8_case(s, false, seed++);
    MoeShape h = s;
    h.hot = 3;  // every token's first expert is 3
    cpu_fp8_case(h, false, seed++);
    MoeShape o = s;
    o.K = 1, o.only = 5, o.T = 13;  // every token to one expert, the others empty
    cpu_fp8_case(o, false, seed++);
    MoeShape em = s;
    em.empty_every = 2;  // odd experts get no tokens
    em.br = 128;
    cpu_fp8_case(em, false, seed++);
  }
  MoeShape f = s;
  f.act = DType::BF16;
  f.fp8_x = true;  // x given quantized
  f.H = 300;       // a short last group
  cpu_fp8_case(f, false, seed++);
  cpu_fp8_case(f, true, seed++);
}

TEST(CpuMoeExpertsFp8, QuantizeActMatchesTheQuantizedReference) {
  uint64_t seed = 980;
  for (int br : {1, 128}) {
    MoeShape s;
    s.T = 11, s.H = 384, s.I = 200, s.E = 5, s.K = 2, s.br = br;
    cpu_fp8_case(s, true, seed++);
    // The emulation is not a no-op: it moves the output away from the unquantized reference by
    // far more than the fp32 tolerance.
    MoeCaseData c(s, seed++);
    TypedBuffer out = c.out0;
    ops::MoeExpertsParams p = c.params();
    p.quantize_act = true;
    p.out = out.data();
    cpu::run_moe_experts(p);
    const std::vector<double> exact = c.reference(false);
    double worst = 0;
    for (size_t i = 0; i < exact.size(); ++i) worst = std::max(worst, std::fabs(out.get(i) - exact[i]));
    EXPECT_GT(worst, 1e-2);
  }
}

// Tiled scales (scale_tiled) are the same multipliers: the same bytes out, with short last k
// blocks, row blocks with absent rows, empty experts, FP8 x and the quantize_act emulation.
TEST(CpuMoeExpertsFp8, TiledScalesGiveTheSameBytes) {
  uint64_t seed = 1100;
  for (int v = 0; v < 4; ++v) {
    MoeShape s;
    s.T = 9 + 4 * v, s.H = v % 2 ? 300 : 256, s.I = v < 2 ? 72 : 200, s.E = 7, s.K = 2;
    s.empty_every = v == 1 ? 3 : 0;
    s.fp8_x = v == 2;
    s.act = v == 3 ? DType::BF16 : DType::F32;
    for (bool quant : {false, true}) {
      SCOPED_TRACE(s.describe() + (quant ? " quantize_act" : ""));
      MoeCaseData c(s, seed++);
      TypedBuffer row = c.out0, km = c.out0;
      ops::MoeExpertsParams p = c.params();
      p.quantize_act = quant;
      p.out = row.data();
      cpu::run_moe_experts(p);
      p = c.params(true);
      p.quantize_act = quant;
      p.out = km.data();
      cpu::run_moe_experts(p);
      EXPECT_TRUE(row.bytes == km.bytes);
    }
  }
}

// The tiled layout (ops::fp8_scales_moe_tiled, which the loader, the tests and the bench use) holds
// row c of the kernels' 256-row block rb (moe_fp8_work.h: gate_up_row, down_row) at k block kb in
// slot (rb * nkb + kb) * 256 + c, zeros for the absent rows (the CPU op reads it back:
// TiledScalesGiveTheSameBytes). Partial row blocks: inter 144 (and 200, 72), hidden 400.
TEST(CpuMoeExpertsFp8, TiledLayoutIsTheKernelsRowOrder) {
  // One product's tiled scales against its row-major ones; row_of: the kernels' row of a block row.
  auto check = [](const std::vector<float>& tiled, const std::vector<float>& rowmajor, int64_t rbs, int64_t nkb,
                  const std::function<int(int rb, int c, bool& ok)>& row_of) {
    for (int rb = 0; rb < rbs; ++rb)
      for (int64_t kb = 0; kb < nkb; ++kb)
        for (int cc = 0; cc < 256; ++cc) {
          bool ok;
          const int n = row_of(rb, cc, ok);
          const size_t slot = size_t((rb * nkb + kb) * 256 + cc);
          ASSERT_EQ(tiled[slot], ok ? rowmajor[size_t(n * nkb + kb)] : 0.0f) << "rb " << rb << " kb " << kb << " c " << cc;
        }
  };
  for (int64_t I : {72, 144, 256}) {
    const int64_t H = 400, gh = ops::fp8_groups(H), gi = ops::fp8_groups(I);
    SCOPED_TRACE("inter " + std::to_string(I));
    MoeShape s;
    s.H = H, s.I = I, s.E = 1;
    MoeCaseData c(s, 4);
    const std::vector<float>& gu = c.gu_scale[0];
    const std::vector<float>& dn = c.dn_scale[0];
    const std::vector<float> gut = ops::fp8_scales_moe_tiled(gu.data(), 2 * I, H, true);
    const std::vector<float> dnt = ops::fp8_scales_moe_tiled(dn.data(), H, I, false);
    const int64_t rb_gu = (I + 127) / 128, rb_dn = (H + 255) / 256;
    ASSERT_EQ(int64_t(gut.size()), rb_gu * gh * 256);
    ASSERT_EQ(int64_t(gut.size()), ops::fp8_moe_tiled_size(2 * I, H, true));
    ASSERT_EQ(int64_t(dnt.size()), rb_dn * gi * 256);
    ASSERT_EQ(int64_t(dnt.size()), ops::fp8_moe_tiled_size(H, I, false));
    EXPECT_EQ(c.gu_scale_tiled[0], gut);
    check(gut, gu, rb_gu, gh, [&](int rb, int cc, bool& ok) { return cuda::moe_fp8::gate_up_row(rb, cc, int(I), ok); });
    check(dnt, dn, rb_dn, gi, [&](int rb, int cc, bool& ok) { return cuda::moe_fp8::down_row(rb, cc, int(H), ok); });
  }
}

// ops::lt_weight_scales' (1, 128) case is ops::fp8_scales_kmajor's layout.
TEST(CpuMoeExpertsFp8, LtWeightScalesAreTheKmajorLayout) {
  MoeShape s;
  s.H = 400, s.I = 144, s.E = 2;
  MoeCaseData c(s, 3);
  for (int e = 0; e < s.E; ++e) {
    ops::WeightView gu, dn;
    gu.dtype = dn.dtype = DType::FP8_E4M3;
    gu.scale_block_rows = dn.scale_block_rows = 1;
    gu.scale_block_cols = dn.scale_block_cols = 128;
    gu.rows = 2 * s.I, gu.cols = s.H;
    dn.rows = s.H, dn.cols = s.I;
    EXPECT_EQ(ops::lt_weight_scales(gu, c.gu_scale[size_t(e)].data()),
              ops::fp8_scales_kmajor(c.gu_scale[size_t(e)].data(), 2 * s.I, s.H));
    EXPECT_EQ(ops::lt_weight_scales(dn, c.dn_scale[size_t(e)].data()),
              ops::fp8_scales_kmajor(c.dn_scale[size_t(e)].data(), s.H, s.I));
  }
  // (1, 128): out[kb * rows + r] = scale[r * KB + kb]
  const std::vector<float> sc = {1, 2, 3, 4, 5, 6};  // 3 rows x 2 k blocks
  EXPECT_EQ(ops::fp8_scales_kmajor(sc.data(), 3, 200), (std::vector<float>{1, 3, 5, 2, 4, 6}));
}

TEST(CpuMoeExpertsFp8, TiledScalesNeedOneBy128Blocks) {
  MoeShape s;
  s.br = 128;
  MoeCaseData c(s, 2);
  TypedBuffer out = c.out0;
  ops::MoeExpertsParams p = c.params();
  p.out = out.data();
  p.scale_tiled = true;
  EXPECT_THROW(cpu::run_moe_experts(p), Error);
}

TEST(CpuMoeExpertsFp8, MissingScalesAreAnError) {
  MoeCaseData c(MoeShape{}, 1);
  TypedBuffer out = c.out0;
  ops::MoeExpertsParams p = c.params();
  p.out = out.data();
  p.w_down_scale = nullptr;
  EXPECT_THROW(cpu::run_moe_experts(p), Error);
  p = c.params();
  p.out = out.data();
  p.scale_block_cols = 0;
  EXPECT_THROW(cpu::run_moe_experts(p), Error);
}

// ---------------------------------------------------------------------------------------------
// moe_route with the fused router GEMM

// The fused GEMM is run_matmul's arithmetic: ids and weights equal those of a separate matmul
// followed by moe_route, bit for bit; identical router rows tie and go to the lower id.
TEST(CpuMoeRoute, FusedRouterGemmEqualsMatmulThenRoute) {
  Rng rng(31);
  for (DType xt : {DType::F32, DType::BF16}) {
    const int64_t T = 13, H = 200, ldx = 210;
    const int E = 24, K = 4;
    TypedBuffer x = TypedBuffer::from(xt, random_vector(size_t(T * ldx), rng, -1, 1));
    std::vector<float> gate = random_vector(size_t(E * H), rng, -0.1f, 0.1f);
    for (int64_t k = 0; k < H; ++k) gate[size_t(9 * H + k)] = gate[size_t(4 * H + k)];  // experts 4 and 9 tie
    for (int64_t k = 0; k < H; ++k) gate[size_t(4 * H + k)] += 0.05f;                   // ... and are chosen
    for (int64_t k = 0; k < H; ++k) gate[size_t(9 * H + k)] = gate[size_t(4 * H + k)];
    std::vector<float> bias = random_vector(size_t(E), rng, -0.01f, 0.01f);
    bias[4] = bias[9] = 0.5f;
    std::vector<float> logits(size_t(T * E), kNaN);
    ops::MatmulParams mm;
    mm.x = x.data();
    mm.x_dtype = xt;
    mm.w = gate.data();
    mm.w_dtype = DType::F32;
    mm.y = logits.data();
    mm.y_dtype = DType::F32;
    mm.m = T, mm.n = E, mm.k = H, mm.ldx = ldx, mm.ldy = E;
    cpu::run_matmul(mm);
    std::vector<int32_t> ids_a(size_t(T * K), -7), ids_b(size_t(T * K), -7);
    std::vector<float> w_a(size_t(T * K), kNaN), w_b(size_t(T * K), kNaN);
    ops::MoeRouteParams p;
    p.logits = logits.data();
    p.bias = bias.data();
    p.num_tokens = T, p.num_experts = E, p.topk = K, p.scaling = 2.0f;
    p.ids = ids_a.data(), p.weights = w_a.data();
    cpu::run_moe_route(p);
    p.logits = nullptr;
    p.x = x.data(), p.x_dtype = xt, p.hidden = H, p.ldx = ldx, p.gate = gate.data();
    p.ids = ids_b.data(), p.weights = w_b.data();
    cpu::run_moe_route(p);
    EXPECT_EQ(ids_a, ids_b);
    for (size_t i = 0; i < w_a.size(); ++i) EXPECT_EQ(w_a[i], w_b[i]) << i;
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(ids_b[size_t(t * K)], 4) << "token " << t;  // the tie goes to the lower id
      EXPECT_EQ(ids_b[size_t(t * K + 1)], 9) << "token " << t;
    }
  }
}


// ---------------------------------------------------------------------------------------------
// The FP8 MoE kernels' index arithmetic (kernels/cuda/moe_fp8_work.h), emulated on the host.

// Every (sorted row, weight-row block, k split) of a random expert layout is covered by exactly
// one work item, with an expert's row blocks fastest; the row blocks stay inside their expert.
TEST(MoeFp8Work, ItemsCoverEveryRowBlockOnce) {
  Rng rng(71);
  for (int R : {8, 16, 32, 64, 128}) {
    for (int cols : {1, 3, 6, 24, 66}) {
      const int E = rng.uniform_int(1, 40);
      std::vector<int32_t> cnt(static_cast<size_t>(E)), offsets(size_t(E) + 1, 0), blk_start(size_t(E) + 1, 0);
      for (int e = 0; e < E; ++e) {
        const int kind = rng.uniform_int(0, 3);  // empty, a few rows, many rows
        cnt[size_t(e)] = kind == 0 ? 0 : kind == 3 ? rng.uniform_int(R, 5 * R + 3) : rng.uniform_int(1, R);
        offsets[size_t(e) + 1] = offsets[size_t(e)] + cnt[size_t(e)];
        blk_start[size_t(e) + 1] = blk_start[size_t(e)] + (cnt[size_t(e)] + R - 1) / R;
      }
      const int64_t total = int64_t(blk_start[size_t(E)]) * cols;
      std::vector<int> seen(static_cast<size_t>(offsets[size_t(E)]) * size_t(cols), 0);
      cuda::moe_fp8::WorkItem prev{-1, -1, -1};
      for (int64_t i = 0; i < total; ++i) {
        const cuda::moe_fp8::WorkItem w = cuda::moe_fp8::work_item(blk_start.data(), E, i, cols);
        ASSERT_TRUE(w.e >= 0 && w.e < E && cnt[size_t(w.e)] > 0) << "item " << i;
        ASSERT_TRUE(w.col >= 0 && w.col < cols && w.blk >= 0 && w.blk < blk_start[size_t(w.e) + 1] - blk_start[size_t(w.e)]);
        if (i > 0 && w.e == prev.e && w.col == prev.col) {
          EXPECT_EQ(w.blk, prev.blk + 1) << "row blocks fastest";
        }
        prev = w;
        const int r0 = offsets[size_t(w.e)] + w.blk * R, r1 = std::min(r0 + R, offsets[size_t(w.e) + 1]);
        for (int r = r0; r < r1; ++r) ++seen[size_t(r) * size_t(cols) + size_t(w.col)];
      }
      for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "row " << k / size_t(cols) << " col " << k % size_t(cols);
    }
  }
}

// gate_up's 256-row weight blocks pair each unit's gate and up rows 64 apart and cover every row of
// [gate | up] exactly once; down's cover the hidden rows; k splits tile [0, nkb) without gaps.
TEST(MoeFp8Work, WeightRowsScaleSlotsAndSplits) {
  for (int inter : {128, 144, 384, 768}) {
    std::vector<int> seen(size_t(2 * inter), 0);
    for (int rb = 0; rb < (inter + 127) / 128; ++rb) {
      for (int c = 0; c < 256; ++c) {
        bool ok, ok_up;
        const int n = cuda::moe_fp8::gate_up_row(rb, c, inter, ok);
        if (!ok) continue;
        ++seen[size_t(n)];
        if ((c & 64) == 0) {  // a gate row: its up row is 64 further
          const int up = cuda::moe_fp8::gate_up_row(rb, c + 64, inter, ok_up);
          EXPECT_TRUE(ok_up);
          EXPECT_EQ(up, n + inter) << "rb " << rb << " c " << c;
          EXPECT_LT(n, inter);
        }
      }
    }
    for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k], 1) << "inter " << inter << " row " << k;
  }
  for (int hidden : {256, 400, 6144}) {
    std::vector<int> seen(size_t(hidden), 0);
    for (int rb = 0; rb < (hidden + 255) / 256; ++rb)
      for (int c = 0; c < 256; ++c) {
        bool ok;
        const int n = cuda::moe_fp8::down_row(rb, c, hidden, ok);
        if (ok) ++seen[size_t(n)];
      }
    for (int v : seen) ASSERT_EQ(v, 1);
  }
  std::vector<int> slot_seen(256, 0);
  for (int h = 0; h < 2; ++h)
    for (int q = 0; q < 4; ++q)
      for (int j = 0; j < 16; ++j)
        for (int i = 0; i < 2; ++i) {
          const int slot = cuda::moe_fp8::wscale_slot(h * 128 + 8 * j + 2 * q + i);
          EXPECT_EQ(slot, h * 128 + q * 32 + j * 2 + i);
          ++slot_seen[size_t(slot)];
        }
  for (int v : slot_seen) ASSERT_EQ(v, 1);
  for (int nkb : {1, 3, 6, 48}) {
    for (int ks = 1; ks <= nkb; ++ks) {
      int next = 0;
      for (int k = 0; k < ks; ++k) {
        int kb0, kb1;
        cuda::moe_fp8::split_range(k, ks, nkb, kb0, kb1);
        EXPECT_EQ(kb0, next);
        EXPECT_LT(kb0, kb1) << "empty split";
        next = kb1;
      }
      EXPECT_EQ(next, nkb);
    }
  }
}

// The host's k split (the stream kernels' default, and the bench's read probe): two split units an
// SM, within 1 .. nkb.
TEST(MoeFp8Work, HostKsplit) {
  using cuda::moe_fp8::host_ksplit;
  EXPECT_EQ(host_ksplit(128 * 6, 48, 132), 1);  // 32 tokens at a TP4 rank: 768 units already
  EXPECT_EQ(host_ksplit(4 * 6, 48, 132), 11);   // one token, TP4: 24 units -> 264 / 24
  EXPECT_EQ(host_ksplit(4 * 3, 48, 132), 22);
  EXPECT_EQ(host_ksplit(4 * 24, 6, 132), 3);    // down at one token
  EXPECT_EQ(host_ksplit(1, 48, 132), 48);       // capped at the k blocks
  EXPECT_EQ(host_ksplit(133, 48, 132), 2);      // ceil(264 / 133)
}

// The k split the stream kernels pick for their busiest CTA (MoeTuning::fp8_ksplit_waves) at the
// shapes of one MiniMax-M3 rank on 132 SMs: gate_up at 32 tokens (about 81 experts touched) and
// one token; down at one token; and when the units fill many waves, no split.
TEST(MoeFp8Work, KsplitByWaves) {
  using cuda::moe_fp8::pick_ksplit;
  EXPECT_EQ(pick_ksplit(81 * 6, 48, 132, 16), 4);  // TP4: 4 waves of whole units -> 15 of quarters
  EXPECT_EQ(pick_ksplit(81 * 6, 48, 132, 3), 1);   // 2 and 3 splits leave the last wave as empty
  EXPECT_EQ(pick_ksplit(81 * 3, 48, 132, 16), 1);  // TP8: 2 waves of 92 % already
  EXPECT_EQ(pick_ksplit(4 * 6, 48, 132, 16), 5);   // one token, TP4: one wave of 10 k blocks
  EXPECT_EQ(pick_ksplit(4 * 3, 48, 132, 16), 10);  // one token, TP8: one wave of 5 k blocks
  EXPECT_EQ(pick_ksplit(4 * 24, 6, 132, 16), 1);   // down, one token, TP4
  EXPECT_EQ(pick_ksplit(81 * 24, 6, 132, 16), 1);
  EXPECT_EQ(pick_ksplit(0, 48, 132, 16), 1);
  for (int64_t units : {1, 7, 100, 131, 132, 133, 1000})
    for (int nkb : {1, 2, 5, 48})
      for (int m : {1, 2, 8, 64}) {
        const int ks = pick_ksplit(units, nkb, 132, m);
        EXPECT_GE(ks, 1);
        EXPECT_LE(ks, std::max(1, std::min(m, nkb)));
      }
}

}  // namespace
}  // namespace sieve
