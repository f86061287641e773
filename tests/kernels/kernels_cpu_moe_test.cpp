// CPU reference of the FP8 MoE pieces against plain double-precision implementations written here:
// the 1 x 128 activation quantizer, moe_experts with FP8 weights (every scale block shape, FP8 x,
// the quantize_act emulation of the CUDA kernels) and moe_route's fused router GEMM.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernel_test_util.h"
#include "moe_test_util.h"

namespace sieve {
namespace {

using namespace sieve::test;

// ---------------------------------------------------------------------------------------------
// The activation quantizer

TEST(CpuFp8Quantizer, GroupsScalesAndRounding) {
  Rng rng(5);
  const int64_t rows = 4, cols = 300, ld = 310, groups = 3;  // the last group is 44 wide
  std::vector<float> x(size_t(rows * ld), kNaN);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) x[size_t(r * ld + k)] = rng.uniform(-3, 3) * std::ldexp(1.0f, int(r) - 1);
  for (int64_t k = 128; k < 256; ++k) x[size_t(ld + k)] = 0.0f;  // a zero group: scale 1
  x[size_t(2 * ld + 7)] = kNaN;                                  // ignored by its group's amax
  x[size_t(3 * ld + 260)] = -1e30f;                               // a huge value: scale = its |x| / 448
  std::vector<uint8_t> q(size_t(rows * ld), 0xAB);
  std::vector<float> sc(size_t(rows * groups), kNaN);
  cpu::quantize_fp8_1x128(x.data(), rows, cols, ld, q.data(), ld, sc.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * 128, k1 = std::min(cols, k0 + 128);
      double amax = 0;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = x[size_t(r * ld + k)];
        if (!std::isnan(v)) amax = std::max(amax, double(std::fabs(v)));
      }
      const float s = sc[size_t(r * groups + g)];
      if (amax == 0) {
        EXPECT_EQ(s, 1.0f);
      } else {
        EXPECT_EQ(s, float(amax) / 448.0f) << r << "," << g;  // one fp32 division
      }
      for (int64_t k = k0; k < k1; ++k) {
        const float v = x[size_t(r * ld + k)];
        const uint8_t b = q[size_t(r * ld + k)];
        if (std::isnan(v)) {
          EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(b)));
          continue;
        }
        // Nearest e4m3 value of v / s (ties to even), found by scanning every finite code.
        const double t = double(v / s);
        double best = 0, bestd = 1e300;
        int bestcode = 0;
        for (int c = 0; c < 256; ++c) {
          const double f = fp8e4m3_to_f32(uint8_t(c));
          if (std::isnan(f)) continue;
          const double d = std::fabs(f - std::clamp(t, -448.0, 448.0));
          if (d < bestd || (d == bestd && (c & 1) == 0 && (bestcode & 1) == 1)) best = f, bestd = d, bestcode = c;
        }
        EXPECT_EQ(double(fp8e4m3_to_f32(b)), best) << "row " << r << " col " << k << " x " << v << " scale " << s;
      }
      if (amax > 0) {
        // The group's largest value lands on +-448 (the saturating cast absorbs the division's ulp).
        double qmax = 0;
        for (int64_t k = k0; k < k1; ++k) qmax = std::max(qmax, double(std::fabs(fp8e4m3_to_f32(q[size_t(r * ld + k)]))));
        EXPECT_EQ(qmax, 448.0);
      }
    }
    for (int64_t k = cols; k < ld; ++k) EXPECT_EQ(q[size_t(r * ld + k)], 0xAB) << "padding written";
  }
}

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
    const double tol = 1e-4 * (1 + mag[i]) + (shape.act == DType::BF16 ? std::fabs(ref[i]) / 256 : 0.0);
    if (std::fabs(out.get(i) - ref[i]) <= tol) continue;
    ADD_FAILURE() << "out[" << i / size_t(shape.H) << "," << i % size_t(shape.H) << "] got " << out.get(i) << " want "
                  << ref[i];
    ++bad;
  }
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

}  // namespace
}  // namespace sieve
