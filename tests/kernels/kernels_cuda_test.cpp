// Parity of the CUDA kernels (kernels/cuda/) with the CPU reference ops (kernels/cpu/) on fresh
// random inputs: paged batches with shuffled blocks, block-boundary lengths, ties, several query
// rows per request, mixed decode/prefill batches, bf16 and fp8 caches. Device outputs are
// poisoned before every run. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace sieve {
namespace {

using namespace sieve::test;

const ops::Stream kStream{kGpu, nullptr};

// ---------------------------------------------------------------------------------------------
// Tuning (no device needed): the benchmark's --tune fields and the scope the tests use.

TEST(CudaTuning, FieldsParseAndScopesRestore) {
  cuda::Tuning t;
  cuda::set_tuning_field(t, "indexer.persistent_unit", "4");
  cuda::set_tuning_field(t, "indexer.narrow_mma", "false");
  cuda::set_tuning_field(t, "indexer.prefill_mma", "rsp");
  cuda::set_tuning_field(t, "attention.trace", "2");
  cuda::set_tuning_field(t, "moe.chunk_tokens", "17");
  cuda::set_tuning_field(t, "launch.pdl_mask", "7");
  cuda::set_tuning_field(t, "indexer.persistent_long_unit", "-1");
  cuda::set_tuning_field(t, "indexer.persistent_claim_poll", "1");
  cuda::set_tuning_field(t, "attention.prefill_fp8_stage_pdl", "0");
  cuda::set_tuning_field(t, "attention.prefill_fp8_stage_only", "1");
  EXPECT_EQ(t.indexer.persistent_unit, 4);
  EXPECT_EQ(t.attention.prefill_fp8_stage_pdl, 0);
  EXPECT_EQ(t.attention.prefill_fp8_stage_only, 1);
  EXPECT_EQ(t.indexer.persistent_long_unit, -1);
  EXPECT_EQ(t.indexer.persistent_claim_poll, 1);
  EXPECT_FALSE(t.indexer.narrow_mma);
  EXPECT_EQ(t.indexer.prefill_mma, cuda::IndexerTuning::PrefillMma::kRSP);
  EXPECT_EQ(t.attention.trace, 2);
  EXPECT_EQ(t.moe.chunk_tokens, 17);
  EXPECT_EQ(t.launch.pdl_mask, 7);
  EXPECT_THROW(cuda::set_tuning_field(t, "indexer.no_such_field", "1"), Error);
  EXPECT_THROW(cuda::set_tuning_field(t, "indexer.persistent_unit", "four"), Error);
  EXPECT_THROW(cuda::set_tuning_field(t, "indexer.trace", "maybe"), Error);
  EXPECT_THROW(cuda::set_tuning_field(t, "indexer.prefill_mma", "sync"), Error);
  const std::vector<std::string> names = cuda::tuning_field_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "indexer.persistent_unit (default 0)"), names.end());

  const cuda::Tuning defaults;
  EXPECT_EQ(cuda::tuning().indexer.persistent_unit, defaults.indexer.persistent_unit);
  {
    cuda::TuningScope scope(t);
    EXPECT_EQ(cuda::tuning().indexer.persistent_unit, 4);
    {
      cuda::Tuning u = t;
      u.indexer.persistent_unit = 9;
      cuda::TuningScope inner(u);
      EXPECT_EQ(cuda::tuning().indexer.persistent_unit, 9);
    }
    EXPECT_EQ(cuda::tuning().indexer.persistent_unit, 4);
  }
  EXPECT_EQ(cuda::tuning().indexer.persistent_unit, defaults.indexer.persistent_unit);
  EXPECT_TRUE(cuda::tuning().indexer.narrow_mma);
}

// ---------------------------------------------------------------------------------------------
// qkv_norm_rope_cache

// pad: unused columns per row (8: every vector 4-element aligned, the vectorised path; 3: rows
// unaligned, the scalar path).
void check_qkv(DType act, DType kv_dtype, DType idx_dtype, uint64_t seed, int pad = 8) {
  SCOPED_TRACE("act " + name(act) + " kv " + name(kv_dtype) + " index " + name(idx_dtype) + " pad " +
               std::to_string(pad));
  Rng rng(seed);
  const QkvLayout l = QkvLayout::make(4, 2, 128, 2, 128, 64, pad);
  const QkvWeights w = QkvWeights::make(l, 8192, rng);
  PagedBatch b = make_paged_batch({{0, 5}, {130, 3}, {255, 1}, {1000, 2}}, 128, rng);
  b.slot_mapping[1] = -1;  // a skipped token
  const int64_t T = b.num_tokens;
  auto rows = random_vector(size_t(T * l.row_stride), rng, -2.f, 2.f);
  TypedBuffer in = TypedBuffer::from(act, rows);
  std::vector<float> cpu_rows(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) cpu_rows[i] = in.get(i);

  KvCache kv_cpu(kv_dtype, b.num_blocks, 128, l.num_kv_heads, l.head_dim);
  IndexCache ic_cpu(idx_dtype, b.num_blocks, 128, l.index_dim);
  KvCache kv_gpu_host = kv_cpu;  // same poison bytes
  IndexCache ic_gpu_host = ic_cpu;
  auto pc = make_qkv_params(l, w, cpu_rows.data(), DType::F32, T, b.positions.data(),
                            b.slot_mapping.data(), kv_cpu, &ic_cpu);
  cpu::run_qkv_norm_rope_cache(pc);

  Dev d_qkv = Dev::of(in), d_k = Dev::of(kv_gpu_host.k), d_v = Dev::of(kv_gpu_host.v);
  Dev d_ks = Dev::of(kv_gpu_host.k_scale), d_vs = Dev::of(kv_gpu_host.v_scale);
  Dev d_ik = Dev::of(ic_gpu_host.k);
  Dev d_qn = Dev::of(w.q_norm), d_kn = Dev::of(w.k_norm), d_iqn = Dev::of(w.index_q_norm),
      d_ikn = Dev::of(w.index_k_norm), d_cs = Dev::of(w.cos_sin);
  Dev d_pos = Dev::of(b.positions), d_slots = Dev::of(b.slot_mapping);
  auto pg = make_qkv_params(l, w, d_qkv.p(), act, T, d_pos.as<int32_t>(), d_slots.as<int64_t>(),
                            kv_gpu_host, &ic_gpu_host);
  pg.q_norm = d_qn.p(), pg.k_norm = d_kn.p(), pg.index_q_norm = d_iqn.p(), pg.index_k_norm = d_ikn.p();
  pg.cos_sin = d_cs.as<float>();
  pg.kv.k = d_k.p(), pg.kv.v = d_v.p();
  pg.kv.k_scale = kv_dtype == DType::FP8_E4M3 ? d_ks.as<float>() : nullptr;
  pg.kv.v_scale = kv_dtype == DType::FP8_E4M3 ? d_vs.as<float>() : nullptr;
  pg.index_cache.k = d_ik.p();
  ops::qkv_norm_rope_cache(pg, kStream);
  device_synchronize(kGpu);

  // Rows: q / index_q transformed, everything else untouched.
  TypedBuffer out(act, rows.size());
  copy_to_host(kGpu, out.data(), d_qkv.p(), out.bytes.size());
  const double tol = act == DType::BF16 ? 1.6e-2 : 2e-5;
  int bad = 0;
  for (size_t i = 0; i < rows.size() && bad < 5; ++i) {
    const float g = out.get(i), c = act == DType::BF16 ? round_bf16(cpu_rows[i]) : cpu_rows[i];
    if (!close(g, c, tol, tol)) {
      ADD_FAILURE() << "qkv row element " << i << " (col " << i % l.row_stride << "): gpu " << g << " cpu " << c;
      ++bad;
    }
  }
  // Caches, dequantised; unwritten entries stay poisoned (NaN) in both.
  KvCache kv_g = kv_cpu;
  IndexCache ic_g = ic_cpu;
  copy_to_host(kGpu, kv_g.k.data(), d_k.p(), kv_g.k.bytes.size());
  copy_to_host(kGpu, kv_g.v.data(), d_v.p(), kv_g.v.bytes.size());
  if (kv_dtype == DType::FP8_E4M3) {
    copy_to_host(kGpu, kv_g.k_scale.data(), d_ks.p(), kv_g.k_scale.size() * 4);
    copy_to_host(kGpu, kv_g.v_scale.data(), d_vs.p(), kv_g.v_scale.size() * 4);
  }
  copy_to_host(kGpu, ic_g.k.data(), d_ik.p(), ic_g.k.bytes.size());
  const bool fp8 = kv_dtype == DType::FP8_E4M3;
  for (int64_t slot = 0; slot < b.num_blocks * 128 && bad < 10; ++slot) {
    for (int h = 0; h < l.num_kv_heads; ++h) {
      const size_t r = kv_cpu.row(slot, h);
      for (int kvsel = 0; kvsel < 2; ++kvsel) {
        const TypedBuffer& cb = kvsel ? kv_cpu.v : kv_cpu.k;
        const TypedBuffer& gb = kvsel ? kv_g.v : kv_g.k;
        float cs = 1.f, gs = 1.f;
        if (fp8) {
          cs = kvsel ? kv_cpu.v_scale[r] : kv_cpu.k_scale[r];
          gs = kvsel ? kv_g.v_scale[r] : kv_g.k_scale[r];
          if (std::isnan(cs) != std::isnan(gs) || (!std::isnan(cs) && !close(gs, cs, 0, 1e-2))) {
            ADD_FAILURE() << "scale slot " << slot << " head " << h << ": gpu " << gs << " cpu " << cs;
            ++bad;
          }
        }
        for (int d = 0; d < 128; ++d) {
          const float c = cb.get(r * 128 + d) * cs, g = gb.get(r * 128 + d) * gs;
          if (std::isnan(c) && std::isnan(g)) continue;
          const double t = fp8 ? 0.13 * std::fabs(c) + cs * 0.004 + 1e-6 : 8e-3 * std::fabs(c) + 1e-6;
          if (std::isnan(c) || std::isnan(g) || std::fabs(c - g) > t) {
            ADD_FAILURE() << (kvsel ? "v" : "k") << " cache slot " << slot << " head " << h << " dim " << d
                          << ": gpu " << g << " cpu " << c;
            ++bad;
            break;
          }
        }
      }
    }
    for (int d = 0; d < 128; ++d) {
      const float c = ic_cpu.read(slot, d), g = ic_g.read(slot, d);
      if (std::isnan(c) && std::isnan(g)) continue;
      const double t = idx_dtype == DType::FP8_E4M3 ? 0.13 * std::fabs(c) + 0.004 : 8e-3 * std::fabs(c) + 1e-6;
      if (std::isnan(c) || std::isnan(g) || std::fabs(c - g) > t) {
        ADD_FAILURE() << "index cache slot " << slot << " dim " << d << ": gpu " << g << " cpu " << c;
        ++bad;
        break;
      }
    }
  }
}

TEST(CudaQkvNormRopeCache, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (DType act : {DType::BF16, DType::F32})
    for (DType kvd : {DType::BF16, DType::FP8_E4M3})
      for (DType idd : {DType::BF16, DType::FP8_E4M3}) check_qkv(act, kvd, idd, seed++);
  check_qkv(DType::BF16, DType::FP8_E4M3, DType::BF16, seed++, 3);
  check_qkv(DType::F32, DType::BF16, DType::FP8_E4M3, seed++, 3);
}

// ---------------------------------------------------------------------------------------------
// Indexer

// kDecode: every decode kernel; kPrefill: both prefill kernels; kAuto: the planner's kernel, and
// every decode kernel on a decode-shaped batch.
enum class Kernels { kAuto, kDecode, kPrefill };

struct IndexerCase : IndexerInputs {
  cuda::IndexerKernel kernel = cuda::IndexerKernel::kAuto;
};

// The case through c.kernel on poisoned outputs; no check where the kernel has no plan for the
// shape and `may_refuse`.
void check_indexer_once(const IndexerCase& c, uint64_t seed, bool may_refuse = false) {
  SCOPED_TRACE(c.describe() + " kernel " + std::to_string(int(c.kernel)) + " seed " + std::to_string(seed));
  IndexerRef r(c, seed);
  r.d_idx.poison(0x55);
  r.d_scores.poison(0xff);
  const bool ran = cuda::run_indexer_kernel(r.gpu, nullptr, c.kernel);
  if (!ran && may_refuse) return;
  ASSERT_TRUE(ran);
  device_synchronize(kGpu);
  r.expect_gpu_matches(true);
}

// The case through each kernel of `which` (the cluster and persistent kernels where they have a
// plan for the shape; the chunked kernel, which kAuto falls back to, has one for every shape).
void check_indexer(const IndexerCase& c, uint64_t seed, Kernels which = Kernels::kAuto) {
  using K = cuda::IndexerKernel;
  int max_q = 0;
  for (const SeqSpec& sp : c.specs) max_q = std::max(max_q, sp.q_len);
  const bool decode = which == Kernels::kDecode || (which == Kernels::kAuto && max_q * c.H <= 16);
  std::vector<K> kernels;
  if (which != Kernels::kPrefill) kernels.push_back(K::kAuto);
  if (decode) kernels.insert(kernels.end(), {K::kDecodeChunked, K::kDecodeCluster, K::kDecodePersistent});
  if (which == Kernels::kPrefill) kernels.insert(kernels.end(), {K::kPrefill, K::kPrefillLong});
  for (K k : kernels) {
    IndexerCase ck = c;
    ck.kernel = k;
    check_indexer_once(ck, seed, k == K::kDecodeCluster || k == K::kDecodePersistent);
  }
}

const std::vector<SeqSpec> kDecodeSpecs = {{0, 1},   {126, 1},  {127, 1},  {128, 1},  {300, 1},
                                           {2047, 1}, {2048, 1}, {2175, 1}, {5000, 1}, {9000, 1}};
const std::vector<SeqSpec> kSpecSpecs = {{200, 4}, {2044, 4}, {3000, 4}, {124, 4}};
const std::vector<SeqSpec> kPrefillSpecs = {{0, 300}, {1000, 129}, {0, 1}, {3000, 200}, {127, 130}};

TEST(CudaIndexer, DecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1000;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    {
      IndexerCase c;
      c.specs = kDecodeSpecs;
      c.cache = cd;
      check_indexer(c, seed++, Kernels::kDecode);
      ++seed;  // (the seed of the unfused baseline's case, deleted with it)
    }
    IndexerCase c;
    c.specs = kDecodeSpecs;
    c.cache = cd;
    c.topk = 8, c.init = 1, c.local = 2;
    check_indexer(c, seed++);
    c.q_dtype = DType::F32;
    c.q_in_cache = cd == DType::FP8_E4M3;
    check_indexer(c, seed++);
  }
}

TEST(CudaIndexer, SeveralRowsAndHeadsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2000;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (int H : {1, 2, 4}) {
      IndexerCase c;
      c.specs = kSpecSpecs;
      c.cache = cd;
      c.H = H;
      check_indexer(c, seed++);
    }
  }
}

TEST(CudaIndexer, PrefillMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 3000;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (int H : {1, 2}) {
      IndexerCase c;
      c.specs = kPrefillSpecs;
      c.cache = cd;
      c.H = H;
      check_indexer(c, seed);
      check_indexer(c, seed++, Kernels::kPrefill);
    }
    // The prefill kernels on decode-shaped batches too.
    IndexerCase c;
    c.specs = kDecodeSpecs;
    c.cache = cd;
    c.init = 1;
    check_indexer(c, seed++, Kernels::kPrefill);
  }
}

TEST(CudaIndexer, ExactTiesFollowTheLowerBlockRule) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 4000;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (Kernels which : {Kernels::kDecode, Kernels::kPrefill}) {
      IndexerCase c;
      c.specs = which == Kernels::kPrefill ? kPrefillSpecs : kDecodeSpecs;
      c.cache = cd;
      c.ties = true;
      check_indexer(c, seed++, which);
    }
  }
}

TEST(CudaIndexer, RandomBatchesMatchCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(4500);
  for (int trial = 0; trial < 6; ++trial) {
    IndexerCase c;
    c.specs = random_seq_specs(5, 3000, rng, trial % 2 ? 16 : 4);
    c.cache = trial % 2 ? DType::FP8_E4M3 : DType::BF16;
    c.H = 1 + trial % 3;
    c.init = trial % 2;
    check_indexer(c, 4600 + uint64_t(trial));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

struct AttnCase {
  std::vector<SeqSpec> specs;
  int nq = 16, nkv = 1;
  DType kv = DType::BF16;
  DType out = DType::F32;
  // Q rows: dtype and the padding after a token's heads (elements). bf16 with 8 (and f32 with
  // 4) keeps rows 16-byte aligned: Q comes by one bulk copy; bf16 with 4: 8-byte vector loads;
  // odd paddings: element loads.
  DType q = DType::BF16;
  int q_pad = 8;
  bool sparse = true;
  int topk = 16;
  // fp8: token scales multiplied by 2^u, u uniform in [-spread, 0] for V and [-1, spread / 4]
  // for K (per-token magnitudes spread over 2^spread; scores spread too).
  float scale_spread = 0.f;
  // The CPU reference's Q rounded as the fp8 S path (AttentionTuning::prefill_fp8_qk) rounds it:
  // each (token, head) row to e4m3 with scale amax / 448, times that scale.
  bool cpu_q_fp8 = false;
  // Tolerance of a (token, head) row: max abs error, relative l2 error (rows with a norm).
  double max_abs = 2.5e-2, max_rel = 2e-2;
  // When set: receives the relative l2 error over the whole output.
  double* total_rel = nullptr;
  // The GPU call's stream (a cudaStream_t; null: the legacy default stream).
  void* stream = nullptr;
};

// The folded staged copy (AttentionTuning::prefill_fp8_stage_fold, the fp8 prefill default) rounds
// each k * k_scale and v * v_scale to bf16, which the CPU reference does not. With k token scales
// spread over 2^6 (scale_spread) the scores reach rms ~10, and that rounding (2^-9 of each term)
// moves them by ~1e-2: a few % of a row's probabilities. A simulation of exactly this rounding
// (e4m3 K and V, the spread scales, rows of 1 to 1500 keys) gave per-row relative l2 errors up to
// 0.10 and absolute errors up to 0.016 in 25,000 rows, 0.004 relative over all of them; on the
// H100 one row in a sparse test reached 0.029 absolute (the fold's error on top of the unfolded
// paths' own). Hence 0.15 relative and 0.05 absolute a row, and the whole output's relative l2
// below 1.5e-2 where a test checks it. (The e4m3 rounding of the cache itself moves each key by
// up to 2^-4 of itself, 32 times more.)
void fold_wide_scale_tolerance(AttnCase& c) {
  c.max_rel = 0.15;
  c.max_abs = 5e-2;
}

// gpu_bytes (when given) receives the device's output as it was written.
void check_attention_once(const AttnCase& c, uint64_t seed, std::vector<uint8_t>* gpu_bytes = nullptr) {
  SCOPED_TRACE("kv " + name(c.kv) + (c.sparse ? " sparse" : " dense") + " nq " + std::to_string(c.nq) +
               " nkv " + std::to_string(c.nkv) + " q " + name(c.q) + " pad " + std::to_string(c.q_pad) + " out " +
               name(c.out) + " seed " + std::to_string(seed));
  Rng rng(seed);
  const int D = 128;
  PagedBatch b = make_paged_batch(c.specs, 128, rng);
  KvCache kv(c.kv, b.num_blocks, 128, c.nkv, D);
  fill_caches_random(b, &kv, nullptr, rng, 1.0f);
  if (c.scale_spread > 0.f && c.kv == DType::FP8_E4M3) {
    for (auto& x : kv.v_scale)
      if (!std::isnan(x)) x *= std::exp2(rng.uniform(-c.scale_spread, 0.f));
    for (auto& x : kv.k_scale)
      if (!std::isnan(x)) x *= std::exp2(rng.uniform(-1.f, c.scale_spread / 4));
  }
  const int64_t T = b.num_tokens;
  const int64_t q_stride = int64_t(c.nq) * D + c.q_pad;
  std::vector<float> qv(size_t(T * q_stride));
  for (auto& v : qv) v = rng.uniform(-1.f, 1.f);
  TypedBuffer q = TypedBuffer::from(c.q, qv);
  std::vector<int32_t> topk;
  if (c.sparse) {
    topk.assign(size_t(T * c.nkv * c.topk), -1);
    for (int64_t t = 0; t < T; ++t) {
      const int n_blk = b.positions[size_t(t)] / 128 + 1;
      for (int g = 0; g < c.nkv; ++g) {
        std::vector<int32_t> ids(size_t(n_blk - 1));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng.gen);
        ids.resize(std::min<size_t>(ids.size(), size_t(c.topk - 1)));
        ids.insert(ids.begin() + rng.uniform_int(0, int(ids.size())), n_blk - 1);  // own block
        std::copy(ids.begin(), ids.end(), topk.begin() + (t * c.nkv + g) * c.topk);
      }
    }
  }
  const int64_t out_stride = int64_t(c.nq) * D + 16;
  ops::AttentionParams p;
  p.q = q.data();
  p.q_dtype = c.q;
  p.q_stride = q_stride;
  std::vector<float> cpu_out(size_t(T * out_stride), kNaN);
  // The fp8 S path's Q, as the kernel quantizes it (fp32: inv = 448 / amax, code = satfinite
  // e4m3(x * inv), scale = amax / 448).
  std::vector<float> q8;
  if (c.cpu_q_fp8) {
    q8.assign(size_t(T * q_stride), 0.f);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < c.nq; ++h) {
        const size_t r = size_t(t * q_stride + h * D);
        float amax = 0.f;
        for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(q.get(r + size_t(d))));
        const float inv = amax > 0.f ? 448.f / amax : 0.f, scale = amax > 0.f ? amax / 448.f : 1.f;
        for (int d = 0; d < D; ++d) q8[r + size_t(d)] = round_fp8e4m3(q.get(r + size_t(d)) * inv) * scale;
      }
    p.q = q8.data();
    p.q_dtype = DType::F32;
  }
  p.out = cpu_out.data();
  p.out_dtype = DType::F32;
  p.out_stride = out_stride;
  p.num_q_heads = c.nq;
  p.num_kv_heads = c.nkv;
  p.head_dim = D;
  p.sm_scale = float(1.0 / std::sqrt(128.0));
  p.kv = kv.view();
  p.batch = b.view();
  p.topk_idx = c.sparse ? topk.data() : nullptr;
  p.topk = c.sparse ? c.topk : 0;
  cpu::run_attention(p);

  DevBatch db(b);
  Dev d_q = Dev::of(q), d_k = Dev::of(kv.k), d_v = Dev::of(kv.v), d_ks = Dev::of(kv.k_scale),
      d_vs = Dev::of(kv.v_scale), d_topk = Dev::of(topk);
  TypedBuffer gout(c.out, cpu_out.size());
  Dev d_out(gout.bytes.size());
  d_out.poison(0xff);
  ops::AttentionParams g = p;
  g.q = d_q.p();
  g.q_dtype = c.q;
  g.out = d_out.p();
  g.out_dtype = c.out;
  g.kv.k = d_k.p(), g.kv.v = d_v.p();
  g.kv.k_scale = c.kv == DType::FP8_E4M3 ? d_ks.as<float>() : nullptr;
  g.kv.v_scale = c.kv == DType::FP8_E4M3 ? d_vs.as<float>() : nullptr;
  g.batch = db.view;
  g.topk_idx = c.sparse ? d_topk.as<int32_t>() : nullptr;
  if (c.stream) device_synchronize(kGpu);  // the uploads and the poison, on the default stream
  ops::attention(g, ops::Stream{kGpu, c.stream});
  device_synchronize(kGpu);
  copy_to_host(kGpu, gout.data(), d_out.p(), gout.bytes.size());
  if (gpu_bytes) *gpu_bytes = gout.bytes;

  int bad = 0;
  double all_num = 0, all_den = 0;
  for (int64_t t = 0; t < T && bad < 5; ++t) {
    for (int h = 0; h < c.nq && bad < 5; ++h) {
      double num = 0, den = 0, worst = 0;
      for (int d = 0; d < D; ++d) {
        const size_t i = size_t(t * out_stride + h * D + d);
        const double cv = cpu_out[i], gv = gout.get(i);
        if (std::isnan(gv)) {
          worst = 1e30;
          break;
        }
        num += (gv - cv) * (gv - cv);
        den += cv * cv;
        worst = std::max(worst, std::fabs(gv - cv));
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      all_num += num, all_den += den;
      if (worst > c.max_abs || (den > 1e-6 && rel > c.max_rel)) {
        ADD_FAILURE() << "token " << t << " (pos " << b.positions[size_t(t)] << ") head " << h
                      << ": max abs err " << worst << ", rel l2 " << rel;
        ++bad;
      }
    }
  }
  if (c.total_rel) *c.total_rel = std::sqrt(all_num / std::max(all_den, 1e-30));
  // Padding columns of the output rows are never written.
  for (int64_t t = 0; t < T; ++t)
    for (int i = c.nq * D; i < out_stride; ++i)
      if (!std::isnan(gout.get(size_t(t * out_stride + i)))) {
        ADD_FAILURE() << "wrote past the heads of token " << t;
        return;
      }
}

void check_attention(const AttnCase& c, uint64_t seed) { check_attention_once(c, seed); }

TEST(CudaAttention, SparseDecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 5000;
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    AttnCase c;
    c.specs = kDecodeSpecs;
    c.kv = kvd;
    check_attention(c, seed++);
    c.specs = kSpecSpecs;
    c.out = DType::BF16;
    check_attention(c, seed++);
    c.nq = 8, c.nkv = 2, c.topk = 6;  // GQA 4, padded mma rows
    c.specs = kDecodeSpecs;
    check_attention(c, seed++);
  }
}

TEST(CudaAttention, SparsePrefillMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 6000;
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    AttnCase c;
    c.specs = kPrefillSpecs;
    c.kv = kvd;
    check_attention(c, seed++);
  }
}

TEST(CudaAttention, RandomBatchesMatchCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(6500);
  for (int trial = 0; trial < 9; ++trial) {
    AttnCase c;
    c.specs = random_seq_specs(5, 2500, rng, 8);
    c.kv = trial % 2 ? DType::FP8_E4M3 : DType::BF16;
    c.sparse = trial % 4 < 2;
    // Trials 4..8: the other Q layouts (f32 bulk-copied with bf16 and fp8 KV, bf16 vector loads,
    // bf16 element loads, f32 element loads).
    if (trial >= 4) {
      c.q = trial == 6 || trial == 7 ? DType::BF16 : DType::F32;
      c.q_pad = trial == 7 ? 3 : trial == 8 ? 1 : 4;
    }
    check_attention(c, 6600 + uint64_t(trial));
  }
}

// The grid shapes of run_attention, sparse and dense, bf16 and fp8: the benchmark's decode shape
// (32 requests near 9216 tokens: one CTA per SM with two consumer groups, 4 splits a row in 2
// clusters of 2 whose first cluster folds in the second's flagged records, the slot ring
// wrapping for dense), 40 requests of
// up to 3000 tokens (two CTAs per SM, one cluster per row), 3 long requests (sparse: one
// cluster of 8 per row, two units a CTA; dense: several clusters per row) and 8 long requests
// (dense: two consumer groups with 6 bf16 slots, 3 per group; this shape faulted while the two
// groups shared the ring's slots).
void check_cluster_shapes(uint64_t seed) {
  Rng rng(seed);
  for (int shape = 0; shape < 4; ++shape) {
    std::vector<SeqSpec> specs;
    const int n = shape == 0 ? 32 : shape == 1 ? 40 : shape == 2 ? 3 : 8;
    for (int i = 0; i < n; ++i) {
      const int len = shape == 0 ? rng.uniform_int(8900, 9216) : shape == 1 ? rng.uniform_int(1, 3000)
                                                                             : rng.uniform_int(20000, 24000);
      specs.push_back({len - 1, 1});
    }
    for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
      for (bool sparse : {true, false}) {
        AttnCase c;
        c.specs = specs;
        c.kv = kvd;
        c.sparse = sparse;
        c.out = DType::BF16;
        check_attention(c, seed++);
      }
    }
  }
}

TEST(CudaAttention, ClusterShapesMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_cluster_shapes(7300);
}

// The same shapes with the rows that span several clusters merged through partials and a
// last-CTA counter (the path for grids that are not resident at once).
TEST(CudaAttention, ClusterShapesLastCtaMergeMatchCpu) {
  SKIP_WITHOUT_GPU();
  cuda::Tuning t;
  t.attention.flagged_merge = false;
  cuda::TuningScope scope(t);
  check_cluster_shapes(7350);
}

// fp8 caches whose token scales spread over 2^20 (V) and whose scores spread widely: the P V
// step's per-block f16 scaling of p * v_scale (attention.cu) keeps every term's precision.
TEST(CudaAttention, Fp8WideScalesMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7600;
  Rng rng(7600);
  std::vector<SeqSpec> longs;
  for (int i = 0; i < 3; ++i) longs.push_back({rng.uniform_int(9000, 12000), 1});
  for (const auto& specs : {kDecodeSpecs, kSpecSpecs, longs}) {
    for (bool sparse : {true, false}) {
      AttnCase c;
      c.specs = specs;
      c.kv = DType::FP8_E4M3;
      c.sparse = sparse;
      c.scale_spread = 20.f;
      check_attention(c, seed++);
    }
  }
}

TEST(CudaAttention, DenseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 7000;
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    AttnCase c;
    c.sparse = false;
    c.kv = kvd;
    c.specs = kDecodeSpecs;
    check_attention(c, seed++);
    c.specs = kPrefillSpecs;
    c.nq = 8, c.nkv = 2;
    check_attention(c, seed++);
  }
}

// Decode rows with the K/V copies under the L2 evict-first policy forced on (the rule turns it on
// only for streams of 4 MB and more, larger than these tests' batches): a cache policy only, so
// the same results.
TEST(CudaAttention, L2EvictFirstMatchesCpu) {
  SKIP_WITHOUT_GPU();
  cuda::Tuning t;
  t.attention.l2_evict_first = 1;
  cuda::TuningScope scope(t);
  uint64_t seed = 7600;
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    for (bool sparse : {true, false}) {
      AttnCase c;
      c.sparse = sparse;
      c.kv = kvd;
      c.specs = kDecodeSpecs;
      check_attention(c, seed++);
    }
  }
}

// The prefill tiles (attention_prefill.cu: a CTA's 128 MMA rows are the tokens x q heads of one
// kv head over the union of their blocks; 8 tokens x 16 heads or 16 tokens x 8 heads), forced for
// every batch they support: prompts and chunks after cached prefixes with lengths at and around
// block boundaries (the request's last block partial or full), a single new token, decode rows,
// sparse and dense, bf16 and fp8 caches, f32 and bf16 outputs, two kv heads, a tile's 256 pairs
// (topk 32 with 16 heads, 16 with 8) and topk 5, widely spread fp8 scales; then the automatic
// rule on a 1500-token prompt. `group`: q heads per kv head.
void check_prefill_tiles(int group, uint64_t seed) {
  SCOPED_TRACE("q heads per kv head " + std::to_string(group));
  cuda::Tuning t;
  t.attention.prefill_tiles = 1;
  auto scope = std::make_unique<cuda::TuningScope>(t);
  const std::vector<std::vector<SeqSpec>> sets = {
      kPrefillSpecs,
      {{0, 127}, {0, 128}, {0, 129}, {128, 128}, {255, 257}, {2047, 2}, {3000, 333}},
      // Long prefixes, few new tokens: a tile's blocks mostly serve one token (solo blocks).
      {{20000, 40}, {9000, 17}, {15000, 1}},
      kDecodeSpecs,
      kSpecSpecs};
  for (DType kvd : {DType::BF16, DType::FP8_E4M3})
    for (const auto& specs : sets)
      for (bool sparse : {true, false})
        for (DType out : {DType::F32, DType::BF16}) {
          AttnCase c;
          c.specs = specs;
          c.nq = group;
          c.kv = kvd;
          c.sparse = sparse;
          c.out = out;
          check_attention(c, seed++);
        }
  for (DType kvd : {DType::BF16, DType::FP8_E4M3})
    for (int topk : {256 / (128 / group), 5}) {
      AttnCase c;
      c.specs = {{0, 700}, {1500, 77}, {129, 1}};
      c.kv = kvd;
      c.nq = 2 * group, c.nkv = 2;
      c.topk = topk;
      check_attention(c, seed++);
    }
  // fp8 token scales spread over 2^20 (V): p * v_scale keeps its precision in bf16.
  for (bool sparse : {true, false}) {
    AttnCase c;
    c.specs = {{0, 600}, {2000, 300}};
    c.nq = group;
    c.kv = DType::FP8_E4M3;
    c.sparse = sparse;
    c.scale_spread = 20.f;
    fold_wide_scale_tolerance(c);  // the default staged copy is folded
    check_attention(c, seed++);
  }
  scope.reset();  // the automatic rule
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    AttnCase c;
    c.specs = {{0, 1500}};
    c.nq = group;
    c.kv = kvd;
    check_attention(c, seed++);
  }
}

TEST(CudaAttentionPrefill, TilesMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_prefill_tiles(16, 8000);
}

// One TP8 rank's shape: 8 q heads per kv head (tiles of 16 tokens, two a warp).
TEST(CudaAttentionPrefill, TilesOfEightHeadsMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_prefill_tiles(8, 8800);
}

// The tiles take 16 or 8 q heads per kv head (with at most 256 (token, topk entry) pairs a tile)
// and leave other groups to the decode kernel.
TEST(CudaAttentionPrefill, SupportedGroups) {
  SKIP_WITHOUT_GPU();
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    SCOPED_TRACE("kv " + name(kvd));
    float scale = 1.f;
    char cache[16] = {};
    ops::AttentionParams p;
    p.q_dtype = DType::BF16;
    p.out_dtype = DType::BF16;
    p.head_dim = 128;
    p.kv.dtype = kvd;
    p.kv.k = p.kv.v = cache;
    p.kv.k_scale = p.kv.v_scale = kvd == DType::FP8_E4M3 ? &scale : nullptr;
    p.kv.num_blocks = 1;
    p.kv.block_size = 128;
    p.kv.num_kv_heads = 1;
    p.kv.head_dim = 128;
    int32_t topk = 0;
    auto supported = [&](int nq, int nkv, int k) {
      p.num_q_heads = nq, p.num_kv_heads = nkv;
      p.kv.num_kv_heads = nkv;
      p.topk_idx = k > 0 ? &topk : nullptr;
      p.topk = k;
      return cuda::prefill_attention_supported(p);
    };
    EXPECT_TRUE(supported(16, 1, 0));
    EXPECT_TRUE(supported(16, 1, 32));
    EXPECT_FALSE(supported(16, 1, 33));
    EXPECT_TRUE(supported(64, 4, 16));
    EXPECT_TRUE(supported(8, 1, 0));
    EXPECT_TRUE(supported(8, 1, 16));
    EXPECT_FALSE(supported(8, 1, 17));  // 16 tokens x 17 > 256 pairs
    EXPECT_TRUE(supported(16, 2, 16));
    EXPECT_FALSE(supported(4, 1, 0));
    EXPECT_FALSE(supported(4, 1, 16));
    EXPECT_FALSE(supported(32, 1, 0));
    EXPECT_FALSE(supported(12, 1, 0));
    EXPECT_FALSE(supported(24, 2, 0));
  }
}

// fp8 caches through the tiles: the staged bf16 copy (AttentionTuning::prefill_fp8_stage, with
// its scales from global memory and staged with the blocks) gives the tiles' own conversion's
// results bit for bit, and all three match the CPU: prompts, chunks after prefixes, partial last
// blocks, decode rows, widely spread scales, two kv heads, sparse and dense, 16 and 8 q heads
// per kv head; and with a staging limit too small for the call, the tiles convert.
TEST(CudaAttentionPrefill, Fp8StagedMatchesInTile) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9100;
  const std::vector<std::vector<SeqSpec>> sets = {
      {{0, 300}, {1000, 129}, {0, 1}, {127, 130}}, {{20000, 40}, {0, 1500}, {9000, 1}}, {{2047, 2}, {0, 128}}};
  for (int group : {16, 8})
    for (const auto& specs : sets)
      for (bool sparse : {true, false})
        for (int nkv : {1, 2}) {
          AttnCase c;
          c.specs = specs;
          c.nq = group * nkv, c.nkv = nkv;
          c.kv = DType::FP8_E4M3;
          c.sparse = sparse;
          c.scale_spread = nkv == 2 ? 20.f : 0.f;
          c.out = sparse ? DType::BF16 : DType::F32;
          std::vector<uint8_t> ref, got;
          {
            cuda::Tuning t;
            t.attention.prefill_tiles = 1;
            t.attention.prefill_fp8_stage = 0;
            cuda::TuningScope scope(t);
            SCOPED_TRACE("converted in the tiles");
            check_attention_once(c, seed, &ref);
          }
          for (int scales : {0, 1}) {
            cuda::Tuning t;
            t.attention.prefill_tiles = 1;
            t.attention.prefill_fp8_stage = 2;  // sparse calls too
            t.attention.prefill_fp8_stage_scales = scales;
            t.attention.prefill_fp8_stage_fold = 0;  // exact copy (folded scales round K and V)
            cuda::TuningScope scope(t);
            SCOPED_TRACE("staged, scales " + std::to_string(scales));
            check_attention_once(c, seed, &got);
            ASSERT_EQ(got.size(), ref.size());
            EXPECT_TRUE(got == ref) << "staged output differs from the tiles' own conversion";
          }
          {
            cuda::Tuning t;
            t.attention.prefill_tiles = 1;
            t.attention.prefill_fp8_stage = 2;
            t.attention.prefill_fp8_stage_max_mib = 0;  // nothing fits: converted in the tiles
            cuda::TuningScope scope(t);
            SCOPED_TRACE("staging limit 0");
            check_attention_once(c, seed, &got);
            EXPECT_TRUE(got == ref);
          }
          ++seed;
        }
}

// The tiles launched behind the staging's conversion kernel with programmatic dependent launch
// (AttentionTuning::prefill_fp8_stage_pdl, the default; on a stream of its own, as the model's
// and the benchmark's calls: never on the legacy default stream) give the plain launch's bytes,
// and both match the CPU: their prologue runs early, but the copy and its table are read only
// after griddepcontrol.wait. The calls follow each other with other shapes, so the workspace
// holds another call's copy and table, which a read before the wait would take. The exact, the
// folded and the fp8 S copies; sparse and dense; one and two kv heads; ragged last blocks,
// chunks after prefixes, several requests, decode rows.
TEST(CudaAttentionPrefill, Fp8StagedPdlMatchesPlainLaunch) {
  SKIP_WITHOUT_GPU();
  cudaStream_t cs = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
  uint64_t seed = 9700;
  // The last set's few tokens select fewer blocks than the table has entries: sparse slots come
  // from the counter (the others' are their entries).
  const std::vector<std::vector<SeqSpec>> sets = {{{0, 700}, {20000, 40}, {127, 130}, {0, 1}},
                                                  {{2047, 2}, {0, 128}, {9000, 9}},
                                                  {{9000, 1}, {20000, 2}, {300, 1}, {5000, 3}}};
  for (int mode : {0, 1, 2})  // exact copy, folded copy, fp8 S
    for (const auto& specs : sets)
      for (bool sparse : {true, false})
        for (int nkv : {1, 2}) {
          AttnCase c;
          c.specs = specs;
          c.nq = (nkv == 1 ? 16 : 8) * nkv, c.nkv = nkv;
          c.kv = DType::FP8_E4M3;
          c.sparse = sparse;
          c.out = nkv == 1 ? DType::F32 : DType::BF16;
          c.cpu_q_fp8 = mode == 2;
          c.stream = cs;
          std::vector<uint8_t> ref, got;
          for (int pdl : {0, 1}) {
            cuda::Tuning t;
            t.attention.prefill_tiles = 1;
            t.attention.prefill_fp8_stage = 2;
            t.attention.prefill_fp8_stage_fold = mode == 1 ? 1 : 0;
            t.attention.prefill_fp8_qk = mode == 2 ? 1 : 0;
            t.attention.prefill_fp8_stage_pdl = pdl;
            cuda::TuningScope scope(t);
            SCOPED_TRACE("mode " + std::to_string(mode) + " pdl " + std::to_string(pdl));
            check_attention_once(c, seed, pdl ? &got : &ref);
          }
          ASSERT_EQ(got.size(), ref.size());
          EXPECT_TRUE(got == ref) << "the PDL launch's output differs from the plain launch's";
          ++seed;
        }
  EXPECT_EQ(cudaStreamDestroy(cs), cudaSuccess);
}

// A few small prefill batches through the tiles (the compute-sanitizer runs use these):
// partial last blocks, chunks after prefixes (the long one with solo blocks), bf16 and fp8,
// sparse and dense; 16 and 8 q heads per kv head. fp8 caches take the default (the staged bf16
// copy); the tests after it take the tiles' own conversion, the staged copy with its scales in
// the ring, and the staged copy for sparse and dense calls named explicitly (the default today,
// kept whatever the default: the sanitizer runs use it).
void check_small_prefill_batches(const std::vector<DType>& kv_dtypes, uint64_t seed,
                                 const std::function<void(cuda::Tuning&)>& tweak = {}) {
  cuda::Tuning t;
  t.attention.prefill_tiles = 1;
  if (tweak) tweak(t);
  cuda::TuningScope scope(t);
  for (int group : {16, 8})
    for (DType kvd : kv_dtypes)
      for (bool sparse : {true, false}) {
        AttnCase c;
        c.specs = {{0, 45}, {300, 20}, {2100, 9}, {20000, 24}};
        c.nq = group;
        c.kv = kvd;
        c.sparse = sparse;
        check_attention(c, seed++);
      }
}

TEST(CudaAttentionPrefill, SmallBatchesMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_small_prefill_batches({DType::BF16, DType::FP8_E4M3}, 8500);
}

TEST(CudaAttentionPrefill, SmallBatchesFp8InTilesMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_small_prefill_batches({DType::FP8_E4M3}, 8500, [](cuda::Tuning& t) { t.attention.prefill_fp8_stage = 0; });
}

TEST(CudaAttentionPrefill, SmallBatchesFp8StagedScalesMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_small_prefill_batches({DType::FP8_E4M3}, 8500, [](cuda::Tuning& t) {
    t.attention.prefill_fp8_stage = 2;
    t.attention.prefill_fp8_stage_scales = 1;
  });
}

TEST(CudaAttentionPrefill, SmallBatchesFp8StagedSparseMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_small_prefill_batches({DType::FP8_E4M3}, 8500, [](cuda::Tuning& t) { t.attention.prefill_fp8_stage = 2; });
}

// The staged copy with the scales folded in (AttentionTuning::prefill_fp8_stage_fold = 1: K and V
// as bf16(x * scale), the plain bf16 tiles over them) against the CPU, whose K and V are the
// unrounded products: one more bf16 rounding of each element (relative 2^-9), well inside the
// tolerance. The caches' entries past each request's length stay poisoned (NaN bytes and
// scales), so the ragged last blocks carry garbage.
TEST(CudaAttentionPrefill, SmallBatchesFp8FoldedMatchCpu) {
  SKIP_WITHOUT_GPU();
  check_small_prefill_batches({DType::FP8_E4M3}, 8500, [](cuda::Tuning& t) {
    t.attention.prefill_fp8_stage = 2;
    t.attention.prefill_fp8_stage_fold = 1;
  });
}

// The folded copy over the staged tests' shapes (prompts, chunks after prefixes, partial last
// blocks, decode rows, two kv heads with widely spread scales, 16 and 8 q heads per kv head):
// sparse calls (with tiles' full 256 pairs too: topk 32 with 16 heads, 16 with 8) or dense ones.
void check_folded_copy(bool sparse, uint64_t seed) {
  cuda::Tuning t;
  t.attention.prefill_tiles = 1;
  t.attention.prefill_fp8_stage = 2;
  t.attention.prefill_fp8_stage_fold = 1;
  cuda::TuningScope scope(t);
  const std::vector<std::vector<SeqSpec>> sets = {
      {{0, 300}, {1000, 129}, {0, 1}, {127, 130}}, {{20000, 40}, {0, 1500}, {9000, 1}}, {{2047, 2}, {0, 128}}};
  for (int group : {16, 8})
    for (const auto& specs : sets)
      for (int nkv : {1, 2})
        for (int topk : {16, 256 / (128 / group)}) {
          if (!sparse && topk != 16) continue;
          AttnCase c;
          c.specs = specs;
          c.nq = group * nkv, c.nkv = nkv;
          c.kv = DType::FP8_E4M3;
          c.sparse = sparse;
          c.topk = topk;
          c.scale_spread = nkv == 2 ? 20.f : 0.f;
          c.out = nkv == 2 ? DType::BF16 : DType::F32;
          double rel = 0;
          if (nkv == 2) fold_wide_scale_tolerance(c), c.total_rel = &rel;
          check_attention(c, seed++);
          EXPECT_LT(rel, 1.5e-2) << "relative l2 error over the output";
        }
}

TEST(CudaAttentionPrefill, Fp8FoldedSparseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  check_folded_copy(true, 9300);
}

TEST(CudaAttentionPrefill, Fp8FoldedDenseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  check_folded_copy(false, 9400);
}

// The tiles over a staged copy with S on fp8 tensor cores (AttentionTuning::prefill_fp8_qk).
cuda::Tuning fp8_qk_tiles() {
  cuda::Tuning t;
  t.attention.prefill_tiles = 1;
  t.attention.prefill_fp8_stage = 2;
  t.attention.prefill_fp8_qk = 1;
  return t;
}

// S = Q K^T on fp8 tensor cores (AttentionTuning::prefill_fp8_qk = 1: Q per (token, head) row
// and K in e4m3, V folded into the staged copy as bf16). Against a CPU reference whose Q is
// rounded the same way, at the other tests' tolerance: what is left is K's and V's handling and
// P's bf16 rounding, so a wrong layout, swizzle or scale fails as it would for bf16 (the e4m3
// MMA's truncating accumulation, fp8_mma_model.h, moves a score by ~1e-3 of itself, the order of
// Q's bf16 rounding in the other paths, widely spread scales included). Prompts,
// chunks after prefixes, ragged last blocks (the caches past each length stay NaN-poisoned),
// decode rows, two kv heads with widely spread scales, sparse (16 and a tile's 256 pairs) and
// dense, 16 and 8 q heads per kv head, f32 and bf16 Q.
TEST(CudaAttentionPrefill, Fp8QkMatchesCpuWithFp8Q) {
  SKIP_WITHOUT_GPU();
  cuda::TuningScope scope(fp8_qk_tiles());
  uint64_t seed = 9500;
  const std::vector<std::vector<SeqSpec>> sets = {{{0, 300}, {1000, 129}, {0, 1}, {127, 130}},
                                                  {{20000, 40}, {0, 1500}, {9000, 1}},
                                                  {{2047, 2}, {0, 128}},
                                                  {{0, 45}, {300, 20}, {2100, 9}, {20000, 24}}};
  for (int group : {16, 8})
    for (const auto& specs : sets)
      for (int nkv : {1, 2})
        for (int variant = 0; variant < 3; ++variant) {
          AttnCase c;
          c.specs = specs;
          c.nq = group * nkv, c.nkv = nkv;
          c.kv = DType::FP8_E4M3;
          c.sparse = variant < 2;
          c.topk = variant == 1 ? 256 / (128 / group) : 16;
          c.scale_spread = nkv == 2 ? 20.f : 0.f;
          c.out = nkv == 2 ? DType::BF16 : DType::F32;
          c.q = variant == 2 ? DType::F32 : DType::BF16;
          c.q_pad = variant == 2 ? 4 : 8;
          c.cpu_q_fp8 = true;
          check_attention(c, seed++);
        }
}

// The fp8 S path against the exact CPU reference. Q in e4m3 (3 mantissa bits) moves a score by
// sum_d eps_d q_d k_d * sm_scale, eps_d a relative rounding error of at most 2^-4 (rms about
// 2^-4 / sqrt(3) = 0.036): with this test's q and k uniform in [-1, 1] over 128 dims, about 0.012
// rms on a logit of rms 0.33. A simulation of exactly this rounding (e4m3 Q and K/V, no other
// error) gave per-row relative l2 errors up to 0.022 and absolute errors up to 0.020 in 1500 rows
// of 2 keys (fewer keys, larger errors), and 0.009 relative l2 over rows of 300 and 1000 keys.
// Hence per row 6e-2 absolute and 5e-2 relative (the other tests' 2.5e-2 and 2e-2 would fail on
// the tail of the thousands of rows here), and over the whole output a relative l2 error below
// 2e-2, about 2 x the simulation's: the statistic that would catch a systematic error (a wrong
// scale or a misplaced operand gives errors of order 1). No widely spread k scales (scores of
// rms ~10 would make the e4m3 Q error matter much more).
TEST(CudaAttentionPrefill, Fp8QkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  cuda::TuningScope scope(fp8_qk_tiles());
  uint64_t seed = 9600;
  const std::vector<std::vector<SeqSpec>> sets = {{{0, 300}, {1000, 129}, {0, 1}, {127, 130}},
                                                  {{0, 45}, {300, 20}, {2100, 9}, {20000, 24}}};
  for (int group : {16, 8})
    for (const auto& specs : sets)
      for (bool sparse : {true, false}) {
        AttnCase c;
        c.specs = specs;
        c.nq = group;
        c.kv = DType::FP8_E4M3;
        c.sparse = sparse;
        c.max_abs = 6e-2, c.max_rel = 5e-2;
        double rel = 0;
        c.total_rel = &rel;
        check_attention(c, seed++);
        EXPECT_LT(rel, 2e-2) << "relative l2 error over the output, group " << group << (sparse ? " sparse" : " dense");
        std::printf("[ fp8 S ] group %d %s: relative l2 error over the output %.4f\n", group, sparse ? "sparse" : "dense", rel);
      }
}

// The v2 decode indexer with few, long chunks (forced): the shared-memory stage ring wraps
// many times and the last-CTA merge sees 1 or 2 chunk lists.
TEST(CudaIndexer, V2LongChunksMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 4800;
  for (int max_chunks : {1, 2, 3}) {
    cuda::Tuning t;
    t.indexer.chunked_max_chunks = max_chunks;
    cuda::TuningScope scope(t);
    for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
      for (int H : {1, 4}) {
        IndexerCase c;
        c.specs = H == 1 ? kDecodeSpecs : kSpecSpecs;
        c.cache = cd;
        c.H = H;
        c.init = 1;
        c.kernel = cuda::IndexerKernel::kDecodeChunked;
        SCOPED_TRACE("max chunks " + std::to_string(max_chunks));
        check_indexer_once(c, seed++);
      }
    }
  }
}

// The fused decode indexer inside a CUDA graph captured at a larger max_seq_len (the serving
// engine's capture) gives the same result as an eager call.
// A decode batch (kDecodeSpecs, blocks scattered over a pool, 40 blocks a row) on the device
// with a random index cache and bf16 q, and indexer parameters for it (topk 16, one local
// block; outputs into d_a or d_b) whose max_seq_len is the capture-time bound (the whole row),
// for the graph-replay tests.
struct GraphReplayInputs {
  Rng rng;
  PagedBatch b;
  IndexCache ic;
  int64_t T;
  TypedBuffer q;
  DevBatch db;
  Dev d_q, d_cache, d_a, d_b;
  ops::IndexerParams g;

  GraphReplayInputs(uint64_t seed, DType cache)
      : rng(seed),
        b(make_paged_batch(kDecodeSpecs, 128, rng, 3, 40)),
        ic(random_cache(b, cache, rng)),
        T(b.num_tokens),
        q(TypedBuffer::from(DType::BF16, random_vector(size_t(T * 128), rng))),
        db(b),
        d_q(Dev::of(q)),
        d_cache(Dev::of(ic.k)),
        d_a(size_t(T) * 16 * 4),
        d_b(size_t(T) * 16 * 4) {
    db.view.max_seq_len = b.max_blocks_per_seq * 128;  // capture-time bound
    g.index_q = d_q.p();
    g.q_dtype = DType::BF16;
    g.q_stride = 128;
    g.num_index_heads = 1;
    g.index_dim = 128;
    g.score_scale = 0.1f;
    g.cache = ic.view();
    g.cache.k = d_cache.p();
    g.batch = db.view;
    g.topk = 16;
    g.local_blocks = 1;
  }
  std::vector<int32_t> a_ids() const { return d_a.get<int32_t>(size_t(T) * 16); }
  std::vector<int32_t> b_ids() const { return d_b.get<int32_t>(size_t(T) * 16); }

  // `kernel` run eagerly and replayed from a captured graph both give the chunked kernel's ids.
  void expect_eager_and_graph_match_v2(cuda::IndexerKernel kernel, const std::string& name) {
    g.topk_idx = d_a.as<int32_t>();
    d_a.poison(0x55);
    ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, cuda::IndexerKernel::kDecodeChunked));
    device_synchronize(kGpu);
    g.topk_idx = d_b.as<int32_t>();
    d_b.poison(0x55);
    ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, kernel));
    device_synchronize(kGpu);
    EXPECT_EQ(a_ids(), b_ids()) << "eager " << name << " vs v2";
    d_b.poison(0x55);
    ASSERT_TRUE(cuda::run_indexer_graph_check(g, kernel));
    EXPECT_EQ(a_ids(), b_ids()) << "graph " << name << " vs v2";
  }

 private:
  static IndexCache random_cache(const PagedBatch& b, DType dtype, Rng& rng) {
    IndexCache ic(dtype, b.num_blocks, 128, 128);
    fill_caches_random(b, nullptr, &ic, rng);
    return ic;
  }
};

TEST(CudaIndexer, GraphReplayMatchesEager) {
  SKIP_WITHOUT_GPU();
  GraphReplayInputs in(8000, DType::FP8_E4M3);
  ops::IndexerParams& g = in.g;
  Dev &d_a = in.d_a, &d_b = in.d_b;
  g.topk_idx = d_a.as<int32_t>();
  d_a.poison(0x55);
  for (auto kernel : {cuda::IndexerKernel::kAuto, cuda::IndexerKernel::kDecodeChunked,
                      cuda::IndexerKernel::kDecodeCluster, cuda::IndexerKernel::kDecodePersistent}) {
    SCOPED_TRACE("kernel " + std::to_string(int(kernel)));
    g.topk_idx = d_a.as<int32_t>();
    d_a.poison(0x55);
    ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, kernel));
    device_synchronize(kGpu);
    g.topk_idx = d_b.as<int32_t>();
    d_b.poison(0x55);
    ASSERT_TRUE(cuda::run_indexer_graph_check(g, kernel));
    EXPECT_EQ(in.a_ids(), in.b_ids());
  }
}

// Tuning that forces the cluster kernel's cluster size and groups, or the persistent kernel's
// unit, ring stages, grid and static units (0: the rule for each).
cuda::Tuning cluster_split(int cluster, int groups) {
  cuda::Tuning t;
  t.indexer.cluster_size = cluster;
  t.indexer.cluster_groups = groups;
  return t;
}
cuda::Tuning persistent_shape(int unit, int stages, int grid, int statics) {
  cuda::Tuning t;
  t.indexer.persistent_unit = unit;
  t.indexer.persistent_stages = stages;
  t.indexer.persistent_grid = grid;
  t.indexer.persistent_statics = statics;
  return t;
}

// The decode cases under a forced grid of one kernel: one head over kDecodeSpecs and
// four heads over kSpecSpecs, bf16 and fp8, with and without ties.
void check_forced_decode_cases(cuda::IndexerKernel kernel, const std::string& grid, uint64_t& seed) {
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (int H : {1, 4}) {
      IndexerCase c;
      c.specs = H == 1 ? kDecodeSpecs : kSpecSpecs;
      c.cache = cd;
      c.H = H;
      c.init = 1;
      c.local = 2;
      c.topk = H == 1 ? 16 : 32;
      c.kernel = kernel;
      SCOPED_TRACE(grid);
      check_indexer_once(c, seed++);
      c.ties = true;
      check_indexer_once(c, seed++);
    }
  }
}

// The v3 decode indexer with forced cluster sizes and group counts: G > 1 runs the second,
// global merge level (partials + per-rank counters); C = 1 gives one CTA long chunks (the stage
// ring wraps many times); C = 8 with short requests leaves CTAs with empty chunks.
TEST(CudaIndexer, V3ForcedSplitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9000;
  const std::vector<std::pair<int, int>> splits = {{1, 1}, {2, 3}, {8, 2}, {4, 5}, {1, 4}, {8, 1}, {8, 9}};
  for (const auto& [cl, gr] : splits) {
    cuda::TuningScope scope(cluster_split(cl, gr));
    check_forced_decode_cases(cuda::IndexerKernel::kDecodeCluster,
                              "v3 cluster " + std::to_string(cl) + " groups " + std::to_string(gr), seed);
  }
}

// Long contexts (up to 1095 blocks: automatic grids with G > 1 and chunks of up to 256 blocks)
// with several rows and heads, under the automatic grid and forced ones.
TEST(CudaIndexer, V3LongContextMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9100;
  const std::vector<SeqSpec> specs = {{140000, 1}, {20000, 1}, {33000, 4}, {0, 1}, {25599, 2}};
  const std::vector<std::pair<int, int>> splits = {{0, 0}, {1, 1}, {8, 1}, {2, 7}};
  for (const auto& [cl, gr] : splits) {
    cuda::TuningScope scope(cluster_split(cl, gr));
    for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
      IndexerCase c;
      c.specs = specs;
      c.cache = cd;
      c.H = 2;
      c.init = 1;
      c.topk = 32;
      c.kernel = cuda::IndexerKernel::kDecodeCluster;
      SCOPED_TRACE("v3 cluster " + std::to_string(cl) + " groups " + std::to_string(gr));
      check_indexer_once(c, seed++);
    }
  }
  // The same long batch through v2, v3 and v4 with a q in fp32 rounded to fp8 (q_in_cache_dtype).
  for (auto kernel : {cuda::IndexerKernel::kDecodeChunked, cuda::IndexerKernel::kDecodeCluster,
                      cuda::IndexerKernel::kDecodePersistent}) {
    IndexerCase c;
    c.specs = specs;
    c.cache = DType::FP8_E4M3;
    c.q_dtype = DType::F32;
    c.q_in_cache = true;
    c.H = 1;
    c.kernel = kernel;
    check_indexer_once(c, seed);
  }
  // v4 with an fp8 cache from 256 blocks a request runs two CTAs per SM (its own register
  // budget): the same batch with bf16 q, two heads, one init block.
  IndexerCase c;
  c.specs = specs;
  c.cache = DType::FP8_E4M3;
  c.H = 2;
  c.init = 1;
  c.topk = 32;
  c.kernel = cuda::IndexerKernel::kDecodePersistent;
  check_indexer_once(c, seed + 1);
}

// The v4 decode indexer with forced shapes: small grids (most units claimed from the counter,
// the key ring and the unit slots wrap many times), units longer than the ring, one CTA doing
// all the work, and long units with several static ones per CTA.
TEST(CudaIndexer, V4ForcedShapesMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9800;
  struct Shape {
    int unit, stages, grid, statics;
  };
  const std::vector<Shape> shapes = {{1, 2, 8, 1},  {3, 2, 5, 1},  {8, 4, 0, 2},  {2, 6, 16, 3},
                                     {5, 3, 1, 1},  {4, 2, 3, 4},  {32, 3, 0, 1}, {12, 4, 6, 2}};
  for (const Shape& sh : shapes) {
    cuda::TuningScope scope(persistent_shape(sh.unit, sh.stages, sh.grid, sh.statics));
    check_forced_decode_cases(cuda::IndexerKernel::kDecodePersistent,
                              "v4 unit " + std::to_string(sh.unit) + " stages " + std::to_string(sh.stages) +
                                  " grid " + std::to_string(sh.grid) + " statics " + std::to_string(sh.statics),
                              seed);
  }
}

// v4 in a CUDA graph captured at a larger max_seq_len than the live lengths (units past them
// are skipped), under forced shapes with dynamic claims: the unit counter and the request
// counters must return to zero between replays.
TEST(CudaIndexer, V4GraphReplayMatchesEager) {
  SKIP_WITHOUT_GPU();
  GraphReplayInputs in(9450, DType::FP8_E4M3);
  in.g.init_blocks = 1;
  for (const auto& sh : std::vector<std::array<int, 4>>{{0, 0, 0, 0}, {1, 2, 8, 1}, {2, 3, 20, 2}, {3, 2, 1, 1}}) {
    SCOPED_TRACE("v4 unit " + std::to_string(sh[0]) + " stages " + std::to_string(sh[1]) + " grid " +
                 std::to_string(sh[2]) + " statics " + std::to_string(sh[3]));
    cuda::TuningScope scope(persistent_shape(sh[0], sh[1], sh[2], sh[3]));
    in.expect_eager_and_graph_match_v2(cuda::IndexerKernel::kDecodePersistent, "v4");
  }
}

// v4's selection on long rows (up to 313 blocks, in the two-CTA builds: bf16, and fp8 from 256
// blocks a request): exact ties on the value grid (many blocks share a score, so the order rests
// on the tie rule), and several rows and heads a request.
TEST(CudaIndexer, V4LongRowsExactTiesMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9500;
  const std::vector<SeqSpec> specs = {{40000, 1}, {16400, 2}, {33000, 1}, {300, 1}, {8191, 3}};
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (bool ties : {true, false}) {
      IndexerCase c;
      c.specs = specs;
      c.cache = cd;
      c.ties = ties;
      c.H = ties ? 1 : 2;
      c.topk = ties ? 16 : 32;
      c.init = ties ? 0 : 1;
      c.kernel = cuda::IndexerKernel::kDecodePersistent;
      check_indexer_once(c, seed++);
    }
  }
}

// v4 with claimed units and the polled finish (persistent_claim_poll 1) under forced shapes:
// small grids (most units claimed, slots and ring wrapping), several static units, long units.
// A polling finisher waits for units that other CTAs claimed.
TEST(CudaIndexer, V4ClaimedUnitsPolledFinishMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9850;
  struct Shape {
    int unit, stages, grid, statics;
  };
  const std::vector<Shape> shapes = {{1, 2, 8, 1}, {3, 2, 5, 1}, {2, 6, 16, 3}, {5, 3, 1, 1}, {12, 4, 6, 2}};
  for (const Shape& sh : shapes) {
    cuda::Tuning t = persistent_shape(sh.unit, sh.stages, sh.grid, sh.statics);
    t.indexer.persistent_claim_poll = 1;
    cuda::TuningScope scope(t);
    check_forced_decode_cases(cuda::IndexerKernel::kDecodePersistent,
                              "v4 polled claims unit " + std::to_string(sh.unit) + " stages " +
                                  std::to_string(sh.stages) + " grid " + std::to_string(sh.grid) + " statics " +
                                  std::to_string(sh.statics),
                              seed);
  }
}

// The same in a CUDA graph captured at a larger max_seq_len: the poll scratch and the unit
// counter must return to zero between replays.
TEST(CudaIndexer, V4ClaimedUnitsPolledGraphReplayMatchesEager) {
  SKIP_WITHOUT_GPU();
  GraphReplayInputs in(9460, DType::FP8_E4M3);
  in.g.init_blocks = 1;
  for (const auto& sh : std::vector<std::array<int, 4>>{{1, 2, 8, 1}, {2, 3, 20, 2}, {3, 2, 1, 1}}) {
    SCOPED_TRACE("v4 polled claims unit " + std::to_string(sh[0]) + " stages " + std::to_string(sh[1]) + " grid " +
                 std::to_string(sh[2]) + " statics " + std::to_string(sh[3]));
    cuda::Tuning t = persistent_shape(sh[0], sh[1], sh[2], sh[3]);
    t.indexer.persistent_claim_poll = 1;
    cuda::TuningScope scope(t);
    in.expect_eager_and_graph_match_v2(cuda::IndexerKernel::kDecodePersistent, "v4");
  }
}

// One draw of a case (long cases: the inputs and the CPU reference once) through each of
// `kernels` on poisoned outputs; a kernel without a plan for the shape is skipped where
// `may_refuse` (the cluster and persistent kernels).
void check_indexer_draw(const IndexerInputs& c, uint64_t seed, const std::vector<cuda::IndexerKernel>& kernels) {
  SCOPED_TRACE(c.describe() + " seed " + std::to_string(seed));
  IndexerRef r(c, seed);
  for (cuda::IndexerKernel k : kernels) {
    SCOPED_TRACE("kernel " + std::to_string(int(k)));
    r.d_idx.poison(0x55);
    r.d_scores.poison(0xff);
    const bool may_refuse = k == cuda::IndexerKernel::kDecodeCluster || k == cuda::IndexerKernel::kDecodePersistent;
    const bool ran = cuda::run_indexer_kernel(r.gpu, nullptr, k);
    if (!ran && may_refuse) continue;
    ASSERT_TRUE(ran);
    device_synchronize(kGpu);
    r.expect_gpu_matches(true);
  }
}

// Long contexts up to 524288 tokens (4096 blocks: twice v4's limit with one unit a CTA, the
// longest request of the long-context plan). A batch of a 4096-block request with shorter ones
// (547 blocks: inside the plan's range; a short row; an empty context), fp8 and bf16, through
// every decode kernel: the planner's (fp8: v4 under the long-context plan, units of 2 claimed,
// polled finish; bf16: v3), v2 (chunks of 32 blocks; 4 chunks of 1024 when forced to 2), v3
// (groups > 1) and v4 where it has a plan; then one 4096-block request alone (b1).
const std::vector<SeqSpec> kLongSpecs = {{524287, 1}, {70000, 1}, {300, 1}, {0, 1}};
const std::vector<cuda::IndexerKernel> kDecodeKernels = {cuda::IndexerKernel::kAuto, cuda::IndexerKernel::kDecodeChunked,
                                                         cuda::IndexerKernel::kDecodeCluster,
                                                         cuda::IndexerKernel::kDecodePersistent};

TEST(CudaIndexer, LongContextMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9900;
  for (DType cd : {DType::FP8_E4M3, DType::BF16}) {
    IndexerInputs c;
    c.specs = kLongSpecs;
    c.cache = cd;
    c.init = 1;
    check_indexer_draw(c, seed++, kDecodeKernels);
    // v2 at its chunk limit (1024 blocks a chunk, the whole table in shared memory).
    cuda::Tuning t;
    t.indexer.chunked_max_chunks = 2;
    cuda::TuningScope scope(t);
    check_indexer_draw(c, seed++, {cuda::IndexerKernel::kDecodeChunked});
  }
  for (DType cd : {DType::FP8_E4M3, DType::BF16}) {
    IndexerInputs c;
    c.specs = {{524287, 1}};
    c.cache = cd;
    c.H = 2;
    c.topk = 32;
    check_indexer_draw(c, seed++, kDecodeKernels);
  }
}

// The long-context plan's variants on fp8 caches: forced unit sizes (1; 3: units that straddle a
// request's end; 32), the counter finish with claims (persistent_claim_poll 0), exact ties (the
// order rests on the lower-block rule across units of different CTAs), and the plan off (-1: v4
// refuses 4096 blocks and the planner falls back to v2). Then q in fp32 rounded to fp8
// (q_in_cache_dtype) with two heads, and speculative rows with four heads, through the plan.
TEST(CudaIndexer, LongContextPlanVariantsMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9950;
  const std::vector<SeqSpec> specs = {{524287, 1}, {65600, 1}, {140000, 1}};
  struct Variant {
    int long_unit, claim_poll;
    bool ties;
  };
  for (const Variant& v : std::vector<Variant>{
           {0, -1, true}, {1, -1, false}, {3, -1, false}, {32, -1, false}, {2, 0, true}, {-1, -1, false}}) {
    cuda::Tuning t;
    t.indexer.persistent_long_unit = v.long_unit;
    t.indexer.persistent_claim_poll = v.claim_poll;
    cuda::TuningScope scope(t);
    SCOPED_TRACE("long unit " + std::to_string(v.long_unit) + " claim poll " + std::to_string(v.claim_poll));
    IndexerInputs c;
    c.specs = specs;
    c.cache = DType::FP8_E4M3;
    c.init = 1;
    c.local = 2;
    check_indexer_draw(c, seed++, {cuda::IndexerKernel::kAuto, cuda::IndexerKernel::kDecodePersistent});
    if (v.ties) {
      c.ties = true;
      c.init = 0;
      c.local = 1;
      check_indexer_draw(c, seed++, {cuda::IndexerKernel::kAuto});
    }
  }
  IndexerInputs c;
  c.specs = {{200000, 1}, {131071, 1}};
  c.cache = DType::FP8_E4M3;
  c.q_dtype = DType::F32;
  c.q_in_cache = true;
  c.H = 2;
  check_indexer_draw(c, seed++, {cuda::IndexerKernel::kAuto});
  // Speculative rows: 4 query rows x 4 heads (16 vectors: the 16-row MMA) under the plan.
  IndexerInputs sp;
  sp.specs = {{140000, 4}, {70000, 2}, {66000, 3}};
  sp.cache = DType::FP8_E4M3;
  sp.H = 4;
  sp.topk = 32;
  sp.init = 1;
  check_indexer_draw(sp, seed++, {cuda::IndexerKernel::kAuto, cuda::IndexerKernel::kDecodeChunked});
}

// Sparse decode attention at long contexts: selections anywhere in 4096 blocks (b1 at 524288,
// and a batch with a 131072-token request), fp8 and bf16.
TEST(CudaAttention, SparseDecodeLongContextMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 5950;
  for (DType kvd : {DType::BF16, DType::FP8_E4M3}) {
    AttnCase c;
    c.specs = {{524287, 1}};
    c.kv = kvd;
    check_attention(c, seed++);
    c.specs = {{131071, 1}, {524287, 1}, {9000, 1}};
    c.out = DType::BF16;
    check_attention(c, seed++);
  }
}

// Many requests (v3: more than one wave of CTAs, cluster size 1; v4: many units per CTA) of
// random decode / speculative shapes.
TEST(CudaIndexer, ManySequencesMatchCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(9200);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<SeqSpec> specs;
    const int n = trial == 0 ? 300 : 70 + 40 * trial;
    for (int i = 0; i < n; ++i) {
      SeqSpec sp;
      sp.q_len = rng.uniform_int(1, 2);
      sp.cached = rng.uniform_int(0, 3000);
      specs.push_back(sp);
    }
    for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
      for (auto kernel : {cuda::IndexerKernel::kDecodeCluster, cuda::IndexerKernel::kDecodePersistent}) {
        IndexerCase c;
        c.specs = specs;
        c.cache = cd;
        c.H = 2;
        c.init = trial % 2;
        c.topk = 8 + 8 * trial;
        c.kernel = kernel;
        check_indexer_once(c, 9300 + uint64_t(trial) * 2 + (cd == DType::FP8_E4M3));
      }
    }
  }
}

// v3 in a CUDA graph captured at a larger max_seq_len with the global merge level forced on:
// the per-rank counters must return to zero between replays.
TEST(CudaIndexer, V3GraphReplayWithGroupsMatchesEager) {
  SKIP_WITHOUT_GPU();
  GraphReplayInputs in(9400, DType::BF16);
  in.g.init_blocks = 1;
  for (const auto& [cl, gr] : std::vector<std::pair<int, int>>{{0, 0}, {8, 3}, {2, 5}, {1, 2}}) {
    SCOPED_TRACE("v3 cluster " + std::to_string(cl) + " groups " + std::to_string(gr));
    cuda::TuningScope scope(cluster_split(cl, gr));
    in.expect_eager_and_graph_match_v2(cuda::IndexerKernel::kDecodeCluster, "v3");
  }
}

// Decode indexer parameters of the bitwise comparisons between fused variants: H index heads of
// queries (dtype qd, row stride q_stride) at q, the index cache `cache` with its keys at keys,
// top-K with one forced initial and one local block; fp8 caches with f32 queries round q to e4m3.
ops::IndexerParams bitwise_params(void* q, DType qd, int64_t q_stride, int H, ops::IndexCacheView cache, void* keys,
                                  const ops::BatchView& batch, int K) {
  ops::IndexerParams g;
  g.index_q = q;
  g.q_dtype = qd;
  g.q_stride = q_stride;
  g.num_index_heads = H;
  g.index_dim = 128;
  g.score_scale = 0.0883883f;
  g.q_in_cache_dtype = qd == DType::F32 && cache.dtype == DType::FP8_E4M3;
  g.cache = cache;
  g.cache.k = keys;
  g.batch = batch;
  g.topk = K;
  g.init_blocks = 1;
  g.local_blocks = 1;
  return g;
}

// One random decode-indexer case (cache dtype cd, query dtype qd, H index heads, q rows padded
// by q_pad elements, top-16) run through each kernel of `kernels` twice: under the tuning that
// set(t, 1) makes and under the one set(t, 0) makes. Expects the same block ids and block scores
// bit for bit.
void expect_same_under_toggle(DType cd, DType qd, const std::vector<SeqSpec>& specs, int H, int64_t q_pad,
                              std::initializer_list<cuda::IndexerKernel> kernels, Rng& rng,
                              const std::function<void(cuda::Tuning&, int)>& set) {
  PagedBatch b = make_paged_batch(specs, 128, rng);
  IndexCache ic(cd, b.num_blocks, 128, 128);
  fill_caches_random(b, nullptr, &ic, rng, 1.0f);
  const int64_t T = b.num_tokens, q_stride = H * 128 + q_pad;
  auto qv = random_vector(size_t(T * q_stride), rng);
  TypedBuffer q = TypedBuffer::from(qd, qv);
  DevBatch db(b);
  const int K = 16, mbps = b.max_blocks_per_seq;
  const size_t ni = size_t(T) * H * K, ns = size_t(T) * H * mbps;
  Dev d_q = Dev::of(q), d_cache = Dev::of(ic.k);
  ops::IndexerParams g = bitwise_params(d_q.p(), qd, q_stride, H, ic.view(), d_cache.p(), db.view, K);
  for (auto kernel : kernels) {
    Dev d_i1(ni * 4), d_s1(ns * 4), d_i0(ni * 4), d_s0(ns * 4);
    d_i1.poison(0x55), d_s1.poison(0xff), d_i0.poison(0x66), d_s0.poison(0xfe);
    auto run = [&](int on, Dev& idx, Dev& scores) {
      cuda::Tuning t;
      set(t, on);
      cuda::TuningScope scope(t);
      g.topk_idx = idx.as<int32_t>();
      g.block_scores = scores.as<float>();
      return cuda::run_indexer_kernel(g, nullptr, kernel);
    };
    const bool on = run(1, d_i1, d_s1);
    const bool off = run(0, d_i0, d_s0);
    ASSERT_TRUE(on && off);
    device_synchronize(kGpu);
    EXPECT_EQ(d_i1.get<int32_t>(ni), d_i0.get<int32_t>(ni)) << "kernel " << int(kernel);
    EXPECT_EQ(d_s1.bytes(ns * 4), d_s0.bytes(ns * 4)) << "kernel " << int(kernel);
  }
}

// With at most 8 query vectors a request, v2, v3 and v4 score with the narrow MMA (keys as the
// MMA's rows): the same block scores and ids, bit for bit, as the 16-row MMA.
TEST(CudaIndexer, NarrowMmaMatchesWideBitwise) {
  SKIP_WITHOUT_GPU();
  Rng rng(9600);
  struct Case {
    const std::vector<SeqSpec>* specs;
    int H;
  };
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (DType qd : {DType::BF16, DType::F32}) {
      for (Case cs : {Case{&kDecodeSpecs, 1}, Case{&kDecodeSpecs, 4}, Case{&kSpecSpecs, 2}, Case{&kSpecSpecs, 1}}) {
        SCOPED_TRACE("cache " + name(cd) + " q " + name(qd) + " H " + std::to_string(cs.H) + " rows " +
                     std::to_string((*cs.specs)[0].q_len));
        expect_same_under_toggle(
            cd, qd, *cs.specs, cs.H, 8,
            {cuda::IndexerKernel::kDecodeChunked, cuda::IndexerKernel::kDecodeCluster,
             cuda::IndexerKernel::kDecodePersistent},
            rng, [](cuda::Tuning& t, int on) { t.indexer.narrow_mma = on != 0; });
      }
    }
  }
}

// The decode indexers v3 and v4 with their key copies under the L2 evict-first policy, forced
// on and off: the same outputs bit for bit.
TEST(CudaIndexer, L2EvictFirstMatchesBitwise) {
  SKIP_WITHOUT_GPU();
  Rng rng(9650);
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (const std::vector<SeqSpec>* specs : {&kDecodeSpecs, &kSpecSpecs}) {
      SCOPED_TRACE("cache " + name(cd) + " rows " + std::to_string((*specs)[0].q_len));
      expect_same_under_toggle(cd, DType::BF16, *specs, 1, 0,
                               {cuda::IndexerKernel::kDecodeCluster, cuda::IndexerKernel::kDecodePersistent}, rng,
                               [](cuda::Tuning& t, int on) { t.indexer.l2_evict_first = on; });
    }
  }
}

// v3 and v4 give v2's outputs bit for bit (same MMA order, same maxima, same ranking), also with
// a q row stride that is not a multiple of 16 bytes (v3's scalar q loads, v4's plain q copy) and
// several rows/heads.
TEST(CudaIndexer, BitwiseMatchesV2) {
  SKIP_WITHOUT_GPU();
  Rng rng(9500);
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (DType qd : {DType::BF16, DType::F32}) {
      for (int64_t pad : {int64_t(3), int64_t(8)}) {
        SCOPED_TRACE("cache " + name(cd) + " q " + name(qd) + " pad " + std::to_string(pad));
        PagedBatch b = make_paged_batch(kSpecSpecs, 128, rng);
        IndexCache ic(cd, b.num_blocks, 128, 128);
        fill_caches_random(b, nullptr, &ic, rng, 1.0f);
        const int H = 2;
        const int64_t T = b.num_tokens, q_stride = H * 128 + pad;
        auto qv = random_vector(size_t(T * q_stride), rng);
        TypedBuffer q = TypedBuffer::from(qd, qv);
        DevBatch db(b);
        const int K = 24, mbps = b.max_blocks_per_seq;
        Dev d_q = Dev::of(q), d_cache = Dev::of(ic.k);
        Dev d_i2(size_t(T) * H * K * 4), d_i3(size_t(T) * H * K * 4), d_i4(size_t(T) * H * K * 4);
        Dev d_s2(size_t(T) * H * mbps * 4), d_s3(size_t(T) * H * mbps * 4), d_s4(size_t(T) * H * mbps * 4);
        ops::IndexerParams g = bitwise_params(d_q.p(), qd, q_stride, H, ic.view(), d_cache.p(), db.view, K);
        d_i2.poison(0x55), d_i3.poison(0x55), d_s2.poison(0xff), d_s3.poison(0xff);
        d_i4.poison(0x55), d_s4.poison(0xff);
        g.topk_idx = d_i2.as<int32_t>();
        g.block_scores = d_s2.as<float>();
        ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, cuda::IndexerKernel::kDecodeChunked));
        g.topk_idx = d_i3.as<int32_t>();
        g.block_scores = d_s3.as<float>();
        ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, cuda::IndexerKernel::kDecodeCluster));
        g.topk_idx = d_i4.as<int32_t>();
        g.block_scores = d_s4.as<float>();
        ASSERT_TRUE(cuda::run_indexer_kernel(g, nullptr, cuda::IndexerKernel::kDecodePersistent));
        device_synchronize(kGpu);
        EXPECT_EQ(d_i2.get<int32_t>(size_t(T) * H * K), d_i3.get<int32_t>(size_t(T) * H * K));
        EXPECT_EQ(d_s2.bytes(size_t(T) * H * mbps * 4), d_s3.bytes(size_t(T) * H * mbps * 4));
        EXPECT_EQ(d_i2.get<int32_t>(size_t(T) * H * K), d_i4.get<int32_t>(size_t(T) * H * K)) << "v4";
        EXPECT_EQ(d_s2.bytes(size_t(T) * H * mbps * 4), d_s4.bytes(size_t(T) * H * mbps * 4)) << "v4";
      }
    }
  }
}


// ---------------------------------------------------------------------------------------------
// One decode step, kernels back to back

// The decode-step kernels on one stream without synchronisation (cache write -> indexer ->
// sparse attention -> dense attention; with programmatic dependent launch each may start before
// the previous one has ended and reads metadata and older cache blocks early) give bitwise the
// results of the same kernels run one at a time with the stream synchronised between them. The
// new tokens' cache slots hold stale random values until the cache write stores theirs, and the
// indexer has no forced blocks (a request's newest block scores by its keys), so a kernel that
// read a new token's key or value before the cache write had stored it would differ.
// `batch` decode requests: 32 (the boundary lengths and random ones) or a few (at most 4: the
// default PDL choice then launches the attention with PDL too).
void check_decode_step(DType cache_dtype, cuda::IndexerKernel kernel, uint64_t seed, int batch = 32) {
  SCOPED_TRACE("cache " + name(cache_dtype) + " indexer kernel " + std::to_string(int(kernel)) + " seed " +
               std::to_string(seed) + " batch " + std::to_string(batch));
  Rng rng(seed);
  const QkvLayout l = QkvLayout::make(16, 1, 128, 1, 128, 64, 8);
  const QkvWeights w = QkvWeights::make(l, 16384, rng);
  std::vector<SeqSpec> specs;
  if (batch >= 13) {
    for (int c : {0, 127, 128, 129, 255, 256, 1023, 1024, 2047, 2048, 4096, 9000, 9215}) specs.push_back({c, 1});
  } else {
    for (int c : {9215, 128, 4096, 0}) {
      if (int(specs.size()) < batch) specs.push_back({c, 1});
    }
  }
  while (int(specs.size()) < batch) specs.push_back({rng.uniform_int(1, 9215), 1});
  std::shuffle(specs.begin(), specs.end(), rng.gen);
  PagedBatch b = make_paged_batch(specs, 128, rng);
  KvCache kv(cache_dtype, b.num_blocks, 128, 1, 128);
  IndexCache ic(cache_dtype, b.num_blocks, 128, 128);
  fill_caches_random(b, &kv, &ic, rng, 1.0f);  // the new tokens' slots too: stale values
  const int64_t T = b.num_tokens;
  const int mbps = b.max_blocks_per_seq, K = 16, HD = 16 * 128;
  TypedBuffer rows = TypedBuffer::from(DType::BF16, random_vector(size_t(T * l.row_stride), rng, -2.f, 2.f));

  Dev d_rows(rows.bytes.size()), d_k(kv.k.bytes.size()), d_v(kv.v.bytes.size());
  Dev d_ks(kv.k_scale.size() * 4), d_vs(kv.v_scale.size() * 4), d_ic(ic.k.bytes.size());
  Dev d_qn = Dev::of(w.q_norm), d_kn = Dev::of(w.k_norm), d_iqn = Dev::of(w.index_q_norm),
      d_ikn = Dev::of(w.index_k_norm), d_cs = Dev::of(w.cos_sin);
  Dev d_pos = Dev::of(b.positions), d_slots = Dev::of(b.slot_mapping);
  DevBatch db(b);
  Dev d_topk(size_t(T) * K * 4), d_scores(size_t(T) * mbps * 4), d_sparse(size_t(T) * HD * 2),
      d_dense(size_t(T) * HD * 2);
  const bool fp8 = cache_dtype == DType::FP8_E4M3;

  auto qkv = make_qkv_params(l, w, d_rows.p(), DType::BF16, T, d_pos.as<int32_t>(), d_slots.as<int64_t>(), kv, &ic);
  qkv.q_norm = d_qn.p(), qkv.k_norm = d_kn.p(), qkv.index_q_norm = d_iqn.p(), qkv.index_k_norm = d_ikn.p();
  qkv.cos_sin = d_cs.as<float>();
  qkv.kv.k = d_k.p(), qkv.kv.v = d_v.p();
  qkv.kv.k_scale = fp8 ? d_ks.as<float>() : nullptr;
  qkv.kv.v_scale = fp8 ? d_vs.as<float>() : nullptr;
  qkv.index_cache.k = d_ic.p();

  ops::IndexerParams ip;
  ip.index_q = static_cast<uint8_t*>(d_rows.p()) + l.index_q_offset * 2;
  ip.q_dtype = DType::BF16;
  ip.q_stride = l.row_stride;
  ip.num_index_heads = 1;
  ip.index_dim = 128;
  ip.score_scale = float(1.0 / std::sqrt(128.0) * 1.4426950408889634);
  ip.cache = qkv.index_cache;
  ip.batch = db.view;
  ip.topk = K;
  ip.init_blocks = 0;
  ip.local_blocks = 0;
  ip.topk_idx = d_topk.as<int32_t>();
  ip.block_scores = d_scores.as<float>();

  ops::AttentionParams ap;
  ap.q = d_rows.p();
  ap.q_dtype = DType::BF16;
  ap.q_stride = l.row_stride;
  ap.out_dtype = DType::BF16;
  ap.out_stride = HD;
  ap.num_q_heads = 16;
  ap.num_kv_heads = 1;
  ap.head_dim = 128;
  ap.sm_scale = float(1.0 / std::sqrt(128.0));
  ap.kv = qkv.kv;
  ap.batch = db.view;

  cudaStream_t cs = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
  const ops::Stream stream{kGpu, cs};
  struct Out {
    std::vector<uint8_t> topk, scores, sparse, dense, ic, k;
  };
  auto run = [&](bool separated) {
    copy_to_device(kGpu, d_rows.p(), rows.data(), rows.bytes.size());
    copy_to_device(kGpu, d_k.p(), kv.k.data(), kv.k.bytes.size());
    copy_to_device(kGpu, d_v.p(), kv.v.data(), kv.v.bytes.size());
    if (fp8) {
      copy_to_device(kGpu, d_ks.p(), kv.k_scale.data(), kv.k_scale.size() * 4);
      copy_to_device(kGpu, d_vs.p(), kv.v_scale.data(), kv.v_scale.size() * 4);
    }
    copy_to_device(kGpu, d_ic.p(), ic.k.data(), ic.k.bytes.size());
    d_topk.poison(0x55), d_scores.poison(0xff), d_sparse.poison(0xff), d_dense.poison(0xff);
    device_synchronize(kGpu);
    auto step = [&] {
      if (separated) {
        EXPECT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
      }
    };
    ops::qkv_norm_rope_cache(qkv, stream);
    step();
    // The kernel under test (the chunked one where it has no plan: what run_indexer does).
    if (!cuda::run_indexer_kernel(ip, cs, kernel)) {
      EXPECT_TRUE(cuda::run_indexer_kernel(ip, cs, cuda::IndexerKernel::kDecodeChunked));
    }
    step();
    ops::AttentionParams sp = ap;
    sp.out = d_sparse.p();
    sp.topk_idx = d_topk.as<int32_t>();
    sp.topk = K;
    ops::attention(sp, stream);
    step();
    ops::AttentionParams dp = ap;
    dp.out = d_dense.p();
    ops::attention(dp, stream);
    EXPECT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
    return Out{d_topk.bytes(size_t(T) * K * 4), d_scores.bytes(size_t(T) * mbps * 4), d_sparse.bytes(size_t(T) * HD * 2),
               d_dense.bytes(size_t(T) * HD * 2), d_ic.bytes(ic.k.bytes.size()), d_k.bytes(kv.k.bytes.size())};
  };
  // Every kernel with PDL (7), then the default choice (-1: the indexer, and attention for small
  // batches).
  for (const int mask : {7, -1}) {
    cuda::Tuning t;
    t.launch.pdl_mask = mask;
    cuda::TuningScope scope(t);
    const Out ref = run(true);
    // The reference is not the stale cache: the cache write changed every new token's slot.
    EXPECT_NE(ref.ic, ic.k.bytes);
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE("PDL mask " + std::to_string(mask) + ", back to back, repeat " + std::to_string(rep));
      const Out got = run(false);
      EXPECT_EQ(got.ic, ref.ic);
      EXPECT_EQ(got.k, ref.k);
      EXPECT_EQ(got.topk, ref.topk);
      EXPECT_EQ(got.scores, ref.scores);
      EXPECT_EQ(got.sparse, ref.sparse);
      EXPECT_EQ(got.dense, ref.dense);
    }
  }
  cudaStreamDestroy(cs);
}

TEST(CudaDecodeStep, BackToBackMatchesSynchronised) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 9700;
  for (DType cd : {DType::BF16, DType::FP8_E4M3}) {
    for (auto kernel : {cuda::IndexerKernel::kDecodeChunked, cuda::IndexerKernel::kDecodeCluster,
                        cuda::IndexerKernel::kDecodePersistent}) {
      check_decode_step(cd, kernel, seed++);
      check_decode_step(cd, kernel, seed++, 3);
    }
  }
}

}  // namespace
}  // namespace sieve
