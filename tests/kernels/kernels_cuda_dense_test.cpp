// CUDA dense ops (matmul, embedding, rms_norm, add, swiglu_oai, moe_route, moe_experts) against
// the CPU reference on fresh random inputs, odd shapes and padded strides, outputs poisoned first.
// Label gpu: skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cuda/tuning.h"

namespace sieve {
namespace {

using namespace sieve::test;


double ulp_bf16(double v) { return std::ldexp(1.0, std::max(-133, std::ilogb(std::max(std::fabs(v), 1e-38)) - 7)); }

// `got` element by element against the CPU's `want`: NaN exactly where the CPU has NaN (padding
// that neither side writes), elsewhere within tol(want). Reports at most 5 failures.
template <class Tol>
void expect_elements_close(const TypedBuffer& got, const TypedBuffer& want, Tol tol, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < want.count && bad < 5; ++i) {
    const double a = got.get(i), b = want.get(i);
    if (std::isnan(b) ? std::isnan(a) : std::fabs(a - b) <= tol(b)) continue;
    ADD_FAILURE() << what << "[" << i << "] gpu " << a << " cpu " << b;
    ++bad;
  }
}

// ---------------------------------------------------------------------------------------------
// matmul

// GPU matmul against a double-precision reference. Bound per output: the products' magnitude
// times the rounding of x to bf16 (2^-8, when x is F32 and w BF16) and the fp32 sums
// (k x 2^-24), plus one bf16 rounding of the output (y BF16). Padding columns stay poisoned.
void gpu_matmul_case(int64_t m, int64_t n, int64_t k, DType xt, DType wt, DType yt, bool acc, uint64_t seed) {
  MatmulCase c(m, n, k, xt, wt, yt, acc, seed);
  SCOPED_TRACE(c.describe());
  Dev dx = Dev::of(c.x), dw = Dev::of(c.w), dy = Dev::of(c.y);
  ops::matmul(c.params(dx.p(), dw.p(), dy.p()), gpu_stream());
  const double xr = xt == DType::F32 && wt == DType::BF16 ? std::ldexp(1.0, -8) : 0.0;
  EXPECT_EQ(c.mismatches(fetch(dy, yt, c.y.count), xr + double(k + 2) * std::ldexp(1.0, -24), 1e-6), "");
}

TEST(CudaMatmul, ShapesAndDtypes) {
  SKIP_WITHOUT_GPU();
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 129}, {1, 300, 127}, {64, 130, 300}, {129, 257, 64}};
  uint64_t seed = 300;
  for (auto& s : shapes) {
    for (DType xt : {DType::F32, DType::BF16})
      for (DType yt : {DType::F32, DType::BF16})
        for (bool acc : {false, true}) gpu_matmul_case(s[0], s[1], s[2], xt, DType::BF16, yt, acc, seed++);
    for (bool acc : {false, true}) gpu_matmul_case(s[0], s[1], s[2], DType::F32, DType::F32, DType::F32, acc, seed++);
  }
}

TEST(CudaMatmul, ZeroKWritesZeros) {
  SKIP_WITHOUT_GPU();
  std::vector<float> host(2 * 4, kNaN);
  Dev y = Dev::of(host);
  ops::MatmulParams p;
  p.y = y.p();
  p.m = 2;
  p.n = 3;
  p.k = 0;
  p.ldy = 4;
  ops::matmul(p, gpu_stream());
  std::vector<float> got = y.get<float>(host.size());
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(got[size_t(i * 4 + j)], 0.0f);
    EXPECT_TRUE(std::isnan(got[size_t(i * 4 + 3)]));
  }
}

TEST(CudaMatmul, UnsupportedDtypeNamesTheOp) {
  SKIP_WITHOUT_GPU();
  Dev x(64), w(64), y(64);
  ops::MatmulParams p;
  p.x = x.p();
  p.x_dtype = DType::BF16;
  p.w = w.p();
  p.w_dtype = DType::F32;  // bf16 x with f32 weights: no cuBLAS type combination
  p.y = y.p();
  p.m = p.n = p.k = 2;
  p.ldx = p.ldy = 2;
  try {
    ops::matmul(p, gpu_stream());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// embedding, rms_norm, add, swiglu_oai: the same arithmetic as the CPU, so (nearly) bitwise

TEST(CudaEmbedding, GathersRowsBitwise) {
  SKIP_WITHOUT_GPU();
  for (DType tt : {DType::F32, DType::BF16}) {
    for (DType ot : {DType::F32, DType::BF16}) {
      Rng rng(11);
      const int64_t vocab = 1001, hidden = 257;
      TypedBuffer table = TypedBuffer::from(tt, random_vector(size_t(vocab * hidden), rng, -3, 3));
      std::vector<int32_t> ids = {0, 1000, 5, 5, 17, 999, 3};
      for (int i = 0; i < 60; ++i) ids.push_back(rng.uniform_int(0, int(vocab - 1)));
      TypedBuffer want(ot, ids.size() * hidden);
      ops::EmbeddingParams p;
      p.ids = ids.data();
      p.num_tokens = int64_t(ids.size());
      p.table = table.data();
      p.table_dtype = tt;
      p.vocab = vocab;
      p.hidden = hidden;
      p.out = want.data();
      p.out_dtype = ot;
      cpu::run_embedding(p);
      Dev dids = Dev::of(ids), dtable = Dev::of(table), dout = Dev::of(TypedBuffer(ot, want.count));
      p.ids = dids.as<int32_t>();
      p.table = dtable.p();
      p.out = dout.p();
      ops::embedding(p, gpu_stream());
      EXPECT_EQ(dout.bytes(want.bytes.size()), want.bytes) << name(tt) << " -> " << name(ot);
    }
  }
}

// A vocabulary shard: ids outside the table's rows give zero rows, as on the CPU.
TEST(CudaEmbedding, VocabShardBitwise) {
  SKIP_WITHOUT_GPU();
  Rng rng(12);
  const int64_t vocab = 250, hidden = 257, vocab0 = 500;
  TypedBuffer table = TypedBuffer::from(DType::BF16, random_vector(size_t(vocab * hidden), rng, -3, 3));
  std::vector<int32_t> ids = {500, 749, 0, 499, 750, 600, 999};
  for (int i = 0; i < 40; ++i) ids.push_back(rng.uniform_int(0, 999));
  TypedBuffer want(DType::F32, ids.size() * hidden);
  ops::EmbeddingParams p = shard_embedding_params(ids, table.data(), vocab, hidden, vocab0, want.data());
  cpu::run_embedding(p);
  Dev dids = Dev::of(ids), dtable = Dev::of(table), dout = Dev::of(TypedBuffer(DType::F32, want.count));
  p.ids = dids.as<int32_t>();
  p.table = dtable.p();
  p.out = dout.p();
  ops::embedding(p, gpu_stream());
  EXPECT_EQ(dout.bytes(want.bytes.size()), want.bytes);
}

// One rms_norm case on the GPU against the CPU: y within an ulp of the CPU's (bf16) or 4e-7
// relative (fp32), the stored residual sums bit for bit. mode bit 0: residual; bit 1: y aliases x;
// bit 2: an F32 residual whatever x's dtype (residual_f32: the model's bf16 sublayer output added
// to its fp32 residual stream).
void expect_rms_norm_matches_cpu(int64_t dim, DType xt, DType wt, DType y_dtype, int mode, bool gemma, uint64_t seed,
                                 int64_t rows, int64_t ldx, int64_t ldr, int64_t ldy) {
  const bool residual = mode & 1, alias = mode & 2, res_f32 = mode & 4;
  const DType yt = alias ? xt : y_dtype;
  SCOPED_TRACE("dim " + std::to_string(dim) + " x " + name(xt) + " w " + name(wt) + " y " + name(yt) +
               " residual " + std::to_string(residual) + (res_f32 ? " (F32)" : "") + " alias " + std::to_string(alias));
  Rng rng(seed);
  TypedBuffer x = TypedBuffer::from(xt, random_vector(size_t(rows * ldx), rng, -3, 3));
  TypedBuffer r = TypedBuffer::from(res_f32 ? DType::F32 : xt, random_vector(size_t(rows * ldr), rng, -3, 3));
  TypedBuffer w = TypedBuffer::from(wt, random_vector(size_t(dim), rng, -1, 1));
  // Poisoned (finite, so the rows' padding, which neither side writes, compares equal).
  TypedBuffer y = TypedBuffer::from(yt, std::vector<float>(size_t(rows * ldy), -7.25f));
  Dev dx = Dev::of(x), dr = Dev::of(r), dw = Dev::of(w), dy = Dev::of(y);
  ops::RmsNormParams p;
  p.x = x.data();
  p.x_dtype = xt;
  p.residual = residual ? r.data() : nullptr;
  p.ldr = ldr;
  p.residual_f32 = res_f32;
  p.y = alias ? x.data() : y.data();
  p.y_dtype = yt;
  p.weight = w.data();
  p.weight_dtype = wt;
  p.rows = rows;
  p.dim = dim;
  p.ldx = ldx;
  p.ldy = alias ? ldx : ldy;
  p.eps = 1e-6f;
  p.gemma = gemma;
  cpu::run_rms_norm(p);
  p.x = dx.p();
  p.residual = residual ? dr.p() : nullptr;
  p.y = alias ? dx.p() : dy.p();
  p.weight = dw.p();
  ops::rms_norm(p, gpu_stream());
  const TypedBuffer& want = alias ? x : y;
  TypedBuffer got = fetch(alias ? dx : dy, yt, want.count);
  expect_elements_close(
      got, want, [&](double b) { return yt == DType::BF16 ? ulp_bf16(b) : 4e-7 * std::fabs(b); }, "y");
  if (residual) {
    EXPECT_EQ(dr.bytes(r.bytes.size()), r.bytes) << "stored residual sums differ";
  }
}

// Odd strides: the general kernel.
TEST(CudaRmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 40;
  for (int64_t dim : {1, 127, 256, 1000, 6144})
    for (DType xt : {DType::F32, DType::BF16})
      for (DType wt : {DType::F32, DType::BF16})
        for (int mode = 0; mode < 8; ++mode, ++seed)
          expect_rms_norm_matches_cpu(dim, xt, wt, dim % 2 ? DType::BF16 : DType::F32, mode, seed % 2, seed, 7,
                                      dim + 5, dim + 3, dim + 1);
}

// The register path (whole 128-groups, rows aligned for vector access: decode's norms); 8320 (65
// groups: more than the path takes) takes the general kernel.
TEST(CudaRmsNorm, RegisterPathMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 140;
  for (int64_t dim : {128, 768, 6144, 8192, 8320})
    for (DType xt : {DType::F32, DType::BF16})
      for (DType wt : {DType::F32, DType::BF16})
        for (int mode = 0; mode < 8; ++mode, ++seed)
          expect_rms_norm_matches_cpu(dim, xt, wt, seed % 3 == 0 ? DType::BF16 : DType::F32, mode, seed % 2, seed, 33,
                                      dim + 4, dim + 8, dim);
}

TEST(CudaAdd, Bitwise) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(7);
    const int64_t n = 100003;
    TypedBuffer y = TypedBuffer::from(t, random_vector(size_t(n), rng, -5, 5));
    TypedBuffer x = TypedBuffer::from(t, random_vector(size_t(n), rng, -5, 5));
    Dev dy = Dev::of(y), dx = Dev::of(x);
    ops::AddParams p;
    p.y = y.data();
    p.x = x.data();
    p.dtype = t;
    p.n = n;
    p.alpha = -0.7f;
    cpu::run_add(p);
    p.y = dy.p();
    p.x = dx.p();
    ops::add(p, gpu_stream());
    EXPECT_EQ(dy.bytes(y.bytes.size()), y.bytes) << name(t);
  }
}

// L2 prefetch writes nothing: ranges of every alignment and size (empty, under a line, over many
// lines, ending mid-line) leave device memory as it was, with the kernel before
// and after it in the stream; the budget follows the tuning field and the decode rule; a bad
// range count or a null range is an error that names the op.
TEST(CudaPrefetchL2, LeavesMemoryAsItWas) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  const size_t n = (3 << 20) + 77;
  std::vector<uint8_t> host(n);
  for (auto& b : host) b = uint8_t(rng.gen() >> 56);
  Dev d = Dev::of(host);
  const uint8_t* p = d.as<uint8_t>();
  ops::PrefetchL2Params pp;
  const std::pair<size_t, size_t> ranges[] = {{0, n}, {3, 0}, {5, 11}, {17, 33}, {1000, (1 << 20) + 3}, {n - 40, 40},
                                              {64, 32 << 10}, {7, (32 << 10) + 9}};
  for (auto [at, bytes] : ranges) {
    pp.ptr[pp.count] = p + at;
    pp.bytes[pp.count++] = bytes;
  }
  Dev other = Dev::of(random_vector(4096, rng, -1, 1));
  ops::AddParams twice;  // a kernel before and after the prefetch in the same stream
  twice.y = other.p();
  twice.x = other.p();
  twice.n = 4096;
  ops::add(twice, gpu_stream());
  ops::prefetch_l2(pp, gpu_stream());
  pp.count = 1;
  pp.bytes[0] = 8;
  ops::prefetch_l2(pp, gpu_stream());
  ops::add(twice, gpu_stream());
  EXPECT_EQ(d.bytes(n), host);

  cuda::Tuning t = cuda::tuning();
  t.launch.l2_prefetch_mib = 24;
  {
    cuda::TuningScope scope(t);
    EXPECT_EQ(ops::l2_prefetch_budget(32, gpu_stream()), size_t(24) << 20);
    EXPECT_EQ(ops::l2_prefetch_budget(8192, gpu_stream()), 0u);  // prefill steps: none
  }
  t.launch.l2_prefetch_mib = 0;
  {
    cuda::TuningScope scope(t);
    EXPECT_EQ(ops::l2_prefetch_budget(1, gpu_stream()), 0u);
  }
  pp.count = ops::PrefetchL2Params::kMaxRanges + 1;
  try {
    ops::prefetch_l2(pp, gpu_stream());
    ADD_FAILURE() << "no error for " << pp.count << " ranges";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefetch_l2"), std::string::npos) << e.what();
  }
  pp.count = 1;
  pp.ptr[0] = nullptr;
  pp.bytes[0] = 64;
  EXPECT_THROW(ops::prefetch_l2(pp, gpu_stream()), Error);
}

TEST(CudaSwigluOai, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::F32, DType::BF16}) {
    Rng rng(9);
    const int64_t rows = 9, inter = 129, ld_in = 2 * inter + 3, ld_out = inter + 2;
    TypedBuffer gu = TypedBuffer::from(t, random_vector(size_t(rows * ld_in), rng, -10, 10));
    TypedBuffer out(t, size_t(rows * ld_out));
    Dev dgu = Dev::of(gu), dout = Dev::of(out);
    ops::SwigluOaiParams p;
    p.gate_up = gu.data();
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
    p.gate_up = dgu.p();
    p.out = dout.p();
    ops::swiglu_oai(p, gpu_stream());
    TypedBuffer got = fetch(dout, t, out.count);
    // expf may differ by 2 ulp.
    expect_elements_close(
        got, out, [&](double b) { return t == DType::BF16 ? ulp_bf16(b) : 1e-6 * std::fabs(b) + 1e-7; },
        name(t) + " out");
  }
}

// ---------------------------------------------------------------------------------------------
// moe_route

// ids: the CPU's, except that at a rank the GPU may pick another expert whose biased score is
// within 1e-6 of the CPU's pick there (expf differs by ulps); weights within 1e-5 relative.
// `exact`: the scores are exactly equal on both sides (ties), ids must match exactly.
void gpu_route_case(int64_t T, int E, int K, bool bias, bool renorm, bool ties, uint64_t seed) {
  SCOPED_TRACE("T " + std::to_string(T) + " E " + std::to_string(E) + " K " + std::to_string(K) + " bias " +
               std::to_string(bias) + " renorm " + std::to_string(renorm) + " ties " + std::to_string(ties));
  Rng rng(seed);
  std::vector<float> logits(static_cast<size_t>(T * E)), b(static_cast<size_t>(E));
  for (auto& v : logits) v = ties ? float(rng.uniform_int(-1, 1)) : rng.normal(2.0f);
  for (auto& v : b) v = ties ? 0.25f * float(rng.uniform_int(0, 1)) : rng.uniform(-0.5f, 0.5f);
  std::vector<int32_t> ids(size_t(T * K), -7);
  std::vector<float> w(size_t(T * K), kNaN);
  ops::MoeRouteParams p;
  p.logits = logits.data();
  p.bias = bias ? b.data() : nullptr;
  p.num_tokens = T;
  p.num_experts = E;
  p.topk = K;
  p.renormalize = renorm;
  p.scaling = 2.5f;
  p.ids = ids.data();
  p.weights = w.data();
  cpu::run_moe_route(p);
  Dev dl = Dev::of(logits), db = Dev::of(b), di = Dev::of(std::vector<int32_t>(ids.size(), -7)),
      dw = Dev::of(std::vector<float>(w.size(), kNaN));
  p.logits = dl.as<float>();
  p.bias = bias ? db.as<float>() : nullptr;
  p.ids = di.as<int32_t>();
  p.weights = dw.as<float>();
  ops::moe_route(p, gpu_stream());
  std::vector<int32_t> gi = di.get<int32_t>(ids.size());
  std::vector<float> gw = dw.get<float>(w.size());
  int bad = 0;
  for (int64_t t = 0; t < T && bad < 5; ++t) {
    bool same = true;
    for (int j = 0; j < K; ++j) {
      const size_t o = size_t(t * K + j);
      if (gi[o] == ids[o]) continue;
      same = false;
      auto score = [&](int e) {
        const double s = 1.0 / (1.0 + std::exp(-double(logits[size_t(t * E + e)])));
        return s + (bias ? b[size_t(e)] : 0.0);
      };
      if (ties || gi[o] < 0 || gi[o] >= E || std::fabs(score(gi[o]) - score(ids[o])) > 1e-6) {
        ADD_FAILURE() << "token " << t << " rank " << j << ": gpu expert " << gi[o] << " cpu " << ids[o];
        ++bad;
      }
    }
    if (!same) continue;
    for (int j = 0; j < K; ++j) {
      const size_t o = size_t(t * K + j);
      if (!close(gw[o], w[o], 1e-7, 1e-5)) {
        ADD_FAILURE() << "token " << t << " rank " << j << ": gpu weight " << gw[o] << " cpu " << w[o];
        ++bad;
      }
    }
  }
}

TEST(CudaMoeRoute, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 70;
  for (int E : {8, 33, 128, 256, 1024}) {
    for (int K : {1, 2, 4, 8}) {
      if (K > E) continue;
      for (int v = 0; v < 4; ++v) gpu_route_case(37, E, K, v & 1, v & 2, false, seed++);
    }
  }
  gpu_route_case(5, 8, 8, true, true, false, seed++);  // every expert chosen
}

TEST(CudaMoeRoute, TiesGoToTheLowerExpertId) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 90;
  for (int E : {8, 64, 130}) {
    for (int K : {2, 4, 8}) {
      const bool bias = seed % 2;
      gpu_route_case(41, E, K, bias, true, true, seed++);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_experts

struct MoeCase {
  MoeCase() = default;
  MoeCase(int64_t t, int64_t h, int64_t i, int e, int k) : T(t), H(h), I(i), E(e), K(k) {}
  int64_t T = 5, H = 64, I = 32;
  int E = 8, K = 2;
  DType act = DType::F32, w = DType::BF16;
  int skipped = 0;  // ids per 16 that are -1 or >= E (not this rank's experts)
  int64_t chunk = 0;  // MoeTuning::chunk_tokens
  int hot = -1;       // every token routes to this expert first (tiles of one expert)
  bool simt = false;  // MoeTuning::force_simt: the fp32 SIMT products for BF16 weights too
  int tile_rows = 0;  // MoeTuning::tile_rows: 16 or 64-row tensor-core tiles (0: by the batch)
  bool out_bf16 = false;  // MoeExpertsParams::out_bf16: a bf16 out whatever act (the model's F32 x)
  DType out_dtype() const { return out_bf16 ? DType::BF16 : act; }
  // The tensor-core path: BF16 weights, hidden and inter multiples of 8.
  bool tensor_cores() const { return w == DType::BF16 && H % 8 == 0 && I % 8 == 0 && !simt; }
};

// The tensor-core path's own rounding, in double: out + sum over the token's experts of
// weight x down(SwiGLU(gate_up(x))) with x rounded to bf16 and SwiGLU's output rounded to bf16
// (from fp32 gate and up sums), as the kernels store them.
std::vector<double> moe_reference_bf16(const ops::MoeExpertsParams& p, const TypedBuffer& x, const TypedBuffer& out0,
                                       const std::vector<TypedBuffer>& gu, const std::vector<TypedBuffer>& down) {
  const int64_t T = p.num_tokens, H = p.hidden, I = p.inter;
  const int K = p.topk;
  std::vector<double> ref(size_t(T * H));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = out0.get(i);
  std::vector<double> xr(static_cast<size_t>(H));
  std::vector<double> act(static_cast<size_t>(I));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < H; ++k) xr[size_t(k)] = round_bf16(float(x.get(size_t(t * H + k))));
    for (int j = 0; j < K; ++j) {
      const int e = p.ids[t * K + j];
      if (e < 0 || e >= p.num_experts) continue;
      for (int64_t u = 0; u < I; ++u) {
        double g = 0, up = 0;
        for (int64_t k = 0; k < H; ++k) {
          g += xr[size_t(k)] * gu[size_t(e)].get(size_t(u * H + k));
          up += xr[size_t(k)] * gu[size_t(e)].get(size_t((I + u) * H + k));
        }
        const double gc = std::min(double(float(g)), double(p.limit));
        const double uc = std::clamp(double(float(up)), -double(p.limit), double(p.limit));
        act[size_t(u)] = round_bf16(float(gc / (1.0 + std::exp(-double(p.alpha) * gc)) * (uc + double(p.beta))));
      }
      for (int64_t d = 0; d < H; ++d) {
        double yv = 0;
        for (int64_t u = 0; u < I; ++u) yv += act[size_t(u)] * down[size_t(e)].get(size_t(d * I + u));
        ref[size_t(t * H + d)] += double(p.weights[t * K + j]) * yv;
      }
    }
  }
  return ref;
}

void gpu_moe_case(const MoeCase& c, uint64_t seed) {
  SCOPED_TRACE("T " + std::to_string(c.T) + " H " + std::to_string(c.H) + " I " + std::to_string(c.I) + " E " +
               std::to_string(c.E) + " K " + std::to_string(c.K) + " act " + name(c.act) + " w " + name(c.w) +
               " chunk " + std::to_string(c.chunk) + " hot " + std::to_string(c.hot) + " out " + name(c.out_dtype()) +
               (c.tensor_cores() ? " tensor cores, tiles of " + std::to_string(c.tile_rows) + " rows" : " simt"));
  Rng rng(seed);
  const int64_t T = c.T, H = c.H, I = c.I;
  const int E = c.E, K = c.K;
  TypedBuffer x = TypedBuffer::from(c.act, random_vector(size_t(T * H), rng, -1, 1));
  TypedBuffer out = TypedBuffer::from(c.out_dtype(), random_vector(size_t(T * H), rng, -2, 2));
  std::vector<TypedBuffer> gu, down;
  for (int e = 0; e < E; ++e) {
    gu.push_back(TypedBuffer::from(c.w, random_vector(size_t(2 * I * H), rng, -0.2f, 0.2f)));
    down.push_back(TypedBuffer::from(c.w, random_vector(size_t(H * I), rng, -0.2f, 0.2f)));
  }
  std::vector<int32_t> ids(size_t(T * K));
  std::vector<float> weights(size_t(T * K));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
    for (int e = E - 1; e > 0; --e) std::swap(perm[size_t(e)], perm[size_t(rng.uniform_int(0, e))]);
    if (c.hot >= 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), c.hot));
    for (int j = 0; j < K; ++j) {
      int32_t id = perm[size_t(j)];
      if (c.skipped && rng.uniform_int(0, 15) < c.skipped) id = rng.uniform_int(0, 1) ? -1 : E + j;
      ids[size_t(t * K + j)] = id;
      weights[size_t(t * K + j)] = rng.uniform(0.05f, 1.0f);
    }
  }
  std::vector<const void*> gu_h, down_h;
  for (int e = 0; e < E; ++e) {
    gu_h.push_back(gu[size_t(e)].data());
    down_h.push_back(down[size_t(e)].data());
  }
  ops::MoeExpertsParams p;
  p.x = x.data();
  p.act_dtype = c.act;
  p.num_tokens = T;
  p.hidden = H;
  p.inter = I;
  p.num_experts = E;
  p.topk = K;
  p.ids = ids.data();
  p.weights = weights.data();
  p.w_gate_up = gu_h.data();
  p.w_down = down_h.data();
  p.w_dtype = c.w;
  p.out_bf16 = c.out_bf16;
  Dev dout = Dev::of(out);
  const std::vector<double> ref = c.tensor_cores() ? moe_reference_bf16(p, x, out, gu, down) : std::vector<double>{};
  p.out = out.data();
  cpu::run_moe_experts(p);

  std::vector<Dev> dgu, ddown;
  std::vector<const void*> gu_d, down_d;
  for (int e = 0; e < E; ++e) {
    dgu.push_back(Dev::of(gu[size_t(e)]));
    ddown.push_back(Dev::of(down[size_t(e)]));
    gu_d.push_back(dgu.back().p());
    down_d.push_back(ddown.back().p());
  }
  Dev dx = Dev::of(x), dids = Dev::of(ids), dw = Dev::of(weights), dgup = Dev::of(gu_d), ddp = Dev::of(down_d);
  p.x = dx.p();
  p.ids = dids.as<int32_t>();
  p.weights = dw.as<float>();
  p.w_gate_up = dgup.as<const void*>();
  p.w_down = ddp.as<const void*>();
  p.out = dout.p();
  {
    cuda::Tuning t;
    t.moe.chunk_tokens = c.chunk;
    t.moe.force_simt = c.simt;
    t.moe.tile_rows = c.tile_rows;
    cuda::TuningScope scope(t);
    ops::moe_experts(p, gpu_stream());
  }
  TypedBuffer got = fetch(dout, c.out_dtype(), out.count);
  int bad = 0;
  for (size_t i = 0; i < out.count && bad < 5; ++i) {
    const double a = got.get(i), b = c.tensor_cores() ? ref[i] : out.get(i);
    // SIMT: fp32 on both sides, the dot products' sums differ in order only. Tensor cores:
    // against the same roundings in double; 1e-3 leaves room for an intermediate value that
    // rounds to the other bf16 neighbour (fp32 sums in another order), far below what a wrong
    // row, column or k step gives.
    const double tol = (c.tensor_cores() ? 1e-3 : 2e-5) * (1 + std::fabs(b)) + (c.out_dtype() == DType::BF16 ? ulp_bf16(b) : 0.0);
    if (std::fabs(a - b) <= tol) continue;
    ADD_FAILURE() << "out[" << i / size_t(H) << "," << i % size_t(H) << "] gpu " << a << (c.tensor_cores() ? " ref " : " cpu ") << b;
    ++bad;
  }
}

TEST(CudaMoeExperts, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  std::vector<MoeCase> cases;
  for (DType act : {DType::F32, DType::BF16}) {
    for (DType w : {DType::BF16, DType::F32}) {
      MoeCase c;
      c.act = act;
      c.w = w;
      cases.push_back(c);  // T 5, H 64, I 32
      c.T = 1;
      c.K = 1;
      cases.push_back(c);
      MoeCase wide(70, 100, 70, 16, 4);
      wide.act = act;
      wide.w = w;
      wide.skipped = 3;
      cases.push_back(wide);
    }
  }
  MoeCase c(300, 129, 33, 4, 2);
  c.hot = 2;  // 300 rows of expert 2: five 64-row tiles, the last partial
  cases.push_back(c);
  c.chunk = 7;  // several chunks, the last one short
  cases.push_back(c);
  c = MoeCase(33, 256, 128, 128, 8);  // the bundled model's sizes, 128 experts
  cases.push_back(c);
  c.simt = true;
  cases.push_back(c);
  // Tensor cores: 150 rows of one expert (three tiles, the last partial), k tails (inter 40:
  // one 32-wide step and a partial one), several chunks; units and columns past a 128-wide tile.
  c = MoeCase(150, 136, 40, 4, 2);
  c.hot = 2;
  cases.push_back(c);
  c.act = DType::BF16;
  c.chunk = 7;
  cases.push_back(c);
  c = MoeCase(70, 200, 72, 16, 4);
  c.skipped = 3;
  cases.push_back(c);
  c.simt = true;
  cases.push_back(c);
  // Units past a 64-unit block with bf16 rows (inter 264), a 64-wide k tail (hidden 520).
  c = MoeCase(40, 136, 264, 8, 2);
  c.act = DType::BF16;
  c.hot = 3;
  cases.push_back(c);
  cases.push_back(MoeCase(3, 520, 72, 64, 4));
  // fp32 x into a bf16 out (the model's MoE layers on CUDA), on tensor cores and SIMT, chunked.
  c = MoeCase(33, 256, 128, 128, 8);
  c.out_bf16 = true;
  cases.push_back(c);
  c.chunk = 7;
  cases.push_back(c);
  c.simt = true;
  cases.push_back(c);
  // Every tensor-core case in both tile sizes: 16 rows (small batches) and 64.
  for (const MoeCase& mc : cases) {
    if (!mc.tensor_cores()) {
      gpu_moe_case(mc, seed++);
      continue;
    }
    for (int rows : {16, 64}) {
      MoeCase t = mc;
      t.tile_rows = rows;
      gpu_moe_case(t, seed++);
    }
  }
}

}  // namespace
}  // namespace sieve
