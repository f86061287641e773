// CPU reference ops of the attention path (qkv_norm_rope_cache, attention, indexer,
// select_topk_blocks) against plain, independent implementations written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"

namespace sieve {
namespace {

using namespace sieve::test;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string dt(DType t) { return std::string(dtype_name(t)); }

// ---------------------------------------------------------------------------------------------
// Plain references.

// Gemma RMSNorm then NeoX partial RoPE, in double.
std::vector<double> ref_norm_rope(const float* x, int dim, const TypedBuffer& w, double eps,
                                  const float* cs, int rotary_dim) {
  double ms = 0;
  for (int d = 0; d < dim; ++d) ms += double(x[d]) * x[d];
  ms /= dim;
  std::vector<double> y(static_cast<size_t>(dim));
  for (int d = 0; d < dim; ++d) y[size_t(d)] = double(x[d]) / std::sqrt(ms + eps) * (1.0 + w.get(size_t(d)));
  int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    double a = y[size_t(j)], b = y[size_t(j + half)], c = cs[j], s = cs[half + j];
    y[size_t(j)] = a * c - b * s;
    y[size_t(j + half)] = b * c + a * s;
  }
  return y;
}

// Naive softmax attention of one query row over an explicit key list.
std::vector<double> ref_attend(const std::vector<double>& q, const std::vector<std::vector<double>>& K,
                               const std::vector<std::vector<double>>& V, double scale) {
  std::vector<double> out(q.size(), 0.0);
  if (K.empty()) return out;
  std::vector<double> l(K.size());
  for (size_t j = 0; j < K.size(); ++j) {
    double dot = 0;
    for (size_t d = 0; d < q.size(); ++d) dot += q[d] * K[j][d];
    l[j] = dot * scale;
  }
  double m = *std::max_element(l.begin(), l.end()), sum = 0;
  for (auto& x : l) sum += (x = std::exp(x - m));
  for (size_t j = 0; j < K.size(); ++j) {
    for (size_t d = 0; d < q.size(); ++d) out[d] += l[j] / sum * V[j][d];
  }
  return out;
}

// Top-k by (score desc, id asc), NaN as -1e30, -1 padded.
std::vector<int32_t> ref_topk(std::vector<float> scores, int topk) {
  for (auto& s : scores) {
    if (std::isnan(s)) s = -1e30f;
  }
  std::vector<int32_t> ids(scores.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  ids.resize(size_t(std::min<size_t>(ids.size(), size_t(topk))));
  ids.resize(size_t(topk), -1);
  return ids;
}

// ---------------------------------------------------------------------------------------------
// select_topk_blocks

TEST(CpuSelectTopk, MatchesStableSortWithTiesNanAndPadding) {
  Rng rng(11);
  const float vals[] = {-1e30f, -kInf, 0.0f, -0.0f, 1.0f, 2.0f, 1e29f, 1e30f, kNaN, 0.5f};
  for (int n : {0, 1, 2, 5, 15, 16, 17, 100}) {
    for (int topk : {1, 4, 16, 17}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> s(static_cast<size_t>(n));
        for (auto& x : s) x = vals[rng.uniform_int(0, 9)];
        std::vector<int32_t> got(size_t(topk), -7);
        cpu::select_topk_blocks(s.data(), n, topk, got.data());
        EXPECT_EQ(got, ref_topk(s, topk)) << "n=" << n << " topk=" << topk;
      }
    }
  }
  // Exact example: ties to the lower id, forced first, left-packed, -1 padded.
  std::vector<float> s = {3, 1e29f, 3, 5, 1e30f};
  std::vector<int32_t> got(7, -7);
  cpu::select_topk_blocks(s.data(), 5, 7, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{4, 1, 3, 0, 2, -1, -1}));
}

// ---------------------------------------------------------------------------------------------
// qkv_norm_rope_cache

struct QkvCase {
  DType kv_dtype = DType::BF16;
  DType ic_dtype = DType::BF16;
  DType act_dtype = DType::F32;
  bool has_index = true;
  bool norm_rope_index = true;
  bool index_cache = true;
  int block_size = 32;
};

void run_qkv_case(const QkvCase& c, uint64_t seed) {
  SCOPED_TRACE("kv=" + dt(c.kv_dtype) + " ic=" + dt(c.ic_dtype) + " act=" + dt(c.act_dtype) +
               " index=" + std::to_string(c.has_index) + " nri=" + std::to_string(c.norm_rope_index));
  Rng rng(seed);
  const QkvLayout l = QkvLayout::make(4, 2, 64, c.has_index ? 2 : 0, c.has_index ? 48 : 0, 32, 3);
  const QkvWeights w = QkvWeights::make(l, 400, rng);
  PagedBatch b = make_paged_batch({{0, 1}, {0, 129}, {127, 1}, {296, 4}, {5, 3}}, c.block_size, rng);
  const int64_t T = b.num_tokens;
  // Some tokens are not written (slot < 0).
  b.slot_mapping[3] = -1;
  b.slot_mapping[size_t(T - 1)] = -1;

  std::vector<float> in = random_vector(size_t(T * l.row_stride), rng, -3.0f, 3.0f);
  // Token 0: v head 1 all zero (fp8 scale 1); token 1: large v (scale > 1).
  for (int d = 0; d < l.head_dim; ++d) {
    in[size_t(l.v_offset + l.head_dim + d)] = 0.0f;
    in[size_t(l.row_stride + l.v_offset + d)] *= 400.0f;
  }
  TypedBuffer qkv = TypedBuffer::from(c.act_dtype, in);
  std::vector<float> orig(in.size());
  for (size_t i = 0; i < in.size(); ++i) orig[i] = qkv.get(i);

  KvCache kv(c.kv_dtype, b.num_blocks, c.block_size, l.num_kv_heads, l.head_dim);
  IndexCache ic(c.ic_dtype, b.num_blocks, c.block_size, std::max(l.index_dim, 1));
  auto p = make_qkv_params(l, w, qkv.data(), c.act_dtype, T, b.positions.data(),
                           b.slot_mapping.data(), kv, c.has_index && c.index_cache ? &ic : nullptr);
  p.norm_rope_index = c.has_index && c.norm_rope_index;
  cpu::run_qkv_norm_rope_cache(p);

  const bool act_bf16 = c.act_dtype == DType::BF16;
  const double act_rtol = act_bf16 ? 1.0 / 256 : 2e-6, act_atol = act_bf16 ? 1e-6 : 2e-6;
  std::set<int64_t> written;
  for (int64_t t = 0; t < T; ++t) {
    const int pos = b.positions[size_t(t)];
    const float* cs = w.cos_sin.data() + size_t(pos) * l.rotary_dim;
    const size_t row = size_t(t * l.row_stride);
    auto col = [&](int64_t c0) { return &orig[row + size_t(c0)]; };
    std::vector<char> checked(size_t(l.row_stride), 0);
    auto expect_head = [&](int64_t off, int dim, const TypedBuffer& nw, const char* what) {
      auto ref = ref_norm_rope(col(off), dim, nw, 1e-6, cs, l.rotary_dim);
      for (int d = 0; d < dim; ++d) {
        float got = qkv.get(row + size_t(off + d));
        EXPECT_TRUE(close(got, ref[size_t(d)], act_atol, act_rtol))
            << what << " t=" << t << " d=" << d << " got " << got << " want " << ref[size_t(d)];
        checked[size_t(off + d)] = 1;
      }
    };
    for (int h = 0; h < l.num_q_heads; ++h) expect_head(l.q_offset + h * l.head_dim, l.head_dim, w.q_norm, "q");
    if (p.norm_rope_index) {
      for (int h = 0; h < l.num_index_heads; ++h) {
        expect_head(l.index_q_offset + h * l.index_dim, l.index_dim, w.index_q_norm, "index_q");
      }
    }
    // Everything else in the row (k, v, index_k, untouched index_q, padding) is unchanged.
    for (int64_t c0 = 0; c0 < l.row_stride; ++c0) {
      if (checked[size_t(c0)]) continue;
      ASSERT_EQ(f32_bits(qkv.get(row + size_t(c0))), f32_bits(orig[row + size_t(c0)])) << "t=" << t << " col=" << c0;
    }

    const int64_t slot = b.slot_mapping[size_t(t)];
    if (slot < 0) continue;
    written.insert(slot);
    for (int h = 0; h < l.num_kv_heads; ++h) {
      // k: normed + roped, rounded by the cache.
      auto kref = ref_norm_rope(col(l.k_offset + h * l.head_dim), l.head_dim, w.k_norm, 1e-6, cs, l.rotary_dim);
      double amax = 0;
      for (double x : kref) amax = std::max(amax, std::fabs(x));
      const float ks = kv.scale_k(slot, h);
      if (c.kv_dtype == DType::FP8_E4M3) {
        EXPECT_TRUE(close(ks, amax / 448.0, 0, 1.0 / 128)) << "k scale t=" << t << " h=" << h;
      }
      for (int d = 0; d < l.head_dim; ++d) {
        float got = kv.read_k(slot, h, d);
        double want = kref[size_t(d)];
        double atol = 2e-6, rtol = 2e-6;
        if (c.kv_dtype == DType::BF16) rtol = 1.0 / 256;
        if (c.kv_dtype == DType::FP8_E4M3) { rtol = 1.0 / 16 + 1.0 / 256; atol = ks / 512.0; }
        EXPECT_TRUE(close(got, want, atol, rtol)) << "k t=" << t << " h=" << h << " d=" << d << " got " << got << " want " << want;
      }
      // v: raw, exact storage rule.
      const float* vx = col(l.v_offset + h * l.head_dim);
      float vmax = 0;
      for (int d = 0; d < l.head_dim; ++d) vmax = std::max(vmax, std::fabs(round_bf16(vx[d])));
      const float vs = c.kv_dtype == DType::FP8_E4M3 ? (vmax == 0 ? 1.0f : vmax / 448.0f) : 1.0f;
      if (c.kv_dtype == DType::FP8_E4M3) {
        EXPECT_EQ(kv.scale_v(slot, h), vs) << "v scale t=" << t << " h=" << h;
        if (t == 0 && h == 1) {
          EXPECT_EQ(kv.scale_v(slot, h), 1.0f);
        }
      }
      for (int d = 0; d < l.head_dim; ++d) {
        float stored = kv.v.get(kv.row(slot, h) * l.head_dim + d);
        float want = c.kv_dtype == DType::F32    ? vx[d]
                     : c.kv_dtype == DType::BF16 ? round_bf16(vx[d])
                                                 : round_fp8e4m3(round_bf16(vx[d]) / vs);
        ASSERT_EQ(f32_bits(stored), f32_bits(want)) << "v t=" << t << " h=" << h << " d=" << d;
      }
    }
    if (p.norm_rope_index && c.index_cache) {
      auto ikref = ref_norm_rope(col(l.index_k_offset), l.index_dim, w.index_k_norm, 1e-6, cs, l.rotary_dim);
      for (int d = 0; d < l.index_dim; ++d) {
        float got = ic.read(slot, d);
        double want = ikref[size_t(d)];
        double atol = 2e-6, rtol = 2e-6;
        if (c.ic_dtype == DType::BF16) rtol = 1.0 / 256;
        if (c.ic_dtype == DType::FP8_E4M3) { rtol = 1.0 / 16 + 1.0 / 256; atol = 1.0 / 1024; }
        EXPECT_TRUE(close(got, want, atol, rtol)) << "index_k t=" << t << " d=" << d << " got " << got << " want " << want;
      }
    }
  }
  // Nothing else in the caches was written.
  const bool index_written = p.norm_rope_index && c.index_cache;
  for (int64_t slot = 0; slot < b.num_blocks * c.block_size; ++slot) {
    if (!written.count(slot)) {
      for (int h = 0; h < l.num_kv_heads; ++h) {
        for (int d = 0; d < l.head_dim; ++d) {
          ASSERT_TRUE(std::isnan(kv.k.get(kv.row(slot, h) * l.head_dim + d))) << "k slot " << slot;
          ASSERT_TRUE(std::isnan(kv.v.get(kv.row(slot, h) * l.head_dim + d))) << "v slot " << slot;
        }
        if (c.kv_dtype == DType::FP8_E4M3) {
          ASSERT_TRUE(std::isnan(kv.k_scale[kv.row(slot, h)]));
          ASSERT_TRUE(std::isnan(kv.v_scale[kv.row(slot, h)]));
        }
      }
    }
    if (!written.count(slot) || !index_written) {
      for (int d = 0; d < ic.index_dim; ++d) ASSERT_TRUE(std::isnan(ic.read(slot, d))) << "index slot " << slot;
    }
  }
}

TEST(CpuQkvNormRopeCache, F32Caches) { run_qkv_case({DType::F32, DType::F32}, 1); }
TEST(CpuQkvNormRopeCache, Bf16Caches) { run_qkv_case({DType::BF16, DType::BF16}, 2); }
TEST(CpuQkvNormRopeCache, Fp8Caches) { run_qkv_case({DType::FP8_E4M3, DType::FP8_E4M3}, 3); }
TEST(CpuQkvNormRopeCache, MixedCaches) {
  run_qkv_case({DType::FP8_E4M3, DType::BF16}, 4);
  run_qkv_case({DType::BF16, DType::FP8_E4M3, DType::F32, true, true, true, 128}, 5);
}
TEST(CpuQkvNormRopeCache, Bf16Activations) { run_qkv_case({DType::BF16, DType::BF16, DType::BF16}, 6); }
TEST(CpuQkvNormRopeCache, NoIndexBranch) { run_qkv_case({DType::BF16, DType::BF16, DType::F32, false}, 7); }
TEST(CpuQkvNormRopeCache, SharedTopkLayerLeavesIndexAlone) {
  run_qkv_case({DType::BF16, DType::BF16, DType::F32, true, false}, 8);
}
TEST(CpuQkvNormRopeCache, NoIndexCacheStillNormsIndexQ) {
  run_qkv_case({DType::BF16, DType::BF16, DType::F32, true, true, false}, 9);
}

TEST(CpuQkvNormRopeCache, Fp8ScaleIsAmaxOver448) {
  // One token, one kv head, head_dim 4, no RoPE: v stored with scale amax(round_bf16(v))/448.
  const QkvLayout l = QkvLayout::make(1, 1, 4, 0, 0, 0);
  Rng rng(1);
  QkvWeights w = QkvWeights::make(l, 1, rng);
  std::vector<float> qkv = {1, 2, 3, 4, /*k*/ 0, 0, 0, 0, /*v*/ 1.0f, -3.0f, 0.5f, 2.0f};
  KvCache kv(DType::FP8_E4M3, 1, 4, 1, 4);
  std::vector<int32_t> pos = {0};
  std::vector<int64_t> slot = {2};
  auto p = make_qkv_params(l, w, qkv.data(), DType::F32, 1, pos.data(), slot.data(), kv, nullptr);
  cpu::run_qkv_norm_rope_cache(p);
  EXPECT_EQ(kv.scale_v(2, 0), 3.0f / 448.0f);
  EXPECT_EQ(kv.v.get(kv.row(2, 0) * 4 + 1), -448.0f);
  EXPECT_NEAR(kv.read_v(2, 0, 0), 1.0f, 1.0f / 16);
  EXPECT_EQ(kv.scale_k(2, 0), 1.0f);  // k is all zero (normed zero vector): scale 1
  for (int d = 0; d < 4; ++d) EXPECT_EQ(kv.read_k(2, 0, d), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// attention

struct AttnCase {
  DType kv_dtype = DType::F32;
  int block_size = 16;
  std::vector<SeqSpec> seqs;
  int nq = 4, nkv = 2, hd = 32;
  bool sparse = false;  // random topk_idx (padding, duplicates, blocks past the query's own)
  int topk = 3;
  DType q_dtype = DType::F32, out_dtype = DType::F32;
  bool fill_with_op = false;
  float amp = 1.0f;
};

const std::vector<SeqSpec> kMixedSeqs = {{0, 1},   {0, 127}, {0, 128}, {0, 129}, {127, 1},
                                         {128, 1}, {296, 4}, {200, 100}, {17, 5}};

void run_attention_case(const AttnCase& c, uint64_t seed) {
  SCOPED_TRACE("kv=" + dt(c.kv_dtype) + " bs=" + std::to_string(c.block_size) +
               " sparse=" + std::to_string(c.sparse) + " seed=" + std::to_string(seed));
  Rng rng(seed);
  PagedBatch b = make_paged_batch(c.seqs, c.block_size, rng);
  KvCache kv(c.kv_dtype, b.num_blocks, c.block_size, c.nkv, c.hd);
  if (c.fill_with_op) {
    QkvLayout l = QkvLayout::make(c.nq, c.nkv, c.hd, 0, 0, c.hd / 2);
    QkvWeights w = QkvWeights::make(l, b.max_seq_len, rng);
    fill_caches_with_op(b, l, w, kv, nullptr, rng, c.amp);
  } else {
    fill_caches_random(b, &kv, nullptr, rng, c.amp);
  }
  const int64_t T = b.num_tokens;
  const int64_t q_stride = int64_t(c.nq) * c.hd + 5, out_stride = int64_t(c.nq) * c.hd + 3;
  TypedBuffer q = TypedBuffer::from(c.q_dtype, random_vector(size_t(T * q_stride), rng, -2.0f, 2.0f));
  TypedBuffer out(c.out_dtype, size_t(T * out_stride));
  std::vector<int32_t> topk;
  if (c.sparse) {
    topk.resize(size_t(T * c.nkv * c.topk));
    for (int64_t t = 0; t < T; ++t) {
      const int own = b.positions[size_t(t)] / c.block_size;
      for (int g = 0; g < c.nkv; ++g) {
        int32_t* row = &topk[size_t((t * c.nkv + g) * c.topk)];
        const int kind = rng.uniform_int(0, 5);
        for (int e = 0; e < c.topk; ++e) {
          int r = rng.uniform_int(0, 9);
          row[e] = r < 2 ? -1 : r < 3 ? own + 1 : rng.uniform_int(0, own);
          if (kind == 0) row[e] = -1;                  // empty selection
          if (kind == 1 && e == 0) row[e] = own;       // own block first
          if (kind == 2 && e == 1) row[e] = row[0];    // a duplicate next to other blocks
        }
      }
    }
  }
  ops::AttentionParams p;
  p.q = q.data();
  p.q_dtype = c.q_dtype;
  p.q_stride = q_stride;
  p.out = out.data();
  p.out_dtype = c.out_dtype;
  p.out_stride = out_stride;
  p.num_q_heads = c.nq;
  p.num_kv_heads = c.nkv;
  p.head_dim = c.hd;
  p.sm_scale = 1.0f / std::sqrt(float(c.hd));
  p.kv = kv.view();
  p.batch = b.view();
  p.topk_idx = c.sparse ? topk.data() : nullptr;
  p.topk = c.sparse ? c.topk : 0;
  cpu::run_attention(p);

  const int group = c.nq / c.nkv;
  for (int64_t t = 0; t < T; ++t) {
    const int s = b.token_seq[size_t(t)], pos = b.positions[size_t(t)];
    for (int g = 0; g < c.nkv; ++g) {
      // The sequence's keys in logical order, filtered by the selection.
      std::set<int> blocks;
      if (c.sparse) {
        for (int e = 0; e < c.topk; ++e) blocks.insert(topk[size_t((t * c.nkv + g) * c.topk + e)]);
      }
      std::vector<std::vector<double>> K, V;
      for (int j = 0; j <= pos; ++j) {
        if (c.sparse && !blocks.count(j / c.block_size)) continue;
        std::vector<double> kr(size_t(c.hd)), vr(size_t(c.hd));
        for (int d = 0; d < c.hd; ++d) {
          kr[size_t(d)] = kv.read_k(b.slot(s, j), g, d);
          vr[size_t(d)] = kv.read_v(b.slot(s, j), g, d);
        }
        K.push_back(kr);
        V.push_back(vr);
      }
      for (int h = g * group; h < (g + 1) * group; ++h) {
        std::vector<double> qv(size_t(c.hd));
        for (int d = 0; d < c.hd; ++d) qv[size_t(d)] = q.get(size_t(t * q_stride + h * c.hd + d));
        auto ref = ref_attend(qv, K, V, double(p.sm_scale));
        for (int d = 0; d < c.hd; ++d) {
          const float got = out.get(size_t(t * out_stride + h * c.hd + d));
          const double rtol = c.out_dtype == DType::BF16 ? 1.0 / 256 : 1e-6;
          ASSERT_TRUE(close(got, ref[size_t(d)], 1e-6, rtol))
              << "t=" << t << " h=" << h << " d=" << d << " got " << got << " want " << ref[size_t(d)];
        }
      }
    }
    for (int64_t c0 = int64_t(c.nq) * c.hd; c0 < out_stride; ++c0) {
      ASSERT_TRUE(std::isnan(out.get(size_t(t * out_stride + c0)))) << "padding written";
    }
  }
}

TEST(CpuAttention, DenseF32) { run_attention_case({DType::F32, 16, kMixedSeqs}, 21); }
TEST(CpuAttention, DenseBf16Block128FilledByOp) {
  AttnCase c{DType::BF16, 128, kMixedSeqs, 8, 2, 64};
  c.fill_with_op = true;
  run_attention_case(c, 22);
}
TEST(CpuAttention, DenseFp8) {
  AttnCase c{DType::FP8_E4M3, 16, kMixedSeqs};
  c.amp = 20.0f;
  run_attention_case(c, 23);
}
TEST(CpuAttention, DenseGqaOneKvHead) { run_attention_case({DType::BF16, 32, {{0, 1}, {40, 9}, {3, 128}}, 3, 1, 16}, 24); }
TEST(CpuAttention, Bf16QueryAndOutput) {
  AttnCase c{DType::BF16, 16, {{0, 129}, {299, 1}}};
  c.q_dtype = DType::BF16;
  c.out_dtype = DType::BF16;
  run_attention_case(c, 25);
}
TEST(CpuAttention, SparseF32) {
  AttnCase c{DType::F32, 16, kMixedSeqs};
  c.sparse = true;
  run_attention_case(c, 26);
}
TEST(CpuAttention, SparseFp8Block128) {
  AttnCase c{DType::FP8_E4M3, 128, kMixedSeqs};
  c.sparse = true;
  c.topk = 2;
  run_attention_case(c, 27);
}
TEST(CpuAttention, RandomBatches) {
  for (uint64_t seed = 90; seed < 94; ++seed) {
    Rng rng(seed);
    AttnCase c{seed % 2 ? DType::FP8_E4M3 : DType::BF16, 16, random_seq_specs(6, 200, rng)};
    c.sparse = seed >= 92;
    run_attention_case(c, seed);
  }
}
TEST(CpuAttention, SparseBf16ManyBlocks) {
  AttnCase c{DType::BF16, 8, {{0, 60}, {250, 50}}};
  c.sparse = true;
  c.topk = 5;
  run_attention_case(c, 28);
}

// ---------------------------------------------------------------------------------------------
// indexer

struct IdxCase {
  DType cache_dtype = DType::F32;
  int block_size = 16;
  std::vector<SeqSpec> seqs;
  int heads = 2, dim = 32;
  int topk = 4, init = 0, local = 1;
  bool q_in_cache_dtype = false;
  bool grid = true;        // values on a 1/8 grid: exact dot products, many exact ties
  bool duplicates = true;  // copy block 1's keys into block 2 (exact tie between real blocks)
  bool nan_keys = false;
  DType q_dtype = DType::F32;
};

struct IdxResult {
  std::vector<int32_t> topk;
  std::vector<float> scores;
};

IdxResult run_indexer_case(const IdxCase& c, uint64_t seed, PagedBatch* batch_out = nullptr,
                           IndexCache** cache_out = nullptr) {
  SCOPED_TRACE("cache=" + dt(c.cache_dtype) + " bs=" + std::to_string(c.block_size) +
               " topk=" + std::to_string(c.topk) + " init=" + std::to_string(c.init) +
               " local=" + std::to_string(c.local) + " qcast=" + std::to_string(c.q_in_cache_dtype) +
               " seed=" + std::to_string(seed));
  Rng rng(seed);
  PagedBatch b = make_paged_batch(c.seqs, c.block_size, rng);
  auto* ic = new IndexCache(c.cache_dtype, b.num_blocks, c.block_size, c.dim);
  auto value = [&] { return c.grid ? rng.grid(8, 3) : rng.uniform(-1.0f, 1.0f); };
  for (int s = 0; s < b.num_seqs(); ++s) {
    const int len = b.seq_lens[size_t(s)];
    for (int pos = 0; pos < len; ++pos) {
      std::vector<float> x(size_t(c.dim));
      for (auto& v : x) v = value();
      if (c.duplicates && pos / c.block_size == 2) {
        // Block 2 repeats block 1 key for key.
        for (int d = 0; d < c.dim; ++d) x[size_t(d)] = ic->read(b.slot(s, pos - c.block_size), d);
      }
      if (c.nan_keys && pos / c.block_size == 1) x[0] = kNaN;             // whole block 1 NaN
      if (c.nan_keys && pos == 3 * c.block_size + 1) x[1] = kNaN;         // one key of block 3
      ic->write(b.slot(s, pos), x.data());
    }
  }
  const int64_t T = b.num_tokens;
  const int64_t q_stride = int64_t(c.heads) * c.dim + 7;
  std::vector<float> qv(size_t(T * q_stride));
  for (auto& v : qv) v = c.grid ? value() : rng.uniform(-1.0f, 1.0f);
  TypedBuffer q = TypedBuffer::from(c.q_dtype, qv);
  const int mbps = b.max_blocks_per_seq;
  IdxResult r;
  r.topk.assign(size_t(T * c.heads * c.topk), -7);
  r.scores.assign(size_t(T * c.heads * mbps), kNaN);

  ops::IndexerParams p;
  p.index_q = q.data();
  p.q_dtype = c.q_dtype;
  p.q_stride = q_stride;
  p.num_index_heads = c.heads;
  p.index_dim = c.dim;
  p.score_scale = float(1.0 / std::sqrt(double(c.dim)) * 1.4426950408889634);
  p.q_in_cache_dtype = c.q_in_cache_dtype;
  p.cache = ic->view();
  p.batch = b.view();
  p.topk = c.topk;
  p.init_blocks = c.init;
  p.local_blocks = c.local;
  p.topk_idx = r.topk.data();
  p.block_scores = r.scores.data();
  cpu::run_indexer(p);

  for (int64_t t = 0; t < T; ++t) {
    const int s = b.token_seq[size_t(t)], pos = b.positions[size_t(t)];
    const int n_blk = pos / c.block_size + 1;
    for (int h = 0; h < c.heads; ++h) {
      std::vector<double> qq(size_t(c.dim));
      for (int d = 0; d < c.dim; ++d) {
        float x = q.get(size_t(t * q_stride + h * c.dim + d));
        if (c.q_in_cache_dtype && c.cache_dtype == DType::BF16) x = round_bf16(x);
        if (c.q_in_cache_dtype && c.cache_dtype == DType::FP8_E4M3) x = round_fp8e4m3(round_bf16(x));
        qq[size_t(d)] = x;
      }
      // All token scores, then the max per block.
      std::vector<float> tok(size_t(pos + 1));
      for (int j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int d = 0; d < c.dim; ++d) dot += qq[size_t(d)] * double(ic->read(b.slot(s, j), d));
        float sc = float(dot) * p.score_scale;
        tok[size_t(j)] = std::isnan(sc) ? -1e30f : sc;
      }
      std::vector<float> blk(size_t(n_blk), -kInf);
      for (int j = 0; j <= pos; ++j) blk[size_t(j / c.block_size)] = std::max(blk[size_t(j / c.block_size)], tok[size_t(j)]);
      for (int bb = 0; bb < n_blk; ++bb) {
        if (bb < c.init) blk[size_t(bb)] = 1e30f;
        if (bb >= n_blk - c.local) blk[size_t(bb)] = 1e29f;
      }
      const float* got_scores = &r.scores[size_t((t * c.heads + h) * mbps)];
      for (int bb = 0; bb < mbps; ++bb) {
        const float want = bb < n_blk ? blk[size_t(bb)] : -kInf;
        EXPECT_EQ(f32_bits(got_scores[bb]), f32_bits(want)) << "score t=" << t << " h=" << h << " b=" << bb;
      }
      std::vector<int32_t> got(r.topk.begin() + (t * c.heads + h) * c.topk,
                               r.topk.begin() + (t * c.heads + h + 1) * c.topk);
      EXPECT_EQ(got, ref_topk(blk, c.topk)) << "topk t=" << t << " h=" << h << " pos=" << pos;
    }
  }
  if (batch_out) *batch_out = b;
  if (cache_out) {
    *cache_out = ic;
  } else {
    delete ic;
  }
  return r;
}

TEST(CpuIndexer, GridF32TiesAndPadding) { run_indexer_case({DType::F32, 16, kMixedSeqs}, 31); }
TEST(CpuIndexer, GridBf16Block128) {
  IdxCase c{DType::BF16, 128, kMixedSeqs};
  c.topk = 2;
  run_indexer_case(c, 32);
  c.topk = 16;  // contexts shorter than topk x block: -1 padding
  run_indexer_case(c, 33);
}
TEST(CpuIndexer, GridFp8QInCacheDtype) {
  IdxCase c{DType::FP8_E4M3, 16, kMixedSeqs};
  c.q_in_cache_dtype = true;
  run_indexer_case(c, 34);
  c.q_in_cache_dtype = false;
  run_indexer_case(c, 35);
}
TEST(CpuIndexer, RandomValuesAllCacheDtypes) {
  for (DType t : {DType::F32, DType::BF16, DType::FP8_E4M3}) {
    for (bool qc : {false, true}) {
      IdxCase c{t, 16, kMixedSeqs};
      c.grid = false;
      c.q_in_cache_dtype = qc;
      c.topk = 5;
      c.init = 1;
      c.local = 2;
      run_indexer_case(c, 36 + uint64_t(qc));
    }
  }
}
TEST(CpuIndexer, RandomBatches) {
  for (uint64_t seed = 95; seed < 99; ++seed) {
    Rng rng(seed);
    IdxCase c{seed % 2 ? DType::FP8_E4M3 : DType::BF16, 16, random_seq_specs(6, 300, rng)};
    c.grid = seed < 97;
    c.topk = 1 + int(seed % 6);
    c.init = int(seed % 3);
    c.local = int(seed % 4);
    run_indexer_case(c, seed);
  }
}
TEST(CpuIndexer, InitAndLocalOverlap) {
  for (int init : {0, 1, 3, 40}) {
    for (int local : {0, 1, 2, 5}) {
      IdxCase c{DType::BF16, 8, {{0, 1}, {0, 17}, {20, 30}, {60, 3}}};
      c.init = init;
      c.local = local;
      c.topk = 4;
      run_indexer_case(c, 40 + uint64_t(init * 10 + local));
    }
  }
}
TEST(CpuIndexer, NanKeysScoreMinus1e30) {
  IdxCase c{DType::F32, 8, {{0, 40}, {30, 2}}};
  c.nan_keys = true;
  c.duplicates = false;
  c.topk = 6;
  run_indexer_case(c, 50);
  c.cache_dtype = DType::FP8_E4M3;
  run_indexer_case(c, 51);
}
TEST(CpuIndexer, Bf16QueryInput) {
  IdxCase c{DType::BF16, 16, kMixedSeqs};
  c.q_dtype = DType::BF16;
  c.grid = false;
  run_indexer_case(c, 52);
}
TEST(CpuIndexer, DuplicateBlocksTieToLowerId) {
  // Queries far past blocks 1 and 2 (identical keys): whenever one of them is selected, the
  // other is selected too or block 1 is the one chosen.
  IdxCase c{DType::BF16, 16, {{90, 10}}};
  c.grid = false;
  c.topk = 2;
  c.local = 0;
  auto r = run_indexer_case(c, 53);
  int with_one = 0;
  for (size_t i = 0; i < r.topk.size(); i += 2) {
    bool has1 = r.topk[i] == 1 || r.topk[i + 1] == 1, has2 = r.topk[i] == 2 || r.topk[i + 1] == 2;
    EXPECT_FALSE(has2 && !has1);
    with_one += has1;
  }
  EXPECT_GT(with_one, 0);
}

// Indexer selection feeding sparse attention; with n_blk <= topk (and local >= 1) the sparse
// layer is exactly dense causal attention.
TEST(CpuIndexer, SelectionDrivesSparseAttention) {
  for (int topk : {2, 16}) {
    IdxCase c{DType::BF16, 16, {{0, 100}, {150, 2}, {20, 5}}};
    c.heads = 2;
    c.grid = false;
    c.topk = topk;
    PagedBatch b;
    IndexCache* ic = nullptr;
    auto r = run_indexer_case(c, 60 + uint64_t(topk), &b, &ic);
    delete ic;
    Rng rng(70);
    KvCache kv(DType::BF16, b.num_blocks, b.block_size, 2, 16);
    fill_caches_random(b, &kv, nullptr, rng);
    const int64_t T = b.num_tokens, stride = 4 * 16;
    auto qv = random_vector(size_t(T * stride), rng);
    std::vector<float> dense(size_t(T * stride), kNaN), sparse(size_t(T * stride), kNaN);
    ops::AttentionParams p;
    p.q = qv.data();
    p.q_stride = stride;
    p.out_stride = stride;
    p.num_q_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim = 16;
    p.sm_scale = 0.25f;
    p.kv = kv.view();
    p.batch = b.view();
    p.out = dense.data();
    cpu::run_attention(p);
    p.out = sparse.data();
    p.topk_idx = r.topk.data();
    p.topk = topk;
    cpu::run_attention(p);
    int differ = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int n_blk = b.positions[size_t(t)] / 16 + 1;
      for (int64_t i = 0; i < stride; ++i) {
        const float d = dense[size_t(t * stride + i)], s = sparse[size_t(t * stride + i)];
        ASSERT_FALSE(std::isnan(s));
        if (n_blk <= topk) {
          ASSERT_EQ(f32_bits(d), f32_bits(s)) << "t=" << t;
        } else {
          differ += d != s;
        }
      }
    }
    if (topk == 2) {
      EXPECT_GT(differ, 0);
    }
  }
}

// Padded rows (past query_start_loc[num_seqs]) and sequences without new tokens are not
// written; the other rows still are.
TEST(CpuAttentionIndexer, PaddedRowsAndEmptySequencesUntouched) {
  Rng rng(80);
  PagedBatch b = make_paged_batch({{50, 0}, {10, 3}, {0, 0}, {30, 1}}, 16, rng);
  const int64_t T = b.num_tokens, Tpad = T + 2;
  ASSERT_EQ(T, 4);
  KvCache kv(DType::BF16, b.num_blocks, 16, 1, 8);
  IndexCache ic(DType::BF16, b.num_blocks, 16, 8);
  fill_caches_random(b, &kv, &ic, rng);
  ops::BatchView view = b.view();
  view.num_tokens = Tpad;
  auto q = random_vector(size_t(Tpad * 16), rng);
  std::vector<float> out(size_t(Tpad * 16), kNaN);
  ops::AttentionParams p;
  p.q = q.data();
  p.q_stride = 16;
  p.out = out.data();
  p.out_stride = 16;
  p.num_q_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim = 8;
  p.sm_scale = 0.3f;
  p.kv = kv.view();
  p.batch = view;
  cpu::run_attention(p);
  for (int64_t i = 0; i < Tpad * 16; ++i) EXPECT_EQ(std::isnan(out[size_t(i)]), i >= T * 16) << i;

  std::vector<int32_t> topk(size_t(Tpad * 2 * 3), -7);
  std::vector<float> scores(size_t(Tpad * 2 * b.max_blocks_per_seq), kNaN);
  ops::IndexerParams ip;
  ip.index_q = q.data();
  ip.q_stride = 16;
  ip.num_index_heads = 2;
  ip.index_dim = 8;
  ip.cache = ic.view();
  ip.batch = view;
  ip.topk = 3;
  ip.local_blocks = 1;
  ip.topk_idx = topk.data();
  ip.block_scores = scores.data();
  cpu::run_indexer(ip);
  for (int64_t i = 0; i < Tpad * 2 * 3; ++i) EXPECT_EQ(topk[size_t(i)] == -7, i >= T * 2 * 3) << i;
  for (int64_t i = 0; i < Tpad * 2 * b.max_blocks_per_seq; ++i) {
    EXPECT_EQ(std::isnan(scores[size_t(i)]), i >= T * 2 * b.max_blocks_per_seq) << i;
  }
}

TEST(CpuTestUtil, TopkEquivalentAllowsOnlyNearTieSwaps) {
  std::vector<float> s = {1e29f, 0.5f, 0.50001f, 0.2f, 0.1f};
  std::vector<int32_t> exact = {0, 2, 1, -1}, swapped = {0, 1, 2, -1}, wrong = {0, 2, 3, -1};
  // n_blk = 5, topk = 4: the exact selection is {0, 2, 1, 3}.
  exact[3] = swapped[3] = 3;
  wrong[3] = 1;
  std::string why;
  EXPECT_TRUE(topk_equivalent(s.data(), 5, exact.data(), 4, 0, 0));
  EXPECT_FALSE(topk_equivalent(s.data(), 5, swapped.data(), 4, 0, 0, &why));
  EXPECT_TRUE(topk_equivalent(s.data(), 5, swapped.data(), 4, 1e-4, 1e-4));
  EXPECT_FALSE(topk_equivalent(s.data(), 5, wrong.data(), 4, 1e-4, 1e-4, &why));
  std::vector<int32_t> padded = {0, 2, 1, 3, 4, -1};
  EXPECT_TRUE(topk_equivalent(s.data(), 5, padded.data(), 6, 0, 0));
  padded[5] = 4;
  EXPECT_FALSE(topk_equivalent(s.data(), 5, padded.data(), 6, 0, 0, &why));
  EXPECT_NE(why.find("padding"), std::string::npos);
}

}  // namespace
}  // namespace sieve
