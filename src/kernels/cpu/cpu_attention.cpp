// CPU reference of the attention path: qkv_norm_rope_cache, attention, indexer and the top-k
// selection (kernels/ops.h has the contract; docs/kernels.md "CPU reference ops" summarises it).
//
// Precision: every input is converted exactly to fp32 (load_as_f32); norm/RoPE run in fp32 with
// the sum of squares accumulated in double; attention logits, softmax and the weighted sum of V
// are accumulated in double; indexer dot products in double, rounded once to fp32 and then
// multiplied by score_scale in fp32. The only roundings are the cache stores:
//   KV cache   F32: exact. BF16: round_bf16(x). FP8_E4M3: per (token, kv head)
//              scale = amax(round_bf16(x)) / 448 (1 when amax == 0), stored
//              f32_to_fp8e4m3(round_bf16(x) / scale), read back as fp8 * scale.
//   Index cache F32: exact. BF16: round_bf16(x). FP8_E4M3: f32_to_fp8e4m3(round_bf16(x)), no scale.
//
// Readings of the contract chosen here (where ops.h leaves room):
// - qkv_norm_rope_cache writes back q and index_q only; the k, v and index_k columns of qkv are
//   left as they were (k and index_k normed/roped go to the caches only).
//   The index branch runs when num_index_heads > 0, index_dim > 0 and norm_rope_index.
//   slot_mapping == nullptr means no cache writes at all.
// - attention: a query whose key set is empty (block-sparse with no selected visible block)
//   gets an all-zero output. Selected block ids < 0, past the query's own block, or repeated
//   are ignored (each key counts once).
// - indexer: a key score <q, k> * score_scale that is NaN becomes -1e30 before the max over the
//   block (so a block scores -1e30 only if all its visible keys are NaN; NaN keys are otherwise
//   ignored). select_topk_blocks treats a NaN score as -1e30 too.
// - Tokens outside [query_start_loc[0], query_start_loc[num_seqs]) are not written by
//   attention or indexer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_parallel.h"

namespace sieve::cpu {

namespace {

constexpr float kInitSentinel = 1e30f;
constexpr float kLocalSentinel = 1e29f;
constexpr float kNanScore = -1e30f;

// Gemma RMSNorm (x / sqrt(mean(x^2) + eps) * (1 + w); none when w is null) and partial NeoX
// RoPE of one head, in place.
void norm_rope_head(float* x, int dim, const void* w, DType w_dtype, float eps, const float* cs,
                    int rotary_dim) {
  if (w) {
    double ss = 0;
    for (int d = 0; d < dim; ++d) ss += double(x[d]) * double(x[d]);
    const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
    for (int d = 0; d < dim; ++d) x[d] = (x[d] * inv) * (1.0f + load_as_f32(w, w_dtype, size_t(d)));
  }
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const float c = cs[j], s = cs[half + j];
    const float a = x[j], b = x[j + half];
    x[j] = a * c - b * s;
    x[j + half] = b * c + a * s;
  }
}

// Stores one (token, kv head) vector into a KV cache tensor with the cache's rounding rule.
void store_kv_vector(void* base, float* scales, DType dtype, size_t elem, size_t scale_idx,
                     const float* x, int dim) {
  switch (dtype) {
    case DType::F32:
      for (int d = 0; d < dim; ++d) static_cast<float*>(base)[elem + d] = x[d];
      return;
    case DType::BF16:
      for (int d = 0; d < dim; ++d) static_cast<uint16_t*>(base)[elem + d] = f32_to_bf16(x[d]);
      return;
    case DType::FP8_E4M3: {
      float amax = 0.0f;
      for (int d = 0; d < dim; ++d) {
        float a = std::fabs(round_bf16(x[d]));
        if (a > amax) amax = a;
      }
      const float scale = amax == 0.0f ? 1.0f : amax / kFp8E4M3Max;
      for (int d = 0; d < dim; ++d) {
        static_cast<uint8_t*>(base)[elem + d] = f32_to_fp8e4m3(round_bf16(x[d]) / scale);
      }
      scales[scale_idx] = scale;
      return;
    }
    default:
      SIEVE_CHECK(false, "KV cache dtype must be F32, BF16 or FP8_E4M3, got " +
                             std::string(dtype_name(dtype)));
  }
}

void store_index_vector(void* base, DType dtype, size_t elem, const float* x, int dim) {
  switch (dtype) {
    case DType::F32:
      for (int d = 0; d < dim; ++d) static_cast<float*>(base)[elem + d] = x[d];
      return;
    case DType::BF16:
      for (int d = 0; d < dim; ++d) static_cast<uint16_t*>(base)[elem + d] = f32_to_bf16(x[d]);
      return;
    case DType::FP8_E4M3:
      for (int d = 0; d < dim; ++d) {
        static_cast<uint8_t*>(base)[elem + d] = f32_to_fp8e4m3(round_bf16(x[d]));
      }
      return;
    default:
      SIEVE_CHECK(false, "index cache dtype must be F32, BF16 or FP8_E4M3, got " +
                             std::string(dtype_name(dtype)));
  }
}

void check_batch(const ops::BatchView& b, int block_size) {
  SIEVE_CHECK(b.num_seqs >= 0, "batch: num_seqs < 0");
  SIEVE_CHECK(b.num_seqs == 0 || (b.query_start_loc && b.seq_lens && b.block_tables),
              "batch: query_start_loc, seq_lens and block_tables are required");
  SIEVE_CHECK(block_size > 0, "cache block_size must be > 0");
  for (int s = 0; s < b.num_seqs; ++s) {
    const int32_t q0 = b.query_start_loc[s], q1 = b.query_start_loc[s + 1];
    SIEVE_CHECK(q0 >= 0 && q1 >= q0 && q1 <= b.num_tokens,
                "batch: bad query_start_loc at sequence " + std::to_string(s));
    SIEVE_CHECK(b.seq_lens[s] >= q1 - q0,
                "batch: seq_lens[" + std::to_string(s) + "] is shorter than its new tokens");
    SIEVE_CHECK(b.seq_lens[s] == 0 ||
                    (b.seq_lens[s] - 1) / block_size < b.max_blocks_per_seq,
                "batch: seq_lens[" + std::to_string(s) + "] exceeds max_blocks_per_seq");
  }
}

int32_t physical_block(const ops::BatchView& b, int s, int64_t logical, int64_t num_blocks) {
  const int32_t blk = b.block_tables[int64_t(s) * b.max_blocks_per_seq + logical];
  SIEVE_CHECK(blk >= 0 && blk < num_blocks,
              "block_tables[" + std::to_string(s) + ", " + std::to_string(logical) +
                  "] = " + std::to_string(blk) + " is not a cache block");
  return blk;
}

// Keys and values of sequence s, positions [0, len), converted to fp32:
// K and V are [num_kv_heads, len, head_dim].
void gather_kv(const ops::KvCacheView& kv, const ops::BatchView& b, int s, int len,
               std::vector<float>& K, std::vector<float>& V) {
  const int hd = kv.head_dim, nkv = kv.num_kv_heads, bs = kv.block_size;
  K.assign(size_t(nkv) * len * hd, 0.0f);
  V.assign(size_t(nkv) * len * hd, 0.0f);
  const bool fp8 = kv.dtype == DType::FP8_E4M3;
  for (int j = 0; j < len; ++j) {
    const int64_t blk = physical_block(b, s, j / bs, kv.num_blocks);
    const int off = j % bs;
    for (int h = 0; h < nkv; ++h) {
      const size_t row = size_t((blk * nkv + h) * bs + off);
      const float ks = fp8 ? kv.k_scale[row] : 1.0f;
      const float vs = fp8 ? kv.v_scale[row] : 1.0f;
      float* kd = &K[(size_t(h) * len + j) * hd];
      float* vd = &V[(size_t(h) * len + j) * hd];
      for (int d = 0; d < hd; ++d) {
        kd[d] = load_as_f32(kv.k, kv.dtype, row * hd + d) * ks;
        vd[d] = load_as_f32(kv.v, kv.dtype, row * hd + d) * vs;
      }
    }
  }
}

float round_to_cache_dtype(float x, DType cache) {
  switch (cache) {
    case DType::BF16: return round_bf16(x);
    case DType::FP8_E4M3: return round_fp8e4m3(round_bf16(x));
    default: return x;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void run_qkv_norm_rope_cache(const ops::QkvNormRopeCacheParams& p) {
  if (p.num_tokens <= 0) return;
  SIEVE_CHECK(p.qkv != nullptr, "qkv_norm_rope_cache: qkv is null");
  SIEVE_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.head_dim > 0,
              "qkv_norm_rope_cache: head counts and head_dim must be > 0");
  SIEVE_CHECK(!p.q_norm == !p.k_norm, "qkv_norm_rope_cache: q_norm and k_norm are both set or both null");
  SIEVE_CHECK(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.head_dim,
              "qkv_norm_rope_cache: rotary_dim must be even and <= head_dim");
  SIEVE_CHECK(p.rotary_dim == 0 || (p.positions && p.cos_sin),
              "qkv_norm_rope_cache: positions and cos_sin are required for RoPE");
  const bool index = p.norm_rope_index && p.num_index_heads > 0 && p.index_dim > 0;
  if (index) {
    SIEVE_CHECK(p.index_q_offset >= 0 && p.index_k_offset >= 0,
                "qkv_norm_rope_cache: index offsets are required for the index branch");
    SIEVE_CHECK(p.index_q_norm && p.index_k_norm,
                "qkv_norm_rope_cache: index_q_norm and index_k_norm are required");
    SIEVE_CHECK(p.rotary_dim <= p.index_dim, "qkv_norm_rope_cache: rotary_dim > index_dim");
  }
  const int hd = p.head_dim, idim = p.index_dim, rd = p.rotary_dim;
  const DType at = p.act_dtype;
  const ops::KvCacheView& kv = p.kv;
  const ops::IndexCacheView& ic = p.index_cache;
  const bool write_index = index && ic.k != nullptr;
  if (p.slot_mapping) {
    bool any = false;
    for (int64_t t = 0; t < p.num_tokens; ++t) any |= p.slot_mapping[t] >= 0;
    if (any) {
      SIEVE_CHECK(kv.k && kv.v, "qkv_norm_rope_cache: KV cache pointers are null");
      SIEVE_CHECK(kv.num_kv_heads == p.num_kv_heads && kv.head_dim == hd && kv.block_size > 0,
                  "qkv_norm_rope_cache: KV cache shape does not match the op");
      SIEVE_CHECK(kv.dtype != DType::FP8_E4M3 || (kv.k_scale && kv.v_scale),
                  "qkv_norm_rope_cache: FP8 KV cache needs k_scale and v_scale");
      if (write_index) {
        SIEVE_CHECK(ic.index_dim == idim && ic.block_size > 0,
                    "qkv_norm_rope_cache: index cache shape does not match the op");
      }
    }
  }

  std::vector<float> buf(size_t(std::max(hd, idim)));
  std::vector<float> kbuf(size_t(p.num_kv_heads) * hd), vbuf(size_t(p.num_kv_heads) * hd);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const size_t row = size_t(t * p.row_stride);
    const float* cs = nullptr;
    if (rd > 0) {
      SIEVE_CHECK(p.positions[t] >= 0, "qkv_norm_rope_cache: negative position");
      cs = p.cos_sin + int64_t(p.positions[t]) * rd;
    }
    auto load_vec = [&](int64_t col, int dim, float* out) {
      for (int d = 0; d < dim; ++d) out[d] = load_as_f32(p.qkv, at, row + size_t(col + d));
    };
    auto store_vec = [&](int64_t col, int dim, const float* in) {
      for (int d = 0; d < dim; ++d) store_from_f32(p.qkv, at, row + size_t(col + d), in[d]);
    };
    for (int h = 0; h < p.num_q_heads; ++h) {
      const int64_t col = p.q_offset + int64_t(h) * hd;
      load_vec(col, hd, buf.data());
      norm_rope_head(buf.data(), hd, p.q_norm, p.norm_dtype, p.eps, cs, rd);
      store_vec(col, hd, buf.data());
    }
    for (int h = 0; h < p.num_kv_heads; ++h) {
      load_vec(p.k_offset + int64_t(h) * hd, hd, &kbuf[size_t(h) * hd]);
      norm_rope_head(&kbuf[size_t(h) * hd], hd, p.k_norm, p.norm_dtype, p.eps, cs, rd);
      load_vec(p.v_offset + int64_t(h) * hd, hd, &vbuf[size_t(h) * hd]);
    }
    std::vector<float> ik;
    if (index) {
      for (int h = 0; h < p.num_index_heads; ++h) {
        const int64_t col = p.index_q_offset + int64_t(h) * idim;
        load_vec(col, idim, buf.data());
        norm_rope_head(buf.data(), idim, p.index_q_norm, p.norm_dtype, p.eps, cs, rd);
        store_vec(col, idim, buf.data());
      }
      ik.resize(size_t(idim));
      load_vec(p.index_k_offset, idim, ik.data());
      norm_rope_head(ik.data(), idim, p.index_k_norm, p.norm_dtype, p.eps, cs, rd);
    }
    const int64_t slot = p.slot_mapping ? p.slot_mapping[t] : -1;
    if (slot < 0) continue;
    const int64_t blk = slot / kv.block_size, off = slot % kv.block_size;
    SIEVE_CHECK(blk < kv.num_blocks, "qkv_norm_rope_cache: slot " + std::to_string(slot) +
                                         " is past the KV cache");
    for (int h = 0; h < p.num_kv_heads; ++h) {
      const size_t srow = size_t((blk * kv.num_kv_heads + h) * kv.block_size + off);
      store_kv_vector(kv.k, kv.k_scale, kv.dtype, srow * hd, srow, &kbuf[size_t(h) * hd], hd);
      store_kv_vector(kv.v, kv.v_scale, kv.dtype, srow * hd, srow, &vbuf[size_t(h) * hd], hd);
    }
    if (write_index) {
      const int64_t iblk = slot / ic.block_size, ioff = slot % ic.block_size;
      SIEVE_CHECK(iblk < ic.num_blocks, "qkv_norm_rope_cache: slot " + std::to_string(slot) +
                                            " is past the index cache");
      store_index_vector(ic.k, ic.dtype, size_t((iblk * ic.block_size + ioff) * idim), ik.data(),
                         idim);
    }
  }
}

// ---------------------------------------------------------------------------------------------

void run_attention(const ops::AttentionParams& p) {
  const ops::BatchView& b = p.batch;
  const ops::KvCacheView& kv = p.kv;
  if (b.num_seqs <= 0 || b.num_tokens <= 0) return;
  SIEVE_CHECK(p.q && p.out, "attention: q and out are required");
  SIEVE_CHECK(p.num_q_heads > 0 && p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
              "attention: num_q_heads must be a positive multiple of num_kv_heads");
  SIEVE_CHECK(kv.k && kv.v && kv.num_kv_heads == p.num_kv_heads && kv.head_dim == p.head_dim,
              "attention: KV cache does not match the op");
  SIEVE_CHECK(kv.dtype != DType::FP8_E4M3 || (kv.k_scale && kv.v_scale),
              "attention: FP8 KV cache needs k_scale and v_scale");
  SIEVE_CHECK(p.topk_idx == nullptr || p.topk >= 0, "attention: topk < 0");
  check_batch(b, kv.block_size);

  const int hd = p.head_dim, nkv = p.num_kv_heads, bs = kv.block_size;
  const int group = p.num_q_heads / nkv;
  const double scale = double(p.sm_scale);
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q0 = b.query_start_loc[s], qlen = b.query_start_loc[s + 1] - q0;
    if (qlen <= 0) continue;
    const int len = b.seq_lens[s];
    std::vector<float> K, V;
    gather_kv(kv, b, s, len, K, V);
    // One task per (new token, kv group).
    const int64_t tasks = int64_t(qlen) * nkv;
    detail::parallel_for(tasks, double(tasks) * len * hd * group * 4, [&](int64_t t0, int64_t t1) {
      std::vector<double> logits(static_cast<size_t>(len)), acc(static_cast<size_t>(hd));
      std::vector<int> keys;
      std::vector<char> selected;
      std::vector<float> q(static_cast<size_t>(hd));
      for (int64_t task = t0; task < t1; ++task) {
        const int i = int(task / nkv), g = int(task % nkv);
        const int64_t t = q0 + i;
        const int pos = len - qlen + i;
        keys.clear();
        if (p.topk_idx == nullptr) {
          for (int j = 0; j <= pos; ++j) keys.push_back(j);
        } else {
          const int own = pos / bs;
          selected.assign(size_t(own + 1), 0);
          const int32_t* sel = p.topk_idx + (t * nkv + g) * p.topk;
          for (int e = 0; e < p.topk; ++e) {
            if (sel[e] >= 0 && sel[e] <= own) selected[size_t(sel[e])] = 1;
          }
          for (int j = 0; j <= pos; ++j) {
            if (selected[size_t(j / bs)]) keys.push_back(j);
          }
        }
        const float* Kg = &K[size_t(g) * len * hd];
        const float* Vg = &V[size_t(g) * len * hd];
        for (int hh = 0; hh < group; ++hh) {
          const int h = g * group + hh;
          for (int d = 0; d < hd; ++d) {
            q[size_t(d)] = load_as_f32(p.q, p.q_dtype, size_t(t * p.q_stride + int64_t(h) * hd + d));
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double mx = -std::numeric_limits<double>::infinity();
          for (size_t e = 0; e < keys.size(); ++e) {
            const float* kr = Kg + size_t(keys[e]) * hd;
            double dot = 0;
            for (int d = 0; d < hd; ++d) dot += double(q[size_t(d)]) * double(kr[d]);
            logits[e] = dot * scale;
            mx = std::max(mx, logits[e]);
          }
          double denom = 0;
          for (size_t e = 0; e < keys.size(); ++e) {
            const double w = std::exp(logits[e] - mx);
            denom += w;
            const float* vr = Vg + size_t(keys[e]) * hd;
            for (int d = 0; d < hd; ++d) acc[size_t(d)] += w * double(vr[d]);
          }
          const size_t out_row = size_t(t * p.out_stride + int64_t(h) * hd);
          for (int d = 0; d < hd; ++d) {
            const float o = keys.empty() ? 0.0f : float(acc[size_t(d)] / denom);
            store_from_f32(p.out, p.out_dtype, out_row + size_t(d), o);
          }
        }
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------

void select_topk_blocks(const float* scores, int n_blk, int topk, int32_t* out) {
  if (topk <= 0) return;
  const int n = std::max(n_blk, 0);
  const int k = std::min(topk, n);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  auto key = [&](int32_t b) {
    const float v = scores[b];
    return std::isnan(v) ? kNanScore : v;
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t c) {
    const float sa = key(a), sc = key(c);
    if (sa != sc) return sa > sc;
    return a < c;
  });
  for (int i = 0; i < k; ++i) out[i] = ids[size_t(i)];
  for (int i = k; i < topk; ++i) out[i] = -1;
}

void run_indexer(const ops::IndexerParams& p) {
  const ops::BatchView& b = p.batch;
  const ops::IndexCacheView& ic = p.cache;
  if (b.num_seqs <= 0 || b.num_tokens <= 0) return;
  SIEVE_CHECK(p.index_q && p.topk_idx, "indexer: index_q and topk_idx are required");
  SIEVE_CHECK(p.num_index_heads > 0 && p.index_dim > 0 && p.topk > 0,
              "indexer: num_index_heads, index_dim and topk must be > 0");
  SIEVE_CHECK(ic.k && ic.index_dim == p.index_dim, "indexer: index cache does not match the op");
  SIEVE_CHECK(p.init_blocks >= 0 && p.local_blocks >= 0, "indexer: negative forced blocks");
  check_batch(b, ic.block_size);

  const int idim = p.index_dim, H = p.num_index_heads, bs = ic.block_size;
  const int mbps = b.max_blocks_per_seq;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int q0 = b.query_start_loc[s], qlen = b.query_start_loc[s + 1] - q0;
    if (qlen <= 0) continue;
    const int len = b.seq_lens[s];
    std::vector<float> IK(size_t(len) * idim);
    for (int j = 0; j < len; ++j) {
      const int64_t blk = physical_block(b, s, j / bs, ic.num_blocks);
      const size_t base = size_t((blk * bs + j % bs) * idim);
      for (int d = 0; d < idim; ++d) IK[size_t(j) * idim + d] = load_as_f32(ic.k, ic.dtype, base + d);
    }
    const int64_t tasks = int64_t(qlen) * H;
    detail::parallel_for(tasks, double(tasks) * len * idim * 2, [&](int64_t t0, int64_t t1) {
      std::vector<float> q(static_cast<size_t>(idim)), scores;
      for (int64_t task = t0; task < t1; ++task) {
        const int i = int(task / H), h = int(task % H);
        const int64_t t = q0 + i;
        const int pos = len - qlen + i;
        const int n_blk = pos / bs + 1;
        for (int d = 0; d < idim; ++d) {
          float x = load_as_f32(p.index_q, p.q_dtype, size_t(t * p.q_stride + int64_t(h) * idim + d));
          q[size_t(d)] = p.q_in_cache_dtype ? round_to_cache_dtype(x, ic.dtype) : x;
        }
        scores.assign(size_t(n_blk), 0.0f);
        for (int blk = 0; blk < n_blk; ++blk) {
          float best = -std::numeric_limits<float>::infinity();
          const int j1 = std::min(pos, (blk + 1) * bs - 1);
          for (int j = blk * bs; j <= j1; ++j) {
            const float* kr = &IK[size_t(j) * idim];
            double dot = 0;
            for (int d = 0; d < idim; ++d) dot += double(q[size_t(d)]) * double(kr[d]);
            float sc = float(dot) * p.score_scale;
            if (std::isnan(sc)) sc = kNanScore;
            best = std::max(best, sc);
          }
          if (blk >= n_blk - p.local_blocks) {
            best = kLocalSentinel;
          } else if (blk < p.init_blocks) {
            best = kInitSentinel;
          }
          scores[size_t(blk)] = best;
        }
        if (p.block_scores) {
          float* row = p.block_scores + (t * H + h) * mbps;
          for (int blk = 0; blk < mbps; ++blk) {
            row[blk] = blk < n_blk ? scores[size_t(blk)] : -std::numeric_limits<float>::infinity();
          }
        }
        select_topk_blocks(scores.data(), n_blk, p.topk, p.topk_idx + (t * H + h) * p.topk);
      }
    });
  }
}

}  // namespace sieve::cpu
