// CPU reference dense ops (matmul, embedding, rms_norm, add, swiglu_oai, moe_route,
// moe_experts) against plain double-precision implementations written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"

namespace sieve {
namespace {

using namespace sieve::test;

std::string dt(DType t) { return std::string(dtype_name(t)); }

// ---------------------------------------------------------------------------------------------
// matmul

void run_matmul_case(int64_t m, int64_t n, int64_t k, DType xt, DType wt, DType yt, bool accumulate,
                     uint64_t seed) {
  MatmulCase c(m, n, k, xt, wt, yt, accumulate, seed);
  SCOPED_TRACE(c.describe());
  TypedBuffer y = c.y;
  cpu::run_matmul(c.params(c.x.data(), c.w.data(), y.data()));
  EXPECT_EQ(c.mismatches(y, 1e-6, 1e-6), "");
}

TEST(CpuMatmul, ShapesAndDtypes) {
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 129}, {2, 300, 127}, {64, 130, 300}, {5, 9, 8}};
  uint64_t seed = 100;
  for (auto& s : shapes) {
    for (DType xt : {DType::F32, DType::BF16}) {
      for (DType wt : {DType::F32, DType::BF16}) {
        for (DType yt : {DType::F32, DType::BF16}) {
          for (bool acc : {false, true}) run_matmul_case(s[0], s[1], s[2], xt, wt, yt, acc, seed++);
        }
      }
    }
  }
}

TEST(CpuMatmul, ThreadedSplitCoversEveryColumn) {
  run_matmul_case(33, 257, 1000, DType::F32, DType::BF16, DType::F32, false, 7);
  run_matmul_case(1, 1027, 2049, DType::BF16, DType::BF16, DType::F32, true, 8);
}

TEST(CpuMatmul, ZeroK) {
  std::vector<float> y(6, kNaN);
  ops::MatmulParams p;
  p.y = y.data();
  p.m = 2;
  p.n = 3;
  p.k = 0;
  p.ldx = 0;
  p.ldy = 3;
  cpu::run_matmul(p);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(CpuMatmul, Throughput) {
  const int64_t m = 64, n = 2048, k = 2048;
  Rng rng(3);
  auto x = random_vector(size_t(m * k), rng);
  TypedBuffer w = TypedBuffer::from(DType::BF16, random_vector(size_t(n * k), rng));
  std::vector<float> y(size_t(m * n));
  ops::MatmulParams p;
  p.x = x.data();
  p.w = w.data();
  p.w_dtype = DType::BF16;
  p.y = y.data();
  p.m = m;
  p.n = n;
  p.k = k;
  p.ldx = k;
  p.ldy = n;
  auto t0 = std::chrono::steady_clock::now();
  cpu::run_matmul(p);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("matmul %ldx%ldx%ld (bf16 w): %.3f s, %.2f GFLOP/s\n", long(m), long(n), long(k), s,
              2.0 * m * n * k / s / 1e9);
  EXPECT_TRUE(std::isfinite(y[0]));
}

// ---------------------------------------------------------------------------------------------
// embedding

TEST(CpuEmbedding, GathersRows) {
  for (DType tt : {DType::F32, DType::BF16}) {
    for (DType ot : {DType::F32, DType::BF16}) {
      Rng rng(5);
      const int64_t vocab = 37, hidden = 129;
      TypedBuffer table = TypedBuffer::from(tt, random_vector(size_t(vocab * hidden), rng, -3, 3));
      std::vector<int32_t> ids = {0, 36, 5, 5, 17};
      TypedBuffer out(ot, ids.size() * hidden);
      ops::EmbeddingParams p;
      p.ids = ids.data();
      p.num_tokens = int64_t(ids.size());
      p.table = table.data();
      p.table_dtype = tt;
      p.vocab = vocab;
      p.hidden = hidden;
      p.out = out.data();
      p.out_dtype = ot;
      cpu::run_embedding(p);
      for (size_t t = 0; t < ids.size(); ++t) {
        for (int64_t d = 0; d < hidden; ++d) {
          float want = table.get(size_t(ids[t] * hidden + d));
          if (ot == DType::BF16) want = round_bf16(want);
          ASSERT_EQ(out.get(t * hidden + d), want);
        }
      }
    }
  }
}

// A vocabulary shard (tensor parallelism): rows for the ids in [vocab0, vocab0 + vocab), zeros for
// the others, every output element written.
TEST(CpuEmbedding, VocabShardGivesZerosForOtherRanksIds) {
  Rng rng(6);
  const int64_t vocab = 37, hidden = 129, vocab0 = 74;
  TypedBuffer table = TypedBuffer::from(DType::BF16, random_vector(size_t(vocab * hidden), rng, -3, 3));
  std::vector<int32_t> ids = {74, 110, 0, 73, 111, 90, 500};
  std::vector<float> out(ids.size() * hidden, kNaN);
  ops::EmbeddingParams p = shard_embedding_params(ids, table.data(), vocab, hidden, vocab0, out.data());
  cpu::run_embedding(p);
  for (size_t t = 0; t < ids.size(); ++t) {
    const bool here = ids[t] >= vocab0 && ids[t] < vocab0 + vocab;
    for (int64_t d = 0; d < hidden; ++d)
      ASSERT_EQ(out[t * hidden + d], here ? table.get(size_t((ids[t] - vocab0) * hidden + d)) : 0.0f) << "token " << t;
  }
  // Without shard an id outside the table is an error, not a zero row.
  p.shard = false;
  EXPECT_THROW(cpu::run_embedding(p), std::exception);
}

// ---------------------------------------------------------------------------------------------
// rms_norm

void run_rms_case(int64_t rows, int64_t dim, DType xt, bool gemma, bool residual, bool alias, uint64_t seed) {
  SCOPED_TRACE("dim=" + std::to_string(dim) + " x=" + dt(xt) + " gemma=" + std::to_string(gemma) +
               " residual=" + std::to_string(residual) + " alias=" + std::to_string(alias));
  Rng rng(seed);
  const int64_t ldx = dim + 1, ldr = dim + 2, ldy = alias ? ldx : dim + 3;
  TypedBuffer x = TypedBuffer::from(xt, random_vector(size_t(rows * ldx), rng, -3, 3));
  TypedBuffer r = TypedBuffer::from(xt, random_vector(size_t(rows * ldr), rng, -3, 3));
  TypedBuffer wb = TypedBuffer::from(DType::BF16, random_vector(size_t(dim), rng, -0.5f, 0.5f));
  TypedBuffer yb(xt, size_t(rows * ldy));
  TypedBuffer x0 = x, r0 = r;
  ops::RmsNormParams p;
  p.x = x.data();
  p.x_dtype = xt;
  p.residual = residual ? r.data() : nullptr;
  p.ldr = ldr;
  p.y = alias ? x.data() : yb.data();
  p.y_dtype = xt;
  p.weight = wb.data();
  p.weight_dtype = DType::BF16;
  p.rows = rows;
  p.dim = dim;
  p.ldx = ldx;
  p.ldy = ldy;
  p.eps = 1e-6f;
  p.gemma = gemma;
  cpu::run_rms_norm(p);
  const TypedBuffer& y = alias ? x : yb;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<double> v(static_cast<size_t>(dim));
    double ms = 0;
    for (int64_t d = 0; d < dim; ++d) {
      float a = x0.get(size_t(i * ldx + d));
      if (residual) {
        float sum = a + r0.get(size_t(i * ldr + d));
        if (xt == DType::BF16) sum = round_bf16(sum);
        ASSERT_EQ(r.get(size_t(i * ldr + d)), sum) << "residual " << i << "," << d;
        a = sum;
      }
      v[size_t(d)] = a;
      ms += double(a) * a;
    }
    ms /= double(dim);
    for (int64_t d = 0; d < dim; ++d) {
      double wv = wb.get(size_t(d));
      double want = v[size_t(d)] / std::sqrt(ms + 1e-6) * (gemma ? 1.0 + wv : wv);
      float got = y.get(size_t(i * ldy + d));
      ASSERT_TRUE(close(got, want, 1e-6, xt == DType::BF16 ? 1.0 / 256 : 1e-5)) << i << "," << d << " got " << got << " want " << want;
    }
  }
}

TEST(CpuRmsNorm, Variants) {
  uint64_t seed = 200;
  for (int64_t dim : {1, 127, 128, 300}) {
    for (DType xt : {DType::F32, DType::BF16}) {
      for (bool gemma : {true, false}) {
        for (bool residual : {false, true}) {
          for (bool alias : {false, true}) run_rms_case(5, dim, xt, gemma, residual, alias, seed++);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// add

// A bf16 x added to an fp32 residual (residual_f32: the model's bf16 sublayer outputs on CUDA)
// is the fp32 case on x's values: the same sums, the same normed rows, bit for bit.
TEST(CpuRmsNorm, Bf16IntoF32Residual) {
  Rng rng(260);
  const int64_t rows = 5, dim = 300, ld = dim + 3;
  const TypedBuffer xb = TypedBuffer::from(DType::BF16, random_vector(size_t(rows * ld), rng, -3, 3));
  std::vector<float> xf(xb.count);
  for (size_t i = 0; i < xb.count; ++i) xf[i] = float(xb.get(i));
  const std::vector<float> r0 = random_vector(size_t(rows * ld), rng, -3, 3);
  const TypedBuffer wb = TypedBuffer::from(DType::BF16, random_vector(size_t(dim), rng, -0.5f, 0.5f));
  std::vector<float> r1 = r0, r2 = r0, y1(size_t(rows * ld)), y2(size_t(rows * ld));
  ops::RmsNormParams p;
  p.x = xf.data();
  p.x_dtype = DType::F32;
  p.residual = r1.data();
  p.ldr = ld;
  p.y = y1.data();
  p.y_dtype = DType::F32;
  p.weight = wb.data();
  p.weight_dtype = DType::BF16;
  p.rows = rows;
  p.dim = dim;
  p.ldx = p.ldy = ld;
  cpu::run_rms_norm(p);
  p.x = xb.data();
  p.x_dtype = DType::BF16;
  p.residual = r2.data();
  p.residual_f32 = true;
  p.y = y2.data();
  cpu::run_rms_norm(p);
  EXPECT_EQ(r1, r2);
  EXPECT_EQ(y1, y2);
}

TEST(CpuAdd, F32AndBf16) {
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(9);
    const int64_t n = 301;
    TypedBuffer y = TypedBuffer::from(t, random_vector(size_t(n), rng));
    TypedBuffer x = TypedBuffer::from(t, random_vector(size_t(n), rng));
    TypedBuffer y0 = y;
    ops::AddParams p;
    p.y = y.data();
    p.x = x.data();
    p.dtype = t;
    p.n = n;
    p.alpha = -0.75f;
    cpu::run_add(p);
    for (int64_t i = 0; i < n; ++i) {
      float want = y0.get(size_t(i)) + -0.75f * x.get(size_t(i));
      if (t == DType::BF16) want = round_bf16(want);
      ASSERT_EQ(y.get(size_t(i)), want);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// swiglu_oai

TEST(CpuSwigluOai, ClampsAndStrides) {
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(13);
    const int64_t rows = 7, inter = 129, ld_in = 2 * inter + 3, ld_out = inter + 1;
    TypedBuffer in = TypedBuffer::from(t, random_vector(size_t(rows * ld_in), rng, -12, 12));
    TypedBuffer out(t, size_t(rows * ld_out));
    ops::SwigluOaiParams p;
    p.gate_up = in.data();
    p.out = out.data();
    p.dtype = t;
    p.rows = rows;
    p.inter = inter;
    p.ld_in = ld_in;
    p.ld_out = ld_out;
    p.alpha = 1.702f;
    p.limit = 7.0f;
    p.beta = 1.0f;
    cpu::run_swiglu_oai(p);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        double g = in.get(size_t(r * ld_in + i)), u = in.get(size_t(r * ld_in + inter + i));
        g = std::min(g, 7.0);
        u = std::max(-7.0, std::min(u, 7.0));
        double want = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
        ASSERT_TRUE(close(out.get(size_t(r * ld_out + i)), want, 1e-5, t == DType::BF16 ? 1.0 / 256 : 1e-5));
      }
      ASSERT_TRUE(std::isnan(out.get(size_t(r * ld_out + inter))));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_route

// Expert parallelism: ids come out less id_offset (the rest of the routing unchanged).
TEST(CpuMoeRoute, IdOffsetShiftsTheIds) {
  Rng rng(18);
  const int64_t T = 7;
  const int E = 12, K = 3;
  std::vector<float> logits = random_vector(size_t(T * E), rng, -3, 3);
  std::vector<int32_t> ids(size_t(T * K), -7), shifted(size_t(T * K), -7);
  std::vector<float> w(size_t(T * K), kNaN), w2(size_t(T * K), kNaN);
  ops::MoeRouteParams p;
  p.logits = logits.data();
  p.num_tokens = T;
  p.num_experts = E;
  p.topk = K;
  p.ids = ids.data();
  p.weights = w.data();
  cpu::run_moe_route(p);
  p.id_offset = 4;
  p.ids = shifted.data();
  p.weights = w2.data();
  cpu::run_moe_route(p);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(shifted[i], ids[i] - 4);
    EXPECT_EQ(w2[i], w[i]);
  }
}

TEST(CpuMoeRoute, TopkBiasTiesRenormScaling) {
  Rng rng(17);
  for (int E : {8, 13}) {
    for (int K : {1, 2, 4}) {
      for (bool use_bias : {false, true}) {
        for (bool renorm : {false, true}) {
          const int64_t T = 9;
          std::vector<float> logits = random_vector(size_t(T * E), rng, -3, 3);
          std::vector<float> bias = random_vector(size_t(E), rng, -0.2f, 0.2f);
          // Ties: token 0 all equal; token 1 two experts equal and best.
          for (int e = 0; e < E; ++e) logits[size_t(e)] = 0.5f;
          logits[size_t(E + 2)] = logits[size_t(E + 5)] = 10.0f;
          if (use_bias) bias[2] = bias[5] = 0.2f;
          if (use_bias) bias[0] = bias[1] = bias[3] = 0.0f;
          std::vector<int32_t> ids(size_t(T * K), -7);
          std::vector<float> w(size_t(T * K), kNaN);
          ops::MoeRouteParams p;
          p.logits = logits.data();
          p.bias = use_bias ? bias.data() : nullptr;
          p.num_tokens = T;
          p.num_experts = E;
          p.topk = K;
          p.renormalize = renorm;
          p.scaling = 2.5f;
          p.ids = ids.data();
          p.weights = w.data();
          cpu::run_moe_route(p);
          for (int64_t t = 0; t < T; ++t) {
            std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
            for (int e = 0; e < E; ++e) {
              s[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(t * E + e)]));
              c[size_t(e)] = s[size_t(e)] + (use_bias ? bias[size_t(e)] : 0.0f);
            }
            std::vector<int32_t> order(static_cast<size_t>(E));
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[size_t(a)] > c[size_t(b)]; });
            double sum = 0;
            for (int j = 0; j < K; ++j) sum += s[size_t(order[size_t(j)])];
            for (int j = 0; j < K; ++j) {
              ASSERT_EQ(ids[size_t(t * K + j)], order[size_t(j)]) << "E=" << E << " K=" << K << " t=" << t;
              double want = s[size_t(order[size_t(j)])] / (renorm ? sum : 1.0) * 2.5;
              ASSERT_TRUE(close(w[size_t(t * K + j)], want, 1e-7, 1e-6));
            }
          }
          if (K >= 2) {
            EXPECT_EQ(ids[size_t(K)], 2);  // token 1: experts 2 and 5 tie, lower id first
            EXPECT_EQ(ids[size_t(K + 1)], 5);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_experts

void run_moe_experts_case(DType wt, DType at, uint64_t seed) {
  SCOPED_TRACE("w=" + dt(wt) + " act=" + dt(at));
  Rng rng(seed);
  const int64_t T = 7, H = 33, I = 20;
  const int E = 5, K = 3;
  TypedBuffer x = TypedBuffer::from(at, random_vector(size_t(T * H), rng, -2, 2));
  std::vector<TypedBuffer> gu, dn;
  std::vector<const void*> gup, dnp;
  for (int e = 0; e < E; ++e) {
    gu.push_back(TypedBuffer::from(wt, random_vector(size_t(2 * I * H), rng, -0.5f, 0.5f)));
    dn.push_back(TypedBuffer::from(wt, random_vector(size_t(H * I), rng, -0.5f, 0.5f)));
  }
  for (int e = 0; e < E; ++e) {
    gup.push_back(gu[size_t(e)].data());
    dnp.push_back(dn[size_t(e)].data());
  }
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> w(size_t(T * K));
  for (auto& v : ids) v = rng.uniform_int(-1, E - 1);  // -1: not routed here
  ids[0] = ids[1] = 3;                                 // the same expert twice
  for (auto& v : w) v = rng.uniform(0, 1);
  TypedBuffer out = TypedBuffer::from(at, random_vector(size_t(T * H), rng));
  TypedBuffer out0 = out;
  ops::MoeExpertsParams p;
  p.x = x.data();
  p.act_dtype = at;
  p.num_tokens = T;
  p.hidden = H;
  p.inter = I;
  p.num_experts = E;
  p.topk = K;
  p.ids = ids.data();
  p.weights = w.data();
  p.w_gate_up = gup.data();
  p.w_down = dnp.data();
  p.w_dtype = wt;
  p.out = out.data();
  cpu::run_moe_experts(p);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> acc(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < K; ++j) {
      const int e = ids[size_t(t * K + j)];
      if (e < 0) continue;
      std::vector<double> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += double(x.get(size_t(t * H + h))) * gu[size_t(e)].get(size_t(i * H + h));
          u += double(x.get(size_t(t * H + h))) * gu[size_t(e)].get(size_t((I + i) * H + h));
        }
        g = std::min(g, 7.0);
        u = std::max(-7.0, std::min(u, 7.0));
        a[size_t(i)] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += a[size_t(i)] * dn[size_t(e)].get(size_t(h * I + i));
        acc[size_t(h)] += w[size_t(t * K + j)] * y;
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      double want = out0.get(size_t(t * H + h)) + acc[size_t(h)];
      ASSERT_TRUE(close(out.get(size_t(t * H + h)), want, 1e-4, at == DType::BF16 ? 1.0 / 256 : 1e-4))
          << t << "," << h << " got " << out.get(size_t(t * H + h)) << " want " << want;
    }
  }
}

TEST(CpuMoeExperts, MatchesPerTokenLoop) {
  run_moe_experts_case(DType::F32, DType::F32, 300);
  run_moe_experts_case(DType::BF16, DType::F32, 301);
  run_moe_experts_case(DType::BF16, DType::BF16, 302);
}

}  // namespace
}  // namespace sieve
