// Shared helpers for kernel tests (CPU reference tests and CPU/CUDA parity tests): random data,
// random paged batches, host-side KV / index caches with poisoning and independent
// (test-written) read/write of the cache formats, and a qkv_norm_rope_cache based cache fill.
//
// Everything here is host memory; a CUDA parity test copies the vectors to the device and
// builds its own views with the device pointers (the view() helpers show the field mapping).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"

namespace sieve::test {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Random numbers (deterministic per seed).

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    return std::uniform_real_distribution<float>(lo, hi)(gen);
  }
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen); }
  int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }  // [lo, hi]
  // A multiple of 2^-shift in [-range, range]: exactly representable in bf16 for small ranges,
  // so dot products of such values are exact in fp32 and produce exact ties.
  float grid(int range_steps, int shift) {
    return std::ldexp(float(uniform_int(-range_steps, range_steps)), -shift);
  }
};

inline std::vector<float> random_vector(size_t n, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Typed host buffers.

// Bytes of `count` elements of `dtype`, poisoned with NaN (F32 NaN, BF16 0x7fc0, FP8 0x7f).
struct TypedBuffer {
  DType dtype = DType::F32;
  size_t count = 0;
  std::vector<uint8_t> bytes;
  TypedBuffer() = default;
  TypedBuffer(DType t, size_t n) : dtype(t), count(n), bytes(n * dtype_size(t)) { poison(); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float get(size_t i) const { return load_as_f32(bytes.data(), dtype, i); }
  void set(size_t i, float v) { store_from_f32(bytes.data(), dtype, i, v); }
  void poison() {
    for (size_t i = 0; i < count; ++i) set(i, kNaN);
  }
  static TypedBuffer from(DType t, const std::vector<float>& v) {
    TypedBuffer b(t, v.size());
    for (size_t i = 0; i < v.size(); ++i) b.set(i, v[i]);
    return b;
  }
};

inline void fill_nan(std::vector<float>& v) { std::fill(v.begin(), v.end(), kNaN); }

// Embedding of `ids` from a BF16 vocabulary shard: rows [vocab0, vocab0 + vocab) of the whole
// table, F32 out (zero rows for the other ranks' ids).
inline ops::EmbeddingParams shard_embedding_params(const std::vector<int32_t>& ids, const void* table,
                                                   int64_t vocab, int64_t hidden, int64_t vocab0, void* out) {
  ops::EmbeddingParams p;
  p.ids = ids.data();
  p.num_tokens = int64_t(ids.size());
  p.table = table;
  p.table_dtype = DType::BF16;
  p.vocab = vocab;
  p.hidden = hidden;
  p.shard = true;
  p.vocab0 = vocab0;
  p.out = out;
  p.out_dtype = DType::F32;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Paged batches.

struct SeqSpec {
  int cached = 0;  // keys already in the cache before this step
  int q_len = 1;   // new tokens of this step; seq_len = cached + q_len
};

struct PagedBatch {
  int block_size = 128;
  int max_blocks_per_seq = 0;
  int64_t num_blocks = 0;  // physical blocks in the caches
  int64_t num_tokens = 0;
  int max_seq_len = 0, max_query_len = 0;
  std::vector<SeqSpec> specs;
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> seq_lens;         // [num_seqs]
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks_per_seq]; unused entries -1
  std::vector<int32_t> positions;        // [num_tokens] position of each new token
  std::vector<int64_t> slot_mapping;     // [num_tokens] cache slot of each new token
  std::vector<int32_t> token_seq;        // [num_tokens] sequence of each new token

  int num_seqs() const { return int(specs.size()); }
  // Cache slot (physical block * block_size + offset) of position pos of sequence s.
  int64_t slot(int s, int pos) const {
    int32_t blk = block_tables[size_t(s) * max_blocks_per_seq + pos / block_size];
    return int64_t(blk) * block_size + pos % block_size;
  }
  ops::BatchView view() const {
    ops::BatchView b;
    b.num_seqs = num_seqs();
    b.num_tokens = num_tokens;
    b.query_start_loc = query_start_loc.data();
    b.seq_lens = seq_lens.data();
    b.block_tables = block_tables.data();
    b.max_blocks_per_seq = max_blocks_per_seq;
    b.max_seq_len = max_seq_len;
    b.max_query_len = max_query_len;
    return b;
  }
};

// `n` random sequences: a third prefill (no cache), a third decode (q_len 1 after a random
// prefix), a third chunked prefill / speculative verification (prefix + q_len in [2, max_q]).
inline std::vector<SeqSpec> random_seq_specs(int n, int max_len, Rng& rng, int max_q = 8) {
  std::vector<SeqSpec> v;
  for (int i = 0; i < n; ++i) {
    SeqSpec sp;
    switch (rng.uniform_int(0, 2)) {
      case 0: sp.cached = 0; sp.q_len = rng.uniform_int(1, max_len); break;
      case 1: sp.q_len = 1; sp.cached = rng.uniform_int(0, max_len - 1); break;
      default:
        sp.q_len = rng.uniform_int(std::min(2, max_len), std::max(std::min(max_q, max_len), 1));
        sp.cached = rng.uniform_int(0, max_len - sp.q_len);
    }
    v.push_back(sp);
  }
  return v;
}

// A batch of the given sequences with shuffled physical blocks: every sequence gets
// ceil(seq_len / block_size) distinct random blocks out of num_blocks = total + extra_blocks;
// max_blocks_per_seq = the longest sequence's blocks + extra_cols (entries past a sequence's
// blocks are -1, so a kernel that reads them is caught by the CPU checks).
inline PagedBatch make_paged_batch(const std::vector<SeqSpec>& specs, int block_size, Rng& rng,
                                   int extra_blocks = 3, int extra_cols = 1) {
  PagedBatch b;
  b.block_size = block_size;
  b.specs = specs;
  int64_t total_blocks = 0;
  int max_blocks = 0;
  for (const auto& sp : specs) {
    int len = sp.cached + sp.q_len;
    int nb = (len + block_size - 1) / block_size;
    total_blocks += nb;
    max_blocks = std::max(max_blocks, nb);
    b.max_seq_len = std::max(b.max_seq_len, len);
    b.max_query_len = std::max(b.max_query_len, sp.q_len);
  }
  b.num_blocks = total_blocks + extra_blocks;
  b.max_blocks_per_seq = max_blocks + extra_cols;
  std::vector<int32_t> phys(size_t(b.num_blocks));
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng.gen);
  b.block_tables.assign(specs.size() * size_t(b.max_blocks_per_seq), -1);
  size_t next = 0;
  b.query_start_loc.push_back(0);
  for (size_t s = 0; s < specs.size(); ++s) {
    int len = specs[s].cached + specs[s].q_len;
    int nb = (len + block_size - 1) / block_size;
    for (int i = 0; i < nb; ++i) b.block_tables[s * b.max_blocks_per_seq + i] = phys[next++];
    b.seq_lens.push_back(len);
    for (int i = 0; i < specs[s].q_len; ++i) {
      int pos = specs[s].cached + i;
      b.positions.push_back(pos);
      b.slot_mapping.push_back(b.slot(int(s), pos));
      b.token_seq.push_back(int32_t(s));
    }
    b.query_start_loc.push_back(int32_t(b.positions.size()));
  }
  b.num_tokens = int64_t(b.positions.size());
  return b;
}

// ---------------------------------------------------------------------------------------------
// Host caches. read/write implement the cache formats of ops.h independently of the op code.

struct KvCache {
  DType dtype = DType::BF16;
  int64_t num_blocks = 0;
  int block_size = 128, num_kv_heads = 0, head_dim = 0;
  TypedBuffer k, v;
  std::vector<float> k_scale, v_scale;  // FP8 only

  KvCache(DType t, int64_t nb, int bs, int nkv, int hd)
      : dtype(t), num_blocks(nb), block_size(bs), num_kv_heads(nkv), head_dim(hd),
        k(t, size_t(nb) * nkv * bs * hd), v(t, size_t(nb) * nkv * bs * hd) {
    if (t == DType::FP8_E4M3) {
      k_scale.assign(size_t(nb) * nkv * bs, kNaN);
      v_scale.assign(size_t(nb) * nkv * bs, kNaN);
    }
  }
  ops::KvCacheView view() {
    ops::KvCacheView c;
    c.k = k.data();
    c.v = v.data();
    c.k_scale = k_scale.empty() ? nullptr : k_scale.data();
    c.v_scale = v_scale.empty() ? nullptr : v_scale.data();
    c.dtype = dtype;
    c.num_blocks = num_blocks;
    c.block_size = block_size;
    c.num_kv_heads = num_kv_heads;
    c.head_dim = head_dim;
    return c;
  }
  // Row (block, head, offset) of a slot: the scale index; element = row * head_dim + d.
  size_t row(int64_t slot, int h) const {
    int64_t blk = slot / block_size, off = slot % block_size;
    return size_t((blk * num_kv_heads + h) * block_size + off);
  }
  float scale_k(int64_t slot, int h) const { return k_scale.empty() ? 1.0f : k_scale[row(slot, h)]; }
  float scale_v(int64_t slot, int h) const { return v_scale.empty() ? 1.0f : v_scale[row(slot, h)]; }
  float read_k(int64_t slot, int h, int d) const {
    return k.get(row(slot, h) * head_dim + d) * scale_k(slot, h);
  }
  float read_v(int64_t slot, int h, int d) const {
    return v.get(row(slot, h) * head_dim + d) * scale_v(slot, h);
  }
  // Stores one (token, head) vector with the ops.h rounding rule of this cache dtype.
  void write_one(TypedBuffer& buf, std::vector<float>& scales, int64_t slot, int h, const float* x) {
    size_t r = row(slot, h);
    if (dtype == DType::FP8_E4M3) {
      float amax = 0;
      for (int d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(round_bf16(x[d])));
      float scale = amax == 0 ? 1.0f : amax / 448.0f;
      for (int d = 0; d < head_dim; ++d) buf.set(r * head_dim + d, round_bf16(x[d]) / scale);
      scales[r] = scale;
    } else {
      for (int d = 0; d < head_dim; ++d) buf.set(r * head_dim + d, x[d]);  // F32 exact, BF16 RNE
    }
  }
  void write(int64_t slot, int h, const float* kx, const float* vx) {
    write_one(k, k_scale, slot, h, kx);
    write_one(v, v_scale, slot, h, vx);
  }
};

struct IndexCache {
  DType dtype = DType::BF16;
  int64_t num_blocks = 0;
  int block_size = 128, index_dim = 0;
  TypedBuffer k;

  IndexCache(DType t, int64_t nb, int bs, int dim)
      : dtype(t), num_blocks(nb), block_size(bs), index_dim(dim), k(t, size_t(nb) * bs * dim) {}
  ops::IndexCacheView view() {
    ops::IndexCacheView c;
    c.k = k.data();
    c.dtype = dtype;
    c.num_blocks = num_blocks;
    c.block_size = block_size;
    c.index_dim = index_dim;
    return c;
  }
  float read(int64_t slot, int d) const { return k.get(size_t(slot) * index_dim + d); }
  // F32 exact, BF16 round, FP8 = fp8(round_bf16(x)), no scale.
  void write(int64_t slot, const float* x) {
    for (int d = 0; d < index_dim; ++d) {
      float v = dtype == DType::FP8_E4M3 ? round_bf16(x[d]) : x[d];
      k.set(size_t(slot) * index_dim + d, v);
    }
  }
};

// Writes random keys/values (uniform [-amp, amp]) for every position [0, seq_len) of every
// sequence of the batch directly into the caches (either may be null).
inline void fill_caches_random(const PagedBatch& b, KvCache* kv, IndexCache* ic, Rng& rng,
                               float amp = 1.0f) {
  for (int s = 0; s < b.num_seqs(); ++s) {
    for (int pos = 0; pos < b.seq_lens[size_t(s)]; ++pos) {
      int64_t slot = b.slot(s, pos);
      if (kv) {
        for (int h = 0; h < kv->num_kv_heads; ++h) {
          auto kx = random_vector(size_t(kv->head_dim), rng, -amp, amp);
          auto vx = random_vector(size_t(kv->head_dim), rng, -amp, amp);
          kv->write(slot, h, kx.data(), vx.data());
        }
      }
      if (ic) {
        auto x = random_vector(size_t(ic->index_dim), rng, -amp, amp);
        ic->write(slot, x.data());
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Packed projection rows [q | k | v | index_q | index_k] and the norm/RoPE tables.

struct QkvLayout {
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  int num_index_heads = 0, index_dim = 0;  // 0: no index branch
  int rotary_dim = 0;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0, index_q_offset = -1, index_k_offset = -1;
  int64_t row_stride = 0;

  // Columns packed in the order above, then `pad` unused columns per row.
  static QkvLayout make(int nq, int nkv, int hd, int nih, int idim, int rotary_dim, int pad = 0) {
    QkvLayout l;
    l.num_q_heads = nq;
    l.num_kv_heads = nkv;
    l.head_dim = hd;
    l.num_index_heads = nih;
    l.index_dim = idim;
    l.rotary_dim = rotary_dim;
    l.q_offset = 0;
    l.k_offset = int64_t(nq) * hd;
    l.v_offset = l.k_offset + int64_t(nkv) * hd;
    int64_t end = l.v_offset + int64_t(nkv) * hd;
    if (nih > 0) {
      l.index_q_offset = end;
      l.index_k_offset = end + int64_t(nih) * idim;
      end = l.index_k_offset + idim;
    }
    l.row_stride = end + pad;
    return l;
  }
};

// Norm weights (stored in norm_dtype, values raw w of Gemma's (1 + w)) and the fp32 RoPE table.
struct QkvWeights {
  DType norm_dtype = DType::BF16;
  TypedBuffer q_norm, k_norm, index_q_norm, index_k_norm;
  std::vector<float> cos_sin;  // [max_position, rotary_dim]
  int max_position = 0;

  static QkvWeights make(const QkvLayout& l, int max_position, Rng& rng,
                         DType norm_dtype = DType::BF16, double theta = 5e6) {
    QkvWeights w;
    w.norm_dtype = norm_dtype;
    w.max_position = max_position;
    w.q_norm = TypedBuffer::from(norm_dtype, random_vector(size_t(l.head_dim), rng, -0.5f, 0.5f));
    w.k_norm = TypedBuffer::from(norm_dtype, random_vector(size_t(l.head_dim), rng, -0.5f, 0.5f));
    if (l.index_dim > 0) {
      w.index_q_norm = TypedBuffer::from(norm_dtype, random_vector(size_t(l.index_dim), rng, -0.5f, 0.5f));
      w.index_k_norm = TypedBuffer::from(norm_dtype, random_vector(size_t(l.index_dim), rng, -0.5f, 0.5f));
    }
    w.cos_sin.assign(size_t(max_position) * std::max(l.rotary_dim, 1), 0.0f);
    if (l.rotary_dim > 0) ops::build_rope_table(w.cos_sin.data(), max_position, l.rotary_dim, theta);
    return w;
  }
};

// Parameters of qkv_norm_rope_cache for `num_tokens` rows of `qkv` (act F32 unless changed).
inline ops::QkvNormRopeCacheParams make_qkv_params(const QkvLayout& l, const QkvWeights& w,
                                                   void* qkv, DType act_dtype, int64_t num_tokens,
                                                   const int32_t* positions,
                                                   const int64_t* slot_mapping, KvCache& kv,
                                                   IndexCache* ic) {
  ops::QkvNormRopeCacheParams p;
  p.qkv = qkv;
  p.act_dtype = act_dtype;
  p.num_tokens = num_tokens;
  p.row_stride = l.row_stride;
  p.num_q_heads = l.num_q_heads;
  p.num_kv_heads = l.num_kv_heads;
  p.head_dim = l.head_dim;
  p.q_offset = l.q_offset;
  p.k_offset = l.k_offset;
  p.v_offset = l.v_offset;
  p.num_index_heads = l.num_index_heads;
  p.index_dim = l.index_dim;
  p.index_q_offset = l.index_q_offset;
  p.index_k_offset = l.index_k_offset;
  p.q_norm = w.q_norm.data();
  p.k_norm = w.k_norm.data();
  p.index_q_norm = l.index_dim > 0 ? w.index_q_norm.data() : nullptr;
  p.index_k_norm = l.index_dim > 0 ? w.index_k_norm.data() : nullptr;
  p.norm_dtype = w.norm_dtype;
  p.eps = 1e-6f;
  p.positions = positions;
  p.cos_sin = w.cos_sin.data();
  p.rotary_dim = l.rotary_dim;
  p.slot_mapping = slot_mapping;
  p.kv = kv.view();
  if (ic) p.index_cache = ic->view();
  p.norm_rope_index = l.num_index_heads > 0;
  return p;
}

// Fills the caches for every position [0, seq_len) of every sequence the way the model does:
// random projection rows (uniform [-amp, amp]) for all positions run through
// cpu::run_qkv_norm_rope_cache (one row per position, slots from the block tables).
// Returns the qkv rows after the op ([sum seq_len, row_stride], q/index_q normed and roped).
inline std::vector<float> fill_caches_with_op(const PagedBatch& b, const QkvLayout& l,
                                              const QkvWeights& w, KvCache& kv, IndexCache* ic,
                                              Rng& rng, float amp = 2.0f) {
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  for (int s = 0; s < b.num_seqs(); ++s) {
    for (int pos = 0; pos < b.seq_lens[size_t(s)]; ++pos) {
      positions.push_back(pos);
      slots.push_back(b.slot(s, pos));
    }
  }
  auto qkv = random_vector(positions.size() * size_t(l.row_stride), rng, -amp, amp);
  auto p = make_qkv_params(l, w, qkv.data(), DType::F32, int64_t(positions.size()),
                           positions.data(), slots.data(), kv, ic);
  cpu::run_qkv_norm_rope_cache(p);
  return qkv;
}

// ---------------------------------------------------------------------------------------------
// A matmul case (y[m, n] (+)= x[m, k] . w[n, k]^T) with padded rows, for the CPU and CUDA tests.

struct MatmulCase {
  int64_t m, n, k, ldx, ldy;
  DType xt, wt, yt;
  bool acc;
  TypedBuffer x, w, y;  // y: before the op (NaN, or random under accumulate; padding NaN)

  MatmulCase(int64_t m_, int64_t n_, int64_t k_, DType xt_, DType wt_, DType yt_, bool acc_, uint64_t seed)
      : m(m_), n(n_), k(k_), ldx(k_ + 3), ldy(n_ + 2), xt(xt_), wt(wt_), yt(yt_), acc(acc_) {
    Rng rng(seed);
    x = TypedBuffer::from(xt, random_vector(size_t(m * ldx), rng));
    w = TypedBuffer::from(wt, random_vector(size_t(n * k), rng));
    y = TypedBuffer(yt, size_t(m * ldy));
    if (acc)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) y.set(size_t(i * ldy + j), rng.uniform(-4.0f, 4.0f));
  }
  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " x=" +
           std::string(dtype_name(xt)) + " w=" + std::string(dtype_name(wt)) + " y=" + std::string(dtype_name(yt)) +
           " acc=" + std::to_string(acc);
  }
  ops::MatmulParams params(const void* xp, const void* wp, void* yp) const {
    ops::MatmulParams p;
    p.x = xp;
    p.x_dtype = xt;
    p.w = wp;
    p.w_dtype = wt;
    p.y = yp;
    p.y_dtype = yt;
    p.m = m;
    p.n = n;
    p.k = k;
    p.ldx = ldx;
    p.ldy = ldy;
    p.accumulate = acc;
    return p;
  }
  // The first mismatches of `got` (y after the op) against a double-precision reference, or "".
  // Bound per output: sum_tol x (sum of |products| and |y before|) + atol, plus the rounding of
  // a BF16 output (|ref| / 256); padding columns must stay NaN.
  std::string mismatches(const TypedBuffer& got, double sum_tol, double atol) const {
    std::string out;
    int bad = 0;
    for (int64_t i = 0; i < m && bad < 5; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double prod = double(x.get(size_t(i * ldx + kk))) * double(w.get(size_t(j * k + kk)));
          ref += prod;
          mag += std::fabs(prod);
        }
        if (acc) {
          ref += y.get(size_t(i * ldy + j));
          mag += std::fabs(y.get(size_t(i * ldy + j)));
        }
        const double g = got.get(size_t(i * ldy + j));
        const double tol = (sum_tol * mag + atol) * 1.01 + (yt == DType::BF16 ? std::fabs(ref) / 256 : 0.0);
        if (!(std::fabs(g - ref) <= tol) && bad++ < 5)
          out += " y[" + std::to_string(i) + "," + std::to_string(j) + "] = " + std::to_string(g) + " want " +
                 std::to_string(ref) + " (tol " + std::to_string(tol) + ");";
      }
      for (int64_t j = n; j < ldy; ++j)
        if (!std::isnan(got.get(size_t(i * ldy + j))) && bad++ < 5)
          out += " padding y[" + std::to_string(i) + "," + std::to_string(j) + "] written;";
    }
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Comparison helpers.

// |a - b| <= atol + rtol * |b|, false for any NaN.
inline bool close(double a, double b, double atol, double rtol) {
  if (std::isnan(a) || std::isnan(b)) return false;
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

// Top-k parity up to near ties: `got` (topk ids, -1 padded) is accepted for the block scores
// `scores` ([n_blk], the CPU reference's, sentinels applied) when it has the same number of
// valid entries as the exact selection, its ids are distinct and in [0, n_blk), and at every
// rank its score is within atol + rtol * |score| of the exact selection's score at that rank
// (so blocks may swap only with blocks of nearly equal score). `why` gets the first mismatch.
inline bool topk_equivalent(const float* scores, int n_blk, const int32_t* got, int topk,
                            double atol, double rtol, std::string* why = nullptr) {
  std::vector<int32_t> want(static_cast<size_t>(topk));
  cpu::select_topk_blocks(scores, n_blk, topk, want.data());
  auto fail = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  std::vector<char> seen(size_t(std::max(n_blk, 0)), 0);
  for (int i = 0; i < topk; ++i) {
    if ((want[size_t(i)] < 0) != (got[i] < 0)) return fail("padding differs at rank " + std::to_string(i));
    if (got[i] < 0) continue;
    if (got[i] >= n_blk) return fail("id " + std::to_string(got[i]) + " >= n_blk");
    if (seen[size_t(got[i])]++) return fail("id " + std::to_string(got[i]) + " repeated");
    const double a = scores[got[i]], b = scores[want[size_t(i)]];
    if (!(a == b || std::fabs(a - b) <= atol + rtol * std::fabs(b))) {
      return fail("rank " + std::to_string(i) + ": block " + std::to_string(got[i]) + " (score " +
                  std::to_string(a) + ") instead of block " + std::to_string(want[size_t(i)]) +
                  " (score " + std::to_string(b) + ")");
    }
  }
  return true;
}

}  // namespace sieve::test
