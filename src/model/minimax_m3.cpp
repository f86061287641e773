// MiniMax-M3 text forward over paged caches, through kernels/ops.h only.
//
// Per layer: h += o_proj(Attn(norm_in(h))); h += FFN(norm_post(h)). Attention: one GEMM gives
// [q | k | v | index_q | index_k]; qkv_norm_rope_cache norms and ropes q, k (and the index
// branch), writes k, v (and the index key) into the paged caches; sparse layers then select
// blocks with the indexer (or reuse the top-k of the last full layer, spec §3.4) and attend
// over the selection; dense layers attend over everything.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/weights.h"

namespace sieve::model {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct LayerCache {
  Buffer k, v, k_scale, v_scale, index_k;
  ops::KvCacheView kv;
  ops::IndexCacheView index;
};

class MiniMaxM3 final : public Model {
 public:
  MiniMaxM3(ModelConfig cfg, ModelWeights w, const LoadOptions& opts)
      : cfg_(std::move(cfg)), w_(std::move(w)), dev_(opts.device) {}

  const ModelConfig& config() const override { return cfg_; }
  const Device& device() const override { return dev_; }
  const CacheOptions& cache_options() const override { return cache_opts_; }
  SelectionStats selection_stats() const override { return stats_; }
  uint64_t buffers_epoch() const override { return epoch_; }

  // Index keys are cached only by sparse layers that compute their own top-k.
  bool has_index_cache(int layer) const {
    return cfg_.is_sparse_layer(layer) && !cfg_.shares_index_topk(layer);
  }

  size_t cache_bytes_per_block(DType kv_dtype, DType index_dtype) const override {
    const size_t bs = size_t(cfg_.sparse_block_size);
    size_t total = 0;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      total += 2 * size_t(cfg_.num_key_value_heads) * bs * size_t(cfg_.head_dim) * dtype_size(kv_dtype);
      if (kv_dtype == DType::FP8_E4M3) total += 2 * size_t(cfg_.num_key_value_heads) * bs * sizeof(float);
      if (has_index_cache(l)) total += bs * size_t(cfg_.sparse_index_dim) * dtype_size(index_dtype);
    }
    return total;
  }

  void allocate_caches(const CacheOptions& o) override {
    for (DType t : {o.kv_dtype, o.index_dtype})
      if (t != DType::F32 && t != DType::BF16 && t != DType::FP8_E4M3)
        throw Error("cache dtype must be fp32, bf16 or fp8, got " + std::string(dtype_name(t)));
    if (dev_.is_cuda() && (o.kv_dtype == DType::F32 || o.index_dtype == DType::F32))
      throw Error("fp32 caches are a mode of the CPU reference; on " + dev_.str() +
                  " use a bf16 or fp8 cache (--kv-cache-dtype, --index-cache-dtype)");
    if (o.num_blocks <= 0) throw Error("the KV cache needs at least one block");
    cache_opts_ = o;
    stats_ = {};
    ++epoch_;
    caches_.clear();
    caches_.resize(cfg_.num_hidden_layers);
    const int64_t bs = cfg_.sparse_block_size;
    const int64_t nkv = cfg_.num_key_value_heads;
    // One block past the engine's: the padding rows of captured decode steps write there.
    const int64_t phys = o.num_blocks + 1;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      LayerCache& c = caches_[l];
      const size_t kv_elems = size_t(phys * nkv * bs * cfg_.head_dim);
      c.k = Buffer(dev_, kv_elems * dtype_size(o.kv_dtype));
      c.v = Buffer(dev_, kv_elems * dtype_size(o.kv_dtype));
      c.kv.k = c.k.data();
      c.kv.v = c.v.data();
      if (o.kv_dtype == DType::FP8_E4M3) {
        c.k_scale = Buffer(dev_, size_t(phys * nkv * bs) * sizeof(float));
        c.v_scale = Buffer(dev_, size_t(phys * nkv * bs) * sizeof(float));
        c.kv.k_scale = c.k_scale.as<float>();
        c.kv.v_scale = c.v_scale.as<float>();
      }
      c.kv.dtype = o.kv_dtype;
      c.kv.num_blocks = phys;
      c.kv.block_size = int(bs);
      c.kv.num_kv_heads = int(nkv);
      c.kv.head_dim = cfg_.head_dim;
      if (has_index_cache(l)) {
        c.index_k = Buffer(dev_, size_t(phys * bs * cfg_.sparse_index_dim) * dtype_size(o.index_dtype));
        c.index.k = c.index_k.data();
        c.index.dtype = o.index_dtype;
        c.index.num_blocks = phys;
        c.index.block_size = int(bs);
        c.index.index_dim = cfg_.sparse_index_dim;
      }
    }
  }

  void reserve_step(int64_t max_tokens, int64_t max_logit_rows) override {
    size_activations(max_tokens, max_logit_rows);
  }

  void release_caches() override {
    ++epoch_;
    caches_.clear();
    cache_opts_ = {};
  }

  void forward(const StepView& step, const ops::Stream& stream) override {
    if (caches_.empty()) throw Error("forward() before allocate_caches()");
    stream_ = stream;
    ensure_rope_table(int64_t(std::max(step.max_position, step.batch.max_seq_len)) + 1);
    enqueue_step(step);
  }

 private:
  // Enqueues the whole step on stream_ (CUDA: nothing waits; CPU: runs).
  void enqueue_step(const StepView& step) {
    const ops::BatchView& batch = step.batch;
    const int64_t n = batch.num_tokens;
    const int64_t H = cfg_.hidden_size;
    const int nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
    const int nidx = cfg_.sparse_num_index_heads, idim = cfg_.sparse_index_dim;
    const int K = cfg_.sparse_topk_blocks;
    StepBuffers& sb = step_;

    // Activations (fp32, as on the reference backend).
    const std::span<const int32_t> logits_rows = step.logits_rows;
    const int64_t nl = int64_t(logits_rows.size());
    size_activations(n, nl);
    const int64_t q_cols = int64_t(nq) * hd, kv_cols = int64_t(nkv) * hd;
    Buffer &h = sb.h, &xn = sb.xn, &qkv = sb.qkv, &attn = sb.attn, &gate_up = sb.gate_up, &act = sb.act;
    Buffer &topk = sb.topk, &router_logits = sb.router_logits, &route_ids = sb.route_ids, &route_w = sb.route_w;

    ops::EmbeddingParams ep;
    ep.ids = step.token_ids;
    ep.num_tokens = n;
    ep.table = w_.embed.data();
    ep.table_dtype = w_.embed.dtype;
    ep.vocab = cfg_.vocab_size;
    ep.hidden = H;
    ep.out = h.data();
    ep.out_dtype = DType::F32;
    ops::embedding(ep, stream_);

    bool have_topk = false;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      const LayerWeights& L = w_.layers[l];
      LayerCache& C = caches_[l];
      norm(h.data(), xn.data(), L.input_norm, n);

      // [q | k | v | index_q | index_k]
      const int64_t W = L.qkv.rows;
      matmul(xn.data(), H, L.qkv, qkv.data(), W, n, false);
      ops::QkvNormRopeCacheParams rp;
      rp.qkv = qkv.data();
      rp.act_dtype = DType::F32;
      rp.num_tokens = n;
      rp.row_stride = W;
      rp.num_q_heads = nq;
      rp.num_kv_heads = nkv;
      rp.head_dim = hd;
      rp.q_offset = 0;
      rp.k_offset = q_cols;
      rp.v_offset = q_cols + kv_cols;
      rp.q_norm = L.q_norm.data();
      rp.k_norm = L.k_norm.data();
      rp.norm_dtype = DType::F32;
      rp.eps = cfg_.rms_norm_eps;
      rp.positions = step.positions;
      rp.cos_sin = rope_.as<float>();
      rp.rotary_dim = cfg_.rotary_dim;
      rp.slot_mapping = step.slot_mapping;
      rp.kv = C.kv;
      const bool full_index = has_index_cache(l) && !cache_opts_.dense;
      if (L.sparse) {
        rp.num_index_heads = nidx;
        rp.index_dim = idim;
        rp.index_q_offset = q_cols + 2 * kv_cols;
        rp.index_k_offset = rp.index_q_offset + int64_t(nidx) * idim;
        rp.index_q_norm = L.index_q_norm.data();
        rp.index_k_norm = L.index_k_norm.data();
        rp.norm_rope_index = full_index;
        if (full_index) rp.index_cache = C.index;
      }
      ops::qkv_norm_rope_cache(rp, stream_);

      if (full_index) {
        ops::IndexerParams ip;
        ip.index_q = static_cast<float*>(qkv.data()) + rp.index_q_offset;
        ip.q_dtype = DType::F32;
        ip.q_stride = W;
        ip.num_index_heads = nidx;
        ip.index_dim = idim;
        ip.score_scale = float(1.0 / std::sqrt(double(hd))) * kLog2e;
        ip.cache = C.index;
        ip.batch = batch;
        ip.topk = K;
        ip.init_blocks = cfg_.sparse_init_block;
        ip.local_blocks = cfg_.sparse_local_block;
        ip.topk_idx = topk.as<int32_t>();
        ops::indexer(ip, stream_);
        have_topk = true;
        if (cache_opts_.compare_index) compare_selection(ip, step.positions);
      }

      ops::AttentionParams ap;
      ap.q = qkv.data();
      ap.q_dtype = DType::F32;
      ap.q_stride = W;
      ap.out = attn.data();
      ap.out_dtype = DType::F32;
      ap.out_stride = q_cols;
      ap.num_q_heads = nq;
      ap.num_kv_heads = nkv;
      ap.head_dim = hd;
      ap.sm_scale = float(1.0 / std::sqrt(double(hd)));
      ap.kv = C.kv;
      ap.batch = batch;
      if (L.sparse && !cache_opts_.dense) {
        if (!have_topk)
          throw Error("layer " + std::to_string(l) +
                      " shares the index top-k but no earlier sparse layer computed one");
        ap.topk_idx = topk.as<int32_t>();
        ap.topk = K;
      }
      ops::attention(ap, stream_);
      matmul(attn.data(), q_cols, L.o_proj, h.data(), H, n, true);

      // FFN
      norm(h.data(), xn.data(), L.post_norm, n);
      if (L.moe) {
        const int E = cfg_.num_local_experts, k = cfg_.num_experts_per_tok;
        matmul(xn.data(), H, L.router, router_logits.data(), E, n, false);
        ops::MoeRouteParams mr;
        mr.logits = router_logits.as<float>();
        mr.bias = L.router_bias.rows ? static_cast<const float*>(L.router_bias.data()) : nullptr;
        mr.num_tokens = n;
        mr.num_experts = E;
        mr.topk = k;
        mr.renormalize = cfg_.norm_topk_prob;
        mr.scaling = cfg_.routed_scaling_factor;
        mr.ids = route_ids.as<int32_t>();
        mr.weights = route_w.as<float>();
        ops::moe_route(mr, stream_);
        ops::MoeExpertsParams me;
        me.x = xn.data();
        me.act_dtype = DType::F32;
        me.num_tokens = n;
        me.hidden = H;
        me.inter = cfg_.intermediate_size;
        me.num_experts = E;
        me.topk = k;
        me.ids = route_ids.as<int32_t>();
        me.weights = route_w.as<float>();
        me.w_gate_up = static_cast<const void* const*>(L.expert_gate_up_ptrs.data());
        me.w_down = static_cast<const void* const*>(L.expert_down_ptrs.data());
        me.w_dtype = L.expert_gate_up[0].dtype;
        me.alpha = cfg_.swiglu_alpha;
        me.limit = cfg_.swiglu_limit;
        me.beta = cfg_.swiglu_beta;
        me.out = h.data();
        ops::moe_experts(me, stream_);
        if (L.shared_gate_up.rows) mlp(L.shared_gate_up, L.shared_down, xn, gate_up, act, h, n);
      } else {
        mlp(L.mlp_gate_up, L.mlp_down, xn, gate_up, act, h, n);
      }
    }

    // Final norm and lm_head on the requested rows only.
    if (nl == 0) return;
    Buffer& sel = sb.sel;
    // One call per run of consecutive rows (a decode batch is one run).
    for (int64_t i = 0; i < nl;) {
      int64_t j = i + 1;
      while (j < nl && logits_rows[size_t(j)] == logits_rows[size_t(j - 1)] + 1) ++j;
      ops::RmsNormParams np = norm_params(w_.norm, j - i);
      np.x = static_cast<float*>(h.data()) + int64_t(logits_rows[size_t(i)]) * H;
      np.y = static_cast<float*>(sel.data()) + i * H;
      ops::rms_norm(np, stream_);
      i = j;
    }
    matmul(sel.data(), H, w_.lm_head, step.logits, cfg_.vocab_size, nl, false);
  }

  // Activations of forward(), kept between steps: a buffer grows when a step needs more than
  // it holds and is otherwise reused, so a decode step allocates nothing.
  struct StepBuffers {
    Buffer h, xn, qkv, attn, gate_up, act, topk, router_logits, route_ids, route_w, sel;
  };

  // b, holding at least `bytes` (at least 1). Captured steps point at b, so replacing it is a
  // new epoch.
  Buffer& sized(Buffer& b, size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    if (b.bytes() < bytes) {
      b = Buffer(dev_, bytes + bytes / 4);
      ++epoch_;
    }
    return b;
  }

  // Grows the activation buffers for a step of n tokens with nl logit rows.
  void size_activations(int64_t n, int64_t nl) {
    const int64_t H = cfg_.hidden_size, K = cfg_.sparse_topk_blocks;
    const int64_t nidx = cfg_.sparse_num_index_heads, idim = cfg_.sparse_index_dim;
    const int64_t q_cols = int64_t(cfg_.num_attention_heads) * cfg_.head_dim;
    const int64_t kv_cols = int64_t(cfg_.num_key_value_heads) * cfg_.head_dim;
    const int64_t qkv_cols = q_cols + 2 * kv_cols + nidx * idim + idim;
    const int64_t ffn_cols = std::max<int64_t>({cfg_.dense_intermediate_size, cfg_.shared_intermediate_size, 1});
    StepBuffers& sb = step_;
    sized(sb.h, size_t(n * H) * 4);
    sized(sb.xn, size_t(n * H) * 4);
    sized(sb.qkv, size_t(n * qkv_cols) * 4);
    sized(sb.attn, size_t(n * q_cols) * 4);
    sized(sb.gate_up, size_t(n * 2 * ffn_cols) * 4);
    sized(sb.act, size_t(n * ffn_cols) * 4);
    sized(sb.topk, size_t(n * nidx * K) * 4);
    sized(sb.router_logits, size_t(n * cfg_.num_local_experts) * 4);
    sized(sb.route_ids, size_t(n * cfg_.num_experts_per_tok) * 4);
    sized(sb.route_w, size_t(n * cfg_.num_experts_per_tok) * 4);
    sized(sb.sel, size_t(nl * H) * 4);
  }

  template <class T>
  Buffer& upload_into(Buffer& b, const std::vector<T>& v) {
    sized(b, v.size() * sizeof(T));
    if (!v.empty()) copy_to_device(dev_, b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }

  // Re-runs the indexer of a full sparse layer on its index keys re-stored in
  // compare_index_dtype (exactly what that cache would hold: fp8 keys are cast from the
  // bf16-rounded value) and counts where the two selections agree.
  void compare_selection(const ops::IndexerParams& ip, const int32_t* positions) {
    const ops::IndexCacheView& c = ip.cache;
    const size_t elems = size_t(c.num_blocks) * size_t(c.block_size) * size_t(c.index_dim);
    std::vector<uint8_t> src(elems * dtype_size(c.dtype));
    copy_to_host(dev_, src.data(), c.k, src.size());
    const DType to = cache_opts_.compare_index_dtype;
    std::vector<uint8_t> dst(elems * dtype_size(to));
    for (size_t i = 0; i < elems; ++i) {
      float v = load_as_f32(src.data(), c.dtype, i);
      if (to == DType::FP8_E4M3) v = round_bf16(v);
      store_from_f32(dst.data(), to, i, v);
    }
    Buffer shadow(dev_, dst.size());
    copy_to_device(dev_, shadow.data(), dst.data(), dst.size());
    const size_t n = size_t(ip.batch.num_tokens) * size_t(ip.num_index_heads) * size_t(ip.topk);
    Buffer other(dev_, n * sizeof(int32_t));
    ops::IndexerParams p2 = ip;
    p2.cache.k = shadow.data();
    p2.cache.dtype = to;
    p2.topk_idx = other.as<int32_t>();
    ops::indexer(p2, stream_);
    std::vector<int32_t> a(n), b(n);
    copy_to_host(dev_, a.data(), ip.topk_idx, n * sizeof(int32_t));
    copy_to_host(dev_, b.data(), other.data(), n * sizeof(int32_t));
    std::vector<int32_t> pos(size_t(ip.batch.num_tokens));
    copy_to_host(dev_, pos.data(), positions, pos.size() * sizeof(int32_t));
    const int K = ip.topk, bs = c.block_size;
    for (int64_t t = 0; t < ip.batch.num_tokens; ++t) {
      const int n_blk = pos[size_t(t)] / bs + 1;
      for (int h = 0; h < ip.num_index_heads; ++h) {
        const int32_t* ra = a.data() + (size_t(t) * ip.num_index_heads + h) * K;
        const int32_t* rb = b.data() + (size_t(t) * ip.num_index_heads + h) * K;
        ++stats_.rows;
        if (n_blk <= K) continue;
        ++stats_.dropping_rows;
        int agreed = 0;
        for (int i = 0; i < K; ++i)
          if (ra[i] >= 0 && std::find(rb, rb + K, ra[i]) != rb + K) ++agreed;
        stats_.selected += K;
        stats_.agreed += agreed;
        if (agreed == K) ++stats_.identical_rows;
      }
    }
  }

  void ensure_rope_table(int64_t positions) {
    if (positions <= rope_positions_) return;
    int64_t want = std::max<int64_t>(positions, std::max<int64_t>(rope_positions_ * 2, 4096));
    if (cfg_.max_position_embeddings > 0) want = std::max(positions, std::min(want, cfg_.max_position_embeddings));
    std::vector<float> table(size_t(want * cfg_.rotary_dim));
    if (cfg_.rotary_dim > 0) ops::build_rope_table(table.data(), want, cfg_.rotary_dim, cfg_.rope_theta);
    upload_into(rope_, table);
    rope_positions_ = want;
  }

  ops::RmsNormParams norm_params(const Weight& w, int64_t rows) const {
    ops::RmsNormParams np;
    np.x_dtype = DType::F32;
    np.y_dtype = DType::F32;
    np.weight = w.data();
    np.weight_dtype = w.dtype;
    np.rows = rows;
    np.dim = cfg_.hidden_size;
    np.ldx = np.ldy = cfg_.hidden_size;
    np.eps = cfg_.rms_norm_eps;
    np.gemma = cfg_.use_gemma_norm;
    return np;
  }

  void norm(void* x, void* y, const Weight& w, int64_t rows) {
    ops::RmsNormParams np = norm_params(w, rows);
    np.x = x;
    np.y = y;
    ops::rms_norm(np, stream_);
  }

  // y[m, w.rows] (+)= x[m, w.cols] . w^T
  void matmul(const void* x, int64_t ldx, const Weight& w, void* y, int64_t ldy, int64_t m, bool acc) {
    ops::MatmulParams mp;
    mp.x = x;
    mp.x_dtype = DType::F32;
    mp.w = w.data();
    mp.w_dtype = w.dtype;
    mp.y = y;
    mp.y_dtype = DType::F32;
    mp.m = m;
    mp.n = w.rows;
    mp.k = w.cols;
    mp.ldx = ldx;
    mp.ldy = ldy;
    mp.accumulate = acc;
    ops::matmul(mp, stream_);
  }

  // out += down(swiglu_oai(gate_up(x)))
  void mlp(const Weight& gu, const Weight& down, Buffer& x, Buffer& gate_up, Buffer& act, Buffer& out,
           int64_t n) {
    const int64_t I = down.cols;
    matmul(x.data(), cfg_.hidden_size, gu, gate_up.data(), 2 * I, n, false);
    ops::SwigluOaiParams sp;
    sp.gate_up = gate_up.data();
    sp.out = act.data();
    sp.dtype = DType::F32;
    sp.rows = n;
    sp.inter = I;
    sp.ld_in = 2 * I;
    sp.ld_out = I;
    sp.alpha = cfg_.swiglu_alpha;
    sp.limit = cfg_.swiglu_limit;
    sp.beta = cfg_.swiglu_beta;
    ops::swiglu_oai(sp, stream_);
    matmul(act.data(), I, down, out.data(), cfg_.hidden_size, n, true);
  }

  ModelConfig cfg_;
  ModelWeights w_;
  Device dev_;
  ops::Stream stream_;  // forward()'s
  CacheOptions cache_opts_;
  std::vector<LayerCache> caches_;
  Buffer rope_;
  int64_t rope_positions_ = 0;
  StepBuffers step_;
  SelectionStats stats_;
  uint64_t epoch_ = 0;  // bumped when a buffer that captured steps point at is replaced
};

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, const LoadOptions& opts) {
  ModelConfig cfg = load_model_config(dir, opts.hf_overrides);
  if (cfg.hidden_act != "swigluoai" && cfg.hidden_act != "swiglu_oai")
    throw Error(dir + "/config.json: hidden_act \"" + cfg.hidden_act + "\" is not supported (expected swigluoai)");
  if (cfg.num_local_experts > 0 && cfg.scoring_func != "sigmoid")
    throw Error(dir + "/config.json: scoring_func \"" + cfg.scoring_func + "\" is not supported (expected sigmoid)");
  Checkpoint ckpt = Checkpoint::open(dir);
  ModelWeights w = load_weights(ckpt, cfg, opts.device);
  return std::make_unique<MiniMaxM3>(std::move(cfg), std::move(w), opts);
}

}  // namespace sieve::model
