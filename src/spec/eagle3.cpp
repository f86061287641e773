// EAGLE3 draft: weights and forward pass (spec/eagle3.h), through kernels/ops.h only.
#include "spec/eagle3.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "io/safetensors.h"

namespace sieve::spec {

namespace {

// A matrix on the draft's device in BF16 (F32 for norms).
struct Mat {
  Buffer buf;
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
};

class Reader {
 public:
  explicit Reader(const std::string& dir) : ckpt_(Checkpoint::open(dir)), dir_(dir) {}

  bool has(const std::string& name) const { return !resolve(name).empty(); }

  // Host copy of `name` [rows, cols] (cols 0: a vector) converted to `dt`.
  std::vector<uint8_t> read(const std::string& name, int64_t rows, int64_t cols, DType dt) const {
    const TensorInfo& t = get(name);
    const std::vector<int64_t> want =
        cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    if (t.shape != want)
      throw Error("speculative draft " + dir_ + ": tensor " + t.name + " has shape " +
                  shape_str(t.shape) + ", expected " + shape_str(want) +
                  " (does the draft fit the target?)");
    if (t.dtype != DType::BF16 && t.dtype != DType::F32 && t.dtype != DType::F16)
      throw Error("speculative draft " + dir_ + ": tensor " + t.name + " has dtype " +
                  std::string(dtype_name(t.dtype)) + ", expected BF16, F16 or F32");
    const size_t n = size_t(t.numel());
    std::vector<uint8_t> out(n * dtype_size(dt));
    if (t.dtype == dt) {
      std::memcpy(out.data(), t.data, out.size());
    } else {
      for (size_t i = 0; i < n; ++i)
        store_from_f32(out.data(), dt, i, load_as_f32(t.data, t.dtype, i));
    }
    return out;
  }

  const TensorInfo& get(const std::string& name) const {
    const std::string r = resolve(name);
    if (r.empty()) throw Error("speculative draft " + dir_ + ": tensor " + name + " not found");
    return ckpt_.get(r);
  }

 private:
  // Published drafts name the layer midlayer.* or layers.0.*, with or without "model.".
  std::string resolve(const std::string& name) const {
    std::vector<std::string> alts{name};
    if (name.rfind("midlayer.", 0) == 0) alts.push_back("layers.0." + name.substr(9));
    for (size_t i = 0, n = alts.size(); i < n; ++i) alts.push_back("model." + alts[i]);
    for (const auto& a : alts)
      if (ckpt_.has(a)) return a;
    return {};
  }
  Checkpoint ckpt_;
  std::string dir_;
};

Mat upload(const Device& dev, std::vector<uint8_t> bytes, DType dt, int64_t rows, int64_t cols) {
  Mat m;
  m.dtype = dt;
  m.rows = rows;
  m.cols = cols;
  m.buf = Buffer(dev, bytes.size());
  copy_to_device(dev, m.buf.data(), bytes.data(), bytes.size());
  return m;
}

}  // namespace

struct Eagle3Draft::Impl {
  Mat embed;  // own [vocab, H] (empty: target_embed)
  ops::WeightView target_embed;
  std::vector<Mat> fc;  // per aux layer [H, target H] (column blocks of fc.weight)
  Mat qkv, o_proj, gate_up, down;
  Mat input_norm, hidden_norm, post_norm, norm;  // F32 [H]
  Mat lm_head;                                   // [draft_vocab, H]
  // Cache
  Buffer k, v, k_scale, v_scale;
  ops::KvCacheView kv;
  Buffer rope;
  int64_t rope_positions = 0;
  // Activations (grow-only)
  Buffer res, hin, emb, x2, qkvb, attn, xn, gu, act, sel;
  int64_t rows_cap = 0, logit_rows_cap = 0;
};

Eagle3Draft::~Eagle3Draft() = default;

namespace {

// Dummy weights (--load-format dummy): a small random pattern repeated, scaled like a trained
// projection, so that timings see real-sized matrices without a checkpoint.
class DummyReader {
 public:
  bool has(const std::string& name) const { return name != "embed_tokens.weight" && name != "d2t"; }
  std::vector<uint8_t> read(const std::string& name, int64_t rows, int64_t cols, DType dt) const {
    const int64_t n = rows * (cols ? cols : 1);
    const float scale = cols ? 1.0f / std::sqrt(float(cols)) : 0.0f;
    std::vector<uint8_t> out(size_t(n) * dtype_size(dt));
    uint64_t x = 0x2545f4914f6cdd1dull ^ uint64_t(name.size());
    std::vector<float> pattern(4099);
    for (float& v : pattern) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      v = (float(x % 2001) / 1000.0f - 1.0f) * 1.7f;
    }
    for (int64_t i = 0; i < n; ++i)
      store_from_f32(out.data(), dt, size_t(i), cols ? pattern[size_t(i % 4099)] * scale : 1.0f);
    return out;
  }
};

template <class R>
void load_weights(Eagle3Draft::Impl& w, const R& rd, const Eagle3Config& c,
                  const ModelConfig& target, const Device& dev, const ops::WeightView& target_embed,
                  const std::string& dir);

}  // namespace

std::unique_ptr<Eagle3Draft> Eagle3Draft::load(const std::string& dir, const ModelConfig& target,
                                               const Device& dev,
                                               const ops::WeightView& target_embed, bool dummy) {
  std::unique_ptr<Eagle3Draft> d(new Eagle3Draft());
  d->cfg_ = load_eagle3_config(dir, target);
  d->dev_ = dev;
  d->impl_ = std::make_unique<Impl>();
  const Eagle3Config& c = d->cfg_;
  Impl& w = *d->impl_;
  if (dummy) {
    load_weights(w, DummyReader(), c, target, dev, target_embed, dir);
    d->d2t_.resize(size_t(c.draft_vocab_size));
    for (int64_t i = 0; i < c.draft_vocab_size; ++i) d->d2t_[size_t(i)] = int32_t(i);
    return d;
  }
  Reader rd(dir);
  load_weights(w, rd, c, target, dev, target_embed, dir);
  // d2t: target id = draft id + d2t[draft id]; absent: the identity (equal vocabularies).
  d->d2t_.resize(size_t(c.draft_vocab_size));
  if (rd.has("d2t")) {
    const TensorInfo& t = rd.get("d2t");
    if (t.shape != std::vector<int64_t>{c.draft_vocab_size} ||
        (t.dtype != DType::I64 && t.dtype != DType::I32))
      throw Error("speculative draft " + dir + ": d2t has dtype " +
                  std::string(dtype_name(t.dtype)) + " and shape " + shape_str(t.shape) +
                  ", expected I64 [" + std::to_string(c.draft_vocab_size) + "]");
    for (int64_t i = 0; i < c.draft_vocab_size; ++i) {
      const int64_t off = t.dtype == DType::I64 ? static_cast<const int64_t*>(t.data)[i]
                                                : int64_t(static_cast<const int32_t*>(t.data)[i]);
      const int64_t id = i + off;
      if (id < 0 || id >= c.vocab_size)
        throw Error("speculative draft " + dir + ": d2t maps draft id " + std::to_string(i) +
                    " to " + std::to_string(id) + ", outside the target's vocabulary [0, " +
                    std::to_string(c.vocab_size) + ")");
      d->d2t_[size_t(i)] = int32_t(id);
    }
  } else if (c.draft_vocab_size != c.vocab_size) {
    throw Error("speculative draft " + dir + ": draft_vocab_size " +
                std::to_string(c.draft_vocab_size) +
                " differs from vocab_size but there is no d2t map");
  } else {
    for (int64_t i = 0; i < c.draft_vocab_size; ++i) d->d2t_[size_t(i)] = int32_t(i);
  }
  return d;
}

namespace {

template <class R>
void load_weights(Eagle3Draft::Impl& w, const R& rd, const Eagle3Config& c,
                  const ModelConfig& target, const Device& dev, const ops::WeightView& target_embed,
                  const std::string& dir) {
  const int64_t H = c.hidden_size, Ht = c.target_hidden_size, I = c.intermediate_size;
  const int64_t nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const DType bf = DType::BF16, f32 = DType::F32;
  if (rd.has("embed_tokens.weight")) {
    w.embed = upload(dev, rd.read("embed_tokens.weight", c.vocab_size, H, bf), bf, c.vocab_size, H);
  } else {
    if (H != target.hidden_size || !target_embed.data)
      throw Error("speculative draft " + dir + ": no embed_tokens.weight, and its hidden_size " +
                  std::to_string(H) + " differs from the target's " +
                  std::to_string(target.hidden_size) + " (cannot share its embedding)");
    w.target_embed = target_embed;
  }
  const int64_t na = int64_t(c.aux_layers.size());
  if constexpr (std::is_same_v<R, Reader>) {
    const TensorInfo& fc = rd.get("fc.weight");
    if (fc.shape.size() != 2 || fc.shape[0] != H || fc.shape[1] != na * Ht)
      throw Error("speculative draft " + dir + ": fc.weight has shape " + shape_str(fc.shape) +
                  ", expected [" + std::to_string(H) + ", " + std::to_string(na * Ht) + "] (" +
                  std::to_string(na) + " aux hidden states of the target's hidden size " +
                  std::to_string(Ht) + ")");
  }
  {
    const std::vector<uint8_t> all = rd.read("fc.weight", H, na * Ht, bf);
    for (int64_t j = 0; j < na; ++j) {
      std::vector<uint8_t> part(size_t(H * Ht) * 2);
      for (int64_t r = 0; r < H; ++r)
        std::memcpy(part.data() + size_t(r * Ht) * 2, all.data() + size_t(r * na * Ht + j * Ht) * 2,
                    size_t(Ht) * 2);
      w.fc.push_back(upload(dev, std::move(part), bf, H, Ht));
    }
  }
  const std::string L = "midlayer.";
  {
    std::vector<uint8_t> q = rd.read(L + "self_attn.q_proj.weight", nh * hd, 2 * H, bf);
    const std::vector<uint8_t> k = rd.read(L + "self_attn.k_proj.weight", nkv * hd, 2 * H, bf);
    const std::vector<uint8_t> v = rd.read(L + "self_attn.v_proj.weight", nkv * hd, 2 * H, bf);
    q.insert(q.end(), k.begin(), k.end());
    q.insert(q.end(), v.begin(), v.end());
    w.qkv = upload(dev, std::move(q), bf, (nh + 2 * nkv) * hd, 2 * H);
  }
  w.o_proj = upload(dev, rd.read(L + "self_attn.o_proj.weight", H, nh * hd, bf), bf, H, nh * hd);
  {
    std::vector<uint8_t> g = rd.read(L + "mlp.gate_proj.weight", I, H, bf);
    const std::vector<uint8_t> u = rd.read(L + "mlp.up_proj.weight", I, H, bf);
    g.insert(g.end(), u.begin(), u.end());
    w.gate_up = upload(dev, std::move(g), bf, 2 * I, H);
  }
  w.down = upload(dev, rd.read(L + "mlp.down_proj.weight", H, I, bf), bf, H, I);
  w.input_norm = upload(dev, rd.read(L + "input_layernorm.weight", H, 0, f32), f32, H, 1);
  w.hidden_norm = upload(dev, rd.read(L + "hidden_norm.weight", H, 0, f32), f32, H, 1);
  w.post_norm = upload(dev, rd.read(L + "post_attention_layernorm.weight", H, 0, f32), f32, H, 1);
  w.norm = upload(dev, rd.read("norm.weight", H, 0, f32), f32, H, 1);
  w.lm_head =
      upload(dev, rd.read("lm_head.weight", c.draft_vocab_size, H, bf), bf, c.draft_vocab_size, H);
}

}  // namespace

size_t Eagle3Draft::cache_bytes_per_block(DType kv_dtype, int block_size) const {
  size_t b = 2 * size_t(cfg_.num_kv_heads) * size_t(block_size) * size_t(cfg_.head_dim) *
             dtype_size(kv_dtype);
  if (kv_dtype == DType::FP8_E4M3)
    b += 2 * size_t(cfg_.num_kv_heads) * size_t(block_size) * sizeof(float);
  return b;
}

void Eagle3Draft::allocate_cache(DType kv_dtype, int64_t num_blocks, int block_size,
                                 int64_t max_positions) {
  Impl& w = *impl_;
  ++epoch_;
  const int64_t phys = num_blocks + 1;
  const size_t elems = size_t(phys * cfg_.num_kv_heads * block_size * cfg_.head_dim);
  w.k = Buffer(dev_, elems * dtype_size(kv_dtype));
  w.v = Buffer(dev_, elems * dtype_size(kv_dtype));
  w.kv = {};
  w.kv.k = w.k.data();
  w.kv.v = w.v.data();
  if (kv_dtype == DType::FP8_E4M3) {
    w.k_scale = Buffer(dev_, size_t(phys * cfg_.num_kv_heads * block_size) * 4);
    w.v_scale = Buffer(dev_, size_t(phys * cfg_.num_kv_heads * block_size) * 4);
    w.kv.k_scale = w.k_scale.as<float>();
    w.kv.v_scale = w.v_scale.as<float>();
  }
  w.kv.dtype = kv_dtype;
  w.kv.num_blocks = phys;
  w.kv.block_size = block_size;
  w.kv.num_kv_heads = cfg_.num_kv_heads;
  w.kv.head_dim = cfg_.head_dim;
  const int64_t positions = std::max<int64_t>(max_positions, 1) + 1;
  std::vector<float> table(size_t(positions * cfg_.head_dim));
  ops::build_rope_table(table.data(), positions, cfg_.head_dim, cfg_.rope_theta);
  w.rope = Buffer(dev_, table.size() * 4);
  copy_to_device(dev_, w.rope.data(), table.data(), table.size() * 4);
  w.rope_positions = positions;
}

void Eagle3Draft::release_cache() {
  ++epoch_;
  impl_->k = Buffer();
  impl_->v = Buffer();
  impl_->k_scale = Buffer();
  impl_->v_scale = Buffer();
  impl_->kv = {};
}

void Eagle3Draft::reserve(int64_t n, int64_t nl) {
  Impl& w = *impl_;
  auto grow = [&](Buffer& b, int64_t floats) {
    const size_t bytes = size_t(std::max<int64_t>(floats, 1)) * 4;
    if (b.bytes() < bytes) {
      b = Buffer(dev_, bytes + bytes / 4);
      ++epoch_;
    }
  };
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t qkv_cols = int64_t(cfg_.num_heads + 2 * cfg_.num_kv_heads) * cfg_.head_dim;
  // res and hin keep the previous pass's rows: grown only, never shrunk.
  grow(w.res, n * H);
  grow(w.hin, n * H);
  grow(w.emb, n * H);
  grow(w.x2, n * 2 * H);
  grow(w.qkvb, n * qkv_cols);
  grow(w.attn, n * int64_t(cfg_.num_heads) * cfg_.head_dim);
  grow(w.xn, n * H);
  grow(w.gu, n * 2 * I);
  grow(w.act, n * I);
  grow(w.sel, nl * H);
}

void Eagle3Draft::forward(const DraftStep& s, const ops::Stream& st) {
  Impl& w = *impl_;
  if (!w.kv.k) throw Error("speculative draft: forward() before allocate_cache()");
  if (s.max_position + 1 > w.rope_positions)
    throw Error("speculative draft: position " + std::to_string(s.max_position) +
                " is past its RoPE table");
  const int64_t n = s.batch.num_tokens, nl = s.num_logits;
  const int64_t H = cfg_.hidden_size, Ht = cfg_.target_hidden_size, I = cfg_.intermediate_size;
  const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, hd = cfg_.head_dim;
  if (!s.aux && s.prev_rows > 0 && n > 0) {
    // Rows of the previous pass's output are read before this pass grows anything.
    SIEVE_CHECK(int64_t(w.res.bytes() / 4) >= s.prev_rows * H,
                "speculative draft: previous rows are gone");
  }
  reserve(n, nl);
  if (n == 0) return;
  auto matmul = [&](const void* x, int64_t ldx, const Mat& m, void* y, int64_t ldy, bool acc) {
    ops::MatmulParams p;
    p.x = x;
    p.x_dtype = DType::F32;
    p.w = m.buf.data();
    p.w_dtype = m.dtype;
    p.y = y;
    p.y_dtype = DType::F32;
    p.m = n;
    p.n = m.rows;
    p.k = m.cols;
    p.ldx = ldx;
    p.ldy = ldy;
    p.accumulate = acc;
    ops::matmul(p, st);
  };
  auto rms = [&](const void* x, int64_t ldx, const Mat& wt, void* y, int64_t ldy, int64_t rows) {
    ops::RmsNormParams p;
    p.x = x;
    p.ldx = ldx;
    p.y = y;
    p.ldy = ldy;
    p.weight = wt.buf.data();
    p.weight_dtype = DType::F32;
    p.rows = rows;
    p.dim = H;
    p.eps = cfg_.rms_norm_eps;
    p.gemma = false;
    ops::rms_norm(p, st);
  };
  float* res = w.res.as<float>();

  // g: the residual stream entering the layer.
  if (s.aux) {
    for (size_t j = 0; j < w.fc.size(); ++j)
      matmul(s.aux + int64_t(j) * n * Ht, Ht, w.fc[j], res, H, j > 0);
  } else {
    ops::EmbeddingParams g;
    g.ids = s.hidden_rows;
    g.num_tokens = n;
    g.table = w.res.data();
    g.table_dtype = DType::F32;
    g.vocab = s.prev_rows;
    g.hidden = H;
    g.out = w.hin.data();
    g.out_dtype = DType::F32;
    ops::embedding(g, st);
    ops::AddParams cp;
    cp.y = res;
    cp.x = w.hin.data();
    cp.n = n * H;
    cp.assign = true;
    ops::add(cp, st);
  }
  ops::EmbeddingParams ep;
  ep.ids = s.token_ids;
  ep.num_tokens = n;
  ep.table = w.embed.rows ? w.embed.buf.data() : w.target_embed.data;
  ep.table_dtype = w.embed.rows ? w.embed.dtype : w.target_embed.dtype;
  ep.vocab = cfg_.vocab_size;
  ep.hidden = H;
  ep.out = w.emb.data();
  ep.out_dtype = DType::F32;
  ops::embedding(ep, st);
  float* x2 = w.x2.as<float>();
  rms(w.emb.data(), H, w.input_norm, x2, 2 * H, n);
  rms(res, H, w.hidden_norm, x2 + H, 2 * H, n);
  if (cfg_.norm_before_residual) rms(res, H, w.hidden_norm, res, H, n);

  const int64_t W = w.qkv.rows;
  matmul(x2, 2 * H, w.qkv, w.qkvb.data(), W, false);
  ops::QkvNormRopeCacheParams rp;
  rp.qkv = w.qkvb.data();
  rp.act_dtype = DType::F32;
  rp.num_tokens = n;
  rp.row_stride = W;
  rp.num_q_heads = nh;
  rp.num_kv_heads = nkv;
  rp.head_dim = hd;
  rp.q_offset = 0;
  rp.k_offset = int64_t(nh) * hd;
  rp.v_offset = int64_t(nh + nkv) * hd;
  rp.norm_dtype = DType::F32;
  rp.eps = cfg_.rms_norm_eps;
  rp.positions = s.positions;
  rp.cos_sin = w.rope.as<float>();
  rp.rotary_dim = hd;
  rp.slot_mapping = s.slot_mapping;
  rp.kv = w.kv;
  ops::qkv_norm_rope_cache(rp, st);
  ops::AttentionParams ap;
  ap.q = w.qkvb.data();
  ap.q_dtype = DType::F32;
  ap.q_stride = W;
  ap.out = w.attn.data();
  ap.out_dtype = DType::F32;
  ap.out_stride = int64_t(nh) * hd;
  ap.num_q_heads = nh;
  ap.num_kv_heads = nkv;
  ap.head_dim = hd;
  ap.sm_scale = float(1.0 / std::sqrt(double(hd)));
  ap.kv = w.kv;
  ap.batch = s.batch;
  ops::attention(ap, st);
  matmul(w.attn.data(), int64_t(nh) * hd, w.o_proj, res, H, true);

  rms(res, H, w.post_norm, w.xn.data(), H, n);
  matmul(w.xn.data(), H, w.gate_up, w.gu.data(), 2 * I, false);
  ops::SwigluOaiParams sp;  // alpha 1, beta 0, no limit: silu(gate) * up
  sp.gate_up = w.gu.data();
  sp.out = w.act.data();
  sp.dtype = DType::F32;
  sp.rows = n;
  sp.inter = I;
  sp.ld_in = 2 * I;
  sp.ld_out = I;
  sp.alpha = 1.0f;
  sp.beta = 0.0f;
  sp.limit = FLT_MAX;
  ops::swiglu_oai(sp, st);
  matmul(w.act.data(), I, w.down, res, H, true);

  if (nl == 0) return;
  ops::EmbeddingParams gp;  // the wanted rows, gathered
  gp.ids = s.logits_rows;
  gp.num_tokens = nl;
  gp.table = res;
  gp.table_dtype = DType::F32;
  gp.vocab = n;
  gp.hidden = H;
  gp.out = w.sel.data();
  gp.out_dtype = DType::F32;
  ops::embedding(gp, st);
  rms(w.sel.data(), H, w.norm, w.sel.data(), H, nl);
  ops::MatmulParams lp;
  lp.x = w.sel.data();
  lp.x_dtype = DType::F32;
  lp.w = w.lm_head.buf.data();
  lp.w_dtype = w.lm_head.dtype;
  lp.y = s.logits;
  lp.y_dtype = DType::F32;
  lp.m = nl;
  lp.n = w.lm_head.rows;
  lp.k = H;
  lp.ldx = H;
  lp.ldy = w.lm_head.rows;
  ops::matmul(lp, st);
}

}  // namespace sieve::spec
