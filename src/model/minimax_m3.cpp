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
#include <map>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/weights.h"

namespace sieve::model {

DType parse_cache_dtype(const std::string& name, const std::string& flag) {
  if (name == "auto" || name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp8" || name == "fp8_e4m3") return DType::FP8_E4M3;
  if (name == "fp32" || name == "float32") return DType::F32;
  throw Error(flag + ": unknown cache dtype \"" + name + "\" (expected auto, bf16, fp8 or fp32)");
}

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
      : cfg_(std::move(cfg)), w_(std::move(w)), dev_(opts.device), enforce_eager_(opts.enforce_eager),
        max_graph_batch_(opts.max_graph_batch) {
    stream_.device = dev_;
    // CUDA: the model's own stream (graphs are captured from it), ordered with the synchronous
    // copies of kernels/memory.h.
    stream_.cuda_stream = create_stream(dev_);
  }
  ~MiniMaxM3() override {
    graphs_.clear();
    if (stream_.cuda_stream) {
      try {
        device_synchronize(dev_);
      } catch (...) {
      }
      destroy_stream(dev_, stream_.cuda_stream);
    }
  }

  const ModelConfig& config() const override { return cfg_; }
  const CacheOptions& cache_options() const override { return cache_opts_; }
  SelectionStats selection_stats() const override { return stats_; }
  GraphStats graph_stats() const override { return graph_stats_; }

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
    graphs_.clear();
    ++gen_;
    caches_.clear();
    caches_.resize(cfg_.num_hidden_layers);
    const int64_t bs = cfg_.sparse_block_size;
    const int64_t nkv = cfg_.num_key_value_heads;
    // One block past the engine's: the padding rows of graph decode steps write there.
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

  void reserve_step(int64_t max_tokens, int64_t max_seqs) override {
    size_activations(max_tokens, std::min(max_tokens, max_seqs));
  }

  void release_caches() override {
    graphs_.clear();
    ++gen_;
    caches_.clear();
    cache_opts_ = {};
  }

  void forward(const StepInputs& in, std::vector<float>& logits) override {
    if (caches_.empty()) throw Error("forward() before allocate_caches()");
    use_device(dev_);  // the engine's thread is not the one that loaded the model
    validate(in);
    if (graph_step(in, logits)) return;
    const StepShape sh = shape_of(in);
    ensure_rope_table(std::max(sh.max_pos, sh.max_seq) + 1);
    const DeviceInputs d = upload_step(in, step_.inputs, false);
    enqueue_step(sh, d, in.logits_indices, &in);
    read_logits(int64_t(in.logits_indices.size()), logits);
  }

 private:
  // Host-side sizes of a step; the kernels' grids come from these.
  struct StepShape {
    int64_t n = 0;  // tokens
    int num_seqs = 0;
    int max_seq = 0, max_q = 0, max_pos = 0;
    int mbps = 0;  // block-table width
  };
  // The step's arrays in device memory (one staging buffer).
  struct DeviceInputs {
    const int32_t* ids = nullptr;
    const int32_t* pos = nullptr;
    const int64_t* slots = nullptr;
    const int32_t* qsl = nullptr;
    const int32_t* lens = nullptr;
    const int32_t* tables = nullptr;
  };

  static StepShape shape_of(const StepInputs& in) {
    StepShape sh;
    sh.n = int64_t(in.token_ids.size());
    sh.num_seqs = int(in.seq_lens.size());
    for (int32_t p : in.positions) sh.max_pos = std::max(sh.max_pos, p);
    for (int s = 0; s < sh.num_seqs; ++s) {
      sh.max_seq = std::max(sh.max_seq, in.seq_lens[s]);
      sh.max_q = std::max(sh.max_q, in.query_start_loc[s + 1] - in.query_start_loc[s]);
    }
    sh.mbps = in.max_blocks_per_seq;
    return sh;
  }

  // Copies the six arrays into `dst` in one copy (each at a 16-byte aligned offset). `pinned`:
  // dst is a captured graph's, so it must not move (its size is the graph's).
  DeviceInputs upload_step(const StepInputs& in, Buffer& dst, bool pinned) {
    size_t staged = 0;
    auto place = [&](size_t bytes) {
      const size_t at = staged;
      staged += (bytes + 15) / 16 * 16;
      return at;
    };
    const size_t o_ids = place(in.token_ids.size() * 4), o_pos = place(in.positions.size() * 4);
    const size_t o_slots = place(in.slot_mapping.size() * 8), o_qsl = place(in.query_start_loc.size() * 4);
    const size_t o_lens = place(in.seq_lens.size() * 4), o_bt = place(in.block_tables.size() * 4);
    stage_.resize(staged);
    auto put = [&](size_t at, const auto& v) {
      if (!v.empty()) std::memcpy(stage_.data() + at, v.data(), v.size() * sizeof(v[0]));
    };
    put(o_ids, in.token_ids);
    put(o_pos, in.positions);
    put(o_slots, in.slot_mapping);
    put(o_qsl, in.query_start_loc);
    put(o_lens, in.seq_lens);
    put(o_bt, in.block_tables);
    if (pinned && dst.bytes() && dst.bytes() < staged) throw Error("graph inputs changed size");
    const uint8_t* dev_in = static_cast<const uint8_t*>(upload_into(dst, stage_, false).data());
    DeviceInputs d;
    d.ids = reinterpret_cast<const int32_t*>(dev_in + o_ids);
    d.pos = reinterpret_cast<const int32_t*>(dev_in + o_pos);
    d.slots = reinterpret_cast<const int64_t*>(dev_in + o_slots);
    d.qsl = reinterpret_cast<const int32_t*>(dev_in + o_qsl);
    d.lens = reinterpret_cast<const int32_t*>(dev_in + o_lens);
    d.tables = reinterpret_cast<const int32_t*>(dev_in + o_bt);
    return d;
  }

  // The first `rows` logit rows of the last step, to the host.
  void read_logits(int64_t rows, std::vector<float>& logits) {
    logits.assign(size_t(rows * cfg_.vocab_size), 0.0f);
    if (rows > 0) copy_to_host(dev_, logits.data(), step_.out.data(), logits.size() * sizeof(float));
  }

  // ---- CUDA graphs for decode steps.
  // A decode step: one new token per sequence and its logit row, in order.
  bool is_graph_shape(const StepInputs& in) const {
    const size_t n = in.token_ids.size();
    if (!dev_.is_cuda() || n == 0 || n != in.seq_lens.size() || in.logits_indices.size() != n) return false;
    for (size_t i = 0; i < n; ++i)
      if (in.logits_indices[i] != int32_t(i) || in.query_start_loc[i + 1] != int32_t(i + 1)) return false;
    return true;
  }

  // Padded batch sizes: 1, 2, 4, 8, then multiples of 8 (vLLM's capture sizes).
  static int graph_rows(int n) { return n <= 4 ? (n <= 1 ? 1 : n <= 2 ? 2 : 4) : (n + 7) / 8 * 8; }

  // Runs a decode step as a graph replay (or its first, eager run and capture). False for other
  // steps, and for decode steps that graphs do not take (counted as eager).
  bool graph_step(const StepInputs& in, std::vector<float>& logits) {
    if (!is_graph_shape(in)) return false;
    const int n = int(in.token_ids.size());
    if (enforce_eager_ || !graph_stats_.off_reason.empty() || cache_opts_.compare_index || n > max_graph_batch_) {
      ++graph_stats_.eager;
      return false;
    }
    const int rows = graph_rows(n);
    // Context bucket: the grids are those of `keys` keys, and the kernels take any live length
    // up to it. Buckets 8 blocks x 2^k and 12 blocks x 2^k, so a grid is sized for at most 4/3
    // of the blocks its longest sequence has (past 8 blocks).
    const int bs = cfg_.sparse_block_size;
    int max_seq = 0;
    for (int32_t l : in.seq_lens) max_seq = std::max(max_seq, l);
    int64_t blocks = 8;
    while (blocks * bs < max_seq) blocks = blocks % 3 == 0 ? blocks / 3 * 4 : blocks / 2 * 3;
    const int64_t keys = blocks * bs;
    if (keys > (int64_t(1) << 30)) {
      ++graph_stats_.eager;
      return false;
    }
    const StepInputs p = pad_decode_step(in, rows, int(keys / bs), int32_t(cache_opts_.num_blocks), bs);
    StepShape sh = shape_of(p);
    sh.max_seq = int(keys);
    ensure_rope_table(keys);  // every position a replay of this graph can see
    const auto key = std::make_pair(rows, int(keys));
    // Graphs captured before a buffer they point at was replaced are retired.
    std::erase_if(graphs_, [&](const auto& kv) { return kv.second.gen != gen_; });
    auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      it->second.used = ++graph_clock_;
      upload_step(p, it->second.inputs, true);
      it->second.graph.replay(stream_.cuda_stream);
      ++graph_stats_.replayed;
      read_logits(n, logits);
      return true;
    }
    // First use of the shape: run it eagerly on the graph's own inputs (this step's result; the
    // kernels' workspaces grow to the shape), then capture the same work.
    StepGraph g;
    const DeviceInputs d = upload_step(p, g.inputs, false);
    enqueue_step(sh, d, p.logits_indices);
    read_logits(n, logits);
    ++graph_stats_.eager;
    std::string why;
    g.graph = Graph::capture(dev_, stream_.cuda_stream, [&] { enqueue_step(sh, d, p.logits_indices); }, &why);
    if (!g.graph) {
      graph_stats_.off_reason = why.empty() ? "capture failed" : why;
      graphs_.clear();
      SIEVE_LOG(Warn, "CUDA graphs turned off, decode steps run eagerly: " << graph_stats_.off_reason);
      return true;
    }
    g.gen = gen_;
    g.used = ++graph_clock_;
    ++graph_stats_.captured;
    // At most kMaxGraphs kept (each holds its kernels' launch records): the least recently
    // replayed goes.
    if (graphs_.size() >= kMaxGraphs)
      graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
        return a.second.used < b.second.used;
      }));
    SIEVE_LOG(Debug, "captured the decode step of " << rows << " sequences, contexts up to " << keys << " keys");
    graphs_.emplace(key, std::move(g));
    return true;
  }

  // Enqueues the whole step on stream_ (CUDA: nothing waits; CPU: runs). The logits of
  // logits_indices' rows end in step_.out.
  // host: the step's host arrays (for compare_index; null in graph steps, which never compare).
  void enqueue_step(const StepShape& sh, const DeviceInputs& d, const std::vector<int32_t>& logits_indices,
                    const StepInputs* host = nullptr) {
    const int64_t n = sh.n;
    const int num_seqs = sh.num_seqs;
    const int64_t H = cfg_.hidden_size;
    const int nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
    const int nidx = cfg_.sparse_num_index_heads, idim = cfg_.sparse_index_dim;
    const int K = cfg_.sparse_topk_blocks;
    StepBuffers& sb = step_;
    ops::BatchView batch;
    batch.num_seqs = num_seqs;
    batch.num_tokens = n;
    batch.query_start_loc = d.qsl;
    batch.seq_lens = d.lens;
    batch.block_tables = d.tables;
    batch.max_blocks_per_seq = sh.mbps;
    batch.max_seq_len = sh.max_seq;
    batch.max_query_len = sh.max_q;

    // Activations (fp32, as on the reference backend).
    const int64_t nl = int64_t(logits_indices.size());
    size_activations(n, nl);
    const int64_t q_cols = int64_t(nq) * hd, kv_cols = int64_t(nkv) * hd;
    Buffer &h = sb.h, &xn = sb.xn, &qkv = sb.qkv, &attn = sb.attn, &gate_up = sb.gate_up, &act = sb.act;
    Buffer &topk = sb.topk, &router_logits = sb.router_logits, &route_ids = sb.route_ids, &route_w = sb.route_w;

    ops::EmbeddingParams ep;
    ep.ids = d.ids;
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
      rp.positions = d.pos;
      rp.cos_sin = rope_.as<float>();
      rp.rotary_dim = cfg_.rotary_dim;
      rp.slot_mapping = d.slots;
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
        if (cache_opts_.compare_index && host) compare_selection(ip, *host);
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
    Buffer &sel = sb.sel, &out = sb.out;
    // One call per run of consecutive rows (a decode batch is one run).
    for (int64_t i = 0; i < nl;) {
      int64_t j = i + 1;
      while (j < nl && logits_indices[size_t(j)] == logits_indices[size_t(j - 1)] + 1) ++j;
      ops::RmsNormParams np = norm_params(w_.norm, j - i);
      np.x = static_cast<float*>(h.data()) + int64_t(logits_indices[size_t(i)]) * H;
      np.y = static_cast<float*>(sel.data()) + i * H;
      ops::rms_norm(np, stream_);
      i = j;
    }
    matmul(sel.data(), H, w_.lm_head, out.data(), cfg_.vocab_size, nl, false);
  }

  // Activations and step inputs of forward(), kept between steps: a buffer grows when a step
  // needs more than it holds and is otherwise reused, so a decode step allocates nothing.
  struct StepBuffers {
    Buffer inputs;  // token ids, positions, slots, query starts, lengths, block tables
    Buffer h, xn, qkv, attn, gate_up, act, topk, router_logits, route_ids, route_w, sel, out;
  };

  // b, holding at least `bytes` (at least 1). captured: graphs may point at b, so replacing it
  // retires them.
  Buffer& sized(Buffer& b, size_t bytes, bool captured = true) {
    bytes = std::max<size_t>(bytes, 1);
    if (b.bytes() < bytes) {
      b = Buffer(dev_, bytes + bytes / 4);
      if (captured) ++gen_;
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
    sized(sb.out, size_t(nl * cfg_.vocab_size) * 4);
  }

  template <class T>
  Buffer& upload_into(Buffer& b, const std::vector<T>& v, bool captured = true) {
    sized(b, v.size() * sizeof(T), captured);
    if (!v.empty()) copy_to_device(dev_, b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }

  void validate(const StepInputs& in) const {
    const size_t n = in.token_ids.size();
    const size_t ns = in.seq_lens.size();
    if (in.positions.size() != n || in.slot_mapping.size() != n)
      throw Error("step inputs: positions and slot_mapping must have one entry per token");
    if (in.query_start_loc.size() != ns + 1 || in.query_start_loc[0] != 0 ||
        size_t(in.query_start_loc[ns]) != n)
      throw Error("step inputs: query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
    if (in.block_tables.size() != ns * size_t(in.max_blocks_per_seq))
      throw Error("step inputs: block_tables must be num_seqs x max_blocks_per_seq");
    const int64_t slots = cache_opts_.num_blocks * cfg_.sparse_block_size;
    for (size_t i = 0; i < n; ++i) {
      if (in.token_ids[i] < 0 || in.token_ids[i] >= cfg_.vocab_size)
        throw Error("token id " + std::to_string(in.token_ids[i]) + " is outside the vocabulary [0, " +
                    std::to_string(cfg_.vocab_size) + ")");
      if (in.slot_mapping[i] >= slots) throw Error("step inputs: slot outside the cache");
    }
    for (size_t s = 0; s < ns; ++s) {
      const int32_t q = in.query_start_loc[s + 1] - in.query_start_loc[s];
      if (q < 0 || in.seq_lens[s] < q)
        throw Error("step inputs: sequence " + std::to_string(s) + " has fewer keys than new tokens");
      const int64_t blocks = (in.seq_lens[s] + cfg_.sparse_block_size - 1) / cfg_.sparse_block_size;
      if (blocks > in.max_blocks_per_seq)
        throw Error("step inputs: sequence " + std::to_string(s) + " needs more blocks than its table has");
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t phys = in.block_tables[s * in.max_blocks_per_seq + b];
        if (phys < 0 || phys >= cache_opts_.num_blocks)
          throw Error("step inputs: block table entry outside the cache");
      }
    }
    for (int32_t r : in.logits_indices)
      if (r < 0 || size_t(r) >= n) throw Error("step inputs: logits index outside the batch");
  }

  // Re-runs the indexer of a full sparse layer on its index keys re-stored in
  // compare_index_dtype (exactly what that cache would hold: fp8 keys are cast from the
  // bf16-rounded value) and counts where the two selections agree.
  void compare_selection(const ops::IndexerParams& ip, const StepInputs& in) {
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
    const int K = ip.topk, bs = c.block_size;
    for (int64_t t = 0; t < ip.batch.num_tokens; ++t) {
      const int n_blk = in.positions[size_t(t)] / bs + 1;
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

  // A captured decode step and the inputs buffer its kernels read.
  struct StepGraph {
    Graph graph;
    Buffer inputs;
    uint64_t gen = 0;   // gen_ at capture
    uint64_t used = 0;  // graph_clock_ at the last capture or replay
  };
  static constexpr size_t kMaxGraphs = 64;

  ModelConfig cfg_;
  ModelWeights w_;
  Device dev_;
  bool enforce_eager_ = false;
  int max_graph_batch_ = 256;
  ops::Stream stream_;
  CacheOptions cache_opts_;
  std::vector<LayerCache> caches_;
  Buffer rope_;
  int64_t rope_positions_ = 0;
  StepBuffers step_;
  std::vector<uint8_t> stage_;  // host side of step_.inputs
  SelectionStats stats_;
  std::map<std::pair<int, int>, StepGraph> graphs_;  // by (padded rows, context bucket)
  uint64_t gen_ = 0;  // bumped when a buffer that graphs point at is replaced
  uint64_t graph_clock_ = 0;
  GraphStats graph_stats_;
};

}  // namespace

StepInputs pad_decode_step(const StepInputs& in, int rows, int width, int32_t pad_block, int block_size) {
  const size_t n = in.token_ids.size();
  SIEVE_CHECK(in.seq_lens.size() == n && in.logits_indices.size() == n, "pad_decode_step: not a decode step");
  SIEVE_CHECK(size_t(rows) >= n, "pad_decode_step: fewer rows than sequences");
  StepInputs p;
  p.token_ids = in.token_ids;
  p.token_ids.resize(size_t(rows), 0);
  p.positions = in.positions;
  p.positions.resize(size_t(rows), 0);
  p.slot_mapping = in.slot_mapping;
  p.slot_mapping.resize(size_t(rows), int64_t(pad_block) * block_size);
  p.seq_lens = in.seq_lens;
  p.seq_lens.resize(size_t(rows), 1);
  p.max_blocks_per_seq = width;
  p.block_tables.assign(size_t(rows) * size_t(width), pad_block);
  for (size_t s = 0; s < n; ++s) {
    const int blocks = (in.seq_lens[s] + block_size - 1) / block_size;
    SIEVE_CHECK(blocks <= width && blocks <= in.max_blocks_per_seq, "pad_decode_step: table too narrow");
    std::copy_n(in.block_tables.begin() + long(s * size_t(in.max_blocks_per_seq)), blocks,
                p.block_tables.begin() + long(s * size_t(width)));
  }
  for (int i = 0; i <= rows; ++i) p.query_start_loc.push_back(i);
  for (int i = 0; i < rows; ++i) p.logits_indices.push_back(i);
  return p;
}

void warm_up(Model& m, DType kv_dtype, DType index_dtype, int64_t tokens) {
  const int64_t n = std::max<int64_t>(1, tokens);
  const int bs = m.block_size();
  const int64_t blocks = (n + bs - 1) / bs;
  CacheOptions co;
  co.kv_dtype = kv_dtype;
  co.index_dtype = index_dtype;
  co.num_blocks = blocks;
  m.allocate_caches(co);
  StepInputs in;
  const int64_t V = m.vocab_size();
  for (int64_t i = 0; i < n; ++i) {
    in.token_ids.push_back(int32_t((i * 7919) % V));
    in.positions.push_back(int32_t(i));
    in.slot_mapping.push_back(i);  // block b at physical block b
  }
  for (int64_t b = 0; b < blocks; ++b) in.block_tables.push_back(int32_t(b));
  in.query_start_loc = {0, int32_t(n)};
  in.seq_lens = {int32_t(n)};
  in.max_blocks_per_seq = int(blocks);
  in.logits_indices = {int32_t(n - 1)};
  std::vector<float> logits;
  m.forward(in, logits);
  m.release_caches();
}

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
