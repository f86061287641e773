// MiniMax-M3 text forward over paged caches, through kernels/ops.h only, for one tensor-parallel
// rank's shard (rank_layout.h; the whole model with one rank).
//
// Per layer: h += o_proj(Attn(norm_in(h))); h += FFN(norm_post(h)). Attention: one GEMM gives
// [q | k | v | index_q | index_k]; qkv_norm_rope_cache norms and ropes q, k (and the index
// branch), writes k, v (and the index key) into the paged caches; sparse layers then select
// blocks with the indexer (or reuse the top-k of the last full layer, spec §3.4) and attend
// over the selection; dense layers attend over everything.
//
// Activations: the residual stream h is fp32. Each sublayer writes its output to `part` (with
// several ranks each rank's partial sum, which an all_reduce adds up at once), and the next
// RMSNorm adds it to h in fp32 and normalises the sum in one op. `part` is fp32 on the CPU and
// bf16 on CUDA (as vLLM and SGLang keep it: half the bytes written, read and all-reduced): the
// GEMM or the MoE combine rounds each sublayer's output to bf16 once, the ranks' bf16 partials
// are summed by the all-reduce (NCCL's bf16 sum), and only then is it added to the fp32 h.
// LoadOptions::f32_partials keeps it fp32 on CUDA too (comparisons). Tensor parallelism (rank_layout.h): every
// rank holds the whole residual stream; attention runs on the rank's heads, the MLP on its
// intermediate columns, the MoE on its slices of every expert (or, expert-parallel, on its whole
// experts); the embedding and lm_head on its vocabulary rows, the logits gathered. On the CPU every activation is fp32 (the oracle); on
// CUDA the projections' outputs and the attention's are bf16, and a norm or activation that
// feeds an FP8 GEMM writes FP8 with its 1 x 128 scales. The MoE input stays fp32: the router
// takes it as it is (routing must not see the experts' quantization), and the expert kernels
// quantize it themselves.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/weights.h"

namespace sieve::model {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct LayerCache {
  Buffer k, v, k_scale, v_scale, index_k;
  ops::KvCacheView kv;
  ops::IndexCacheView index;
};

// A GEMM input: rows of `dtype` at `data` (row stride ld), with 1 x 128 scales when FP8.
struct Act {
  void* data = nullptr;
  DType dtype = DType::F32;
  float* scale = nullptr;
  int64_t ld = 0;
};

class MiniMaxM3 final : public Model {
 public:
  MiniMaxM3(ModelConfig cfg, RankLayout layout, ModelWeights w, const Device& dev, ops::Collective* group,
            bool side_stream, bool f32_partials)
      : cfg_(std::move(cfg)), layout_(layout), w_(std::move(w)), dev_(dev),
        act_(dev.is_cuda() ? DType::BF16 : DType::F32),
        part_(dev.is_cuda() && !f32_partials ? DType::BF16 : DType::F32), group_(group) {
    const bool shared = std::any_of(w_.layers.begin(), w_.layers.end(),
                                    [](const LayerWeights& L) { return L.moe && L.shared_gate_up.rows > 0; });
    if (side_stream && shared && dev.is_cuda()) side_ = SideStream(dev);
    if (side_stream && dev.is_cuda()) prefetch_ = SideStream(dev);
  }

  const ModelConfig& config() const override { return cfg_; }
  const Device& device() const override { return dev_; }
  const CacheOptions& cache_options() const override { return cache_opts_; }
  SelectionStats selection_stats() const override { return stats_; }
  uint64_t buffers_epoch() const override { return epoch_; }
  int logits_shards() const override { return group_ ? layout_.tp_size : 1; }
  DType partials_dtype() const override { return part_; }
  size_t weight_bytes() const override { return w_.bytes; }
  ops::WeightView input_embedding() const override {
    ops::WeightView v;
    v.data = w_.embed.data.data();
    v.dtype = w_.embed.dtype;
    v.rows = w_.embed.rows;  // this rank's rows
    v.cols = cfg_.hidden_size;
    return v;
  }

  // Index keys are cached only by sparse layers that compute their own top-k.
  bool has_index_cache(int layer) const {
    return cfg_.is_sparse_layer(layer) && !cfg_.shares_index_topk(layer);
  }

  size_t cache_bytes_per_block(DType kv_dtype, DType index_dtype) const override {
    const size_t bs = size_t(cfg_.sparse_block_size), nkv = size_t(layout_.kv_heads);
    size_t total = 0;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      total += 2 * nkv * bs * size_t(cfg_.head_dim) * dtype_size(kv_dtype);
      if (kv_dtype == DType::FP8_E4M3) total += 2 * nkv * bs * sizeof(float);
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
    const int64_t nkv = layout_.kv_heads;
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
    const int nq = layout_.q_heads, nkv = layout_.kv_heads, hd = cfg_.head_dim;
    const int nidx = layout_.index_heads, idim = cfg_.sparse_index_dim;
    const int K = cfg_.sparse_topk_blocks;
    const size_t esz = dtype_size(act_);
    const std::span<const int32_t> logits_rows = step.logits_rows;
    const int64_t nl = int64_t(logits_rows.size());
    size_activations(n, nl);
    StepBuffers& sb = step_;
    const int64_t q_cols = int64_t(nq) * hd, kv_cols = int64_t(nkv) * hd;

    ops::EmbeddingParams ep;
    ep.ids = step.token_ids;
    ep.num_tokens = n;
    ep.table = w_.embed.data.data();
    ep.table_dtype = w_.embed.dtype;
    // With the vocabulary split over ranks, each rank looks up the ids in its rows (zeros for
    // the others') and the all_reduce completes every row.
    ep.vocab = w_.embed.rows;
    ep.shard = layout_.tp_size > 1;
    ep.vocab0 = layout_.vocab0;
    ep.hidden = H;
    ep.out = sb.h.data();
    ep.out_dtype = DType::F32;
    ops::embedding(ep, stream_);
    reduce_ranks(sb.h.data(), DType::F32, n * H);
    bool have_part = false;  // sb.part holds the last sublayer's output, not yet added to h

    bool have_topk = false;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      const LayerWeights& L = w_.layers[size_t(l)];
      LayerCache& C = caches_[size_t(l)];

      // Attention: xn = norm(h += part); qkv = xn . W_qkv^T
      const Act xa = gemm_input(L.qkv, sb.xn, sb.xn_scale, H);
      add_norm(L.input_norm, n, 0, have_part, xa);
      // EAGLE3: the residual stream entering the layer (h now has the last sublayer's part).
      for (size_t i = 0; i < step.aux_layers.size(); ++i)
        if (step.aux_layers[i] == l) {
          ops::AddParams cp;
          cp.y = step.aux_hidden + int64_t(i) * n * H;
          cp.x = sb.h.data();
          cp.n = n * H;
          cp.assign = true;
          ops::add(cp, stream_);
        }
      const int64_t W = L.qkv.rows;
      linear(xa, L.qkv, sb.qkv.data(), act_, W, n, false);
      ops::QkvNormRopeCacheParams rp;
      rp.qkv = sb.qkv.data();
      rp.act_dtype = act_;
      rp.num_tokens = n;
      rp.row_stride = W;
      rp.num_q_heads = nq;
      rp.num_kv_heads = nkv;
      rp.head_dim = hd;
      rp.q_offset = 0;
      rp.k_offset = q_cols;
      rp.v_offset = q_cols + kv_cols;
      rp.q_norm = L.q_norm.data.data();
      rp.k_norm = L.k_norm.data.data();
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
        rp.index_q_norm = L.index_q_norm.data.data();
        rp.index_k_norm = L.index_k_norm.data.data();
        rp.norm_rope_index = full_index;
        if (full_index) rp.index_cache = C.index;
      }
      ops::qkv_norm_rope_cache(rp, stream_);

      if (full_index) {
        ops::IndexerParams ip;
        ip.index_q = sb.qkv.as<uint8_t>() + size_t(rp.index_q_offset) * esz;
        ip.q_dtype = act_;
        ip.q_stride = W;
        ip.num_index_heads = nidx;
        ip.index_dim = idim;
        ip.score_scale = float(1.0 / std::sqrt(double(hd))) * kLog2e;
        ip.cache = C.index;
        ip.batch = batch;
        ip.topk = K;
        ip.init_blocks = cfg_.sparse_init_block;
        ip.local_blocks = cfg_.sparse_local_block;
        ip.topk_idx = sb.topk.as<int32_t>();
        ops::indexer(ip, stream_);
        have_topk = true;
        if (cache_opts_.compare_index) compare_selection(ip, step.positions);
      }

      ops::AttentionParams ap;
      ap.q = sb.qkv.data();
      ap.q_dtype = act_;
      ap.q_stride = W;
      ap.out = sb.attn.data();
      ap.out_dtype = act_;
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
        ap.topk_idx = sb.topk.as<int32_t>();
        ap.topk = K;
      }
      ops::attention(ap, stream_);
      linear(Act{sb.attn.data(), act_, nullptr, q_cols}, L.o_proj, sb.part.data(), part_, H, n, false);
      reduce_ranks(sb.part.data(), part_, n * H);  // each rank's heads' share of o_proj
      have_part = true;

      // FFN
      if (L.moe) {
        // The router reads the normed rows in fp32; FP8 experts read them quantized, which the
        // norm writes too (one kernel instead of a quantizer for each reader).
        const Act xf{sb.xn.data(), DType::F32, nullptr, H};
        const Act x8 = gemm_input(L.expert_gate_up[0], sb.xn8, sb.xn8_scale, H);
        add_norm(L.post_norm, n, 0, true, xf, x8.scale ? &x8 : nullptr);
        moe(L, l + 1 < int(w_.layers.size()) ? &w_.layers[size_t(l + 1)] : nullptr, xf, x8.scale ? x8 : xf, n);
      } else {
        const Act xf = gemm_input(L.mlp_gate_up, sb.xn, sb.xn_scale, H);
        add_norm(L.post_norm, n, 0, true, xf);
        mlp(xf, L.mlp_gate_up, L.mlp_down, n, false);
      }
      reduce_ranks(sb.part.data(), part_, n * H);  // intermediate columns (or experts) of every rank
    }

    // Final norm (with the last residual add) and lm_head, on the requested rows only; the
    // rank's vocabulary columns of the logits rows.
    if (nl == 0) return;
    for (int64_t i = 0; i < nl;) {
      // One call per run of consecutive rows (a decode batch is one run).
      int64_t j = i + 1;
      while (j < nl && logits_rows[size_t(j)] == logits_rows[size_t(j - 1)] + 1) ++j;
      Act out = gemm_input(w_.lm_head, sb.sel, sb.sel_scale, H);
      out.data = static_cast<uint8_t*>(out.data) + size_t(i * H) * dtype_size(out.dtype);
      if (out.scale) out.scale += i * ops::fp8_groups(H);
      add_norm(w_.norm, j - i, logits_rows[size_t(i)], have_part, out);
      i = j;
    }
    const Act sel = gemm_input(w_.lm_head, sb.sel, sb.sel_scale, H);
    if (!group_) {
      // One rank (or one rank's shard run alone): its vocabulary columns of [nl, vocab].
      linear(sel, w_.lm_head, step.logits + layout_.vocab0, DType::F32, cfg_.vocab_size, nl, false);
      return;
    }
    // Each rank its columns [nl, vocab / tp], gathered as [tp, nl, vocab / tp] (logits_shards).
    const int64_t vs = layout_.vocab;
    linear(sel, w_.lm_head, sb.logits.data(), DType::F32, vs, nl, false);
    ops::AllGatherParams gp;
    gp.in = sb.logits.data();
    gp.out = step.logits;
    gp.dtype = DType::F32;
    gp.count = nl * vs;
    gp.group = group_;
    ops::all_gather(gp, stream_);
  }

  // data[count] (of dtype) = its sum over the ranks; nothing with one rank.
  void reduce_ranks(void* data, DType dtype, int64_t count) {
    if (!group_) return;
    ops::AllReduceParams p;
    p.data = data;
    p.dtype = dtype;
    p.count = count;
    p.group = group_;
    ops::all_reduce(p, stream_);
  }

  // The weights the next layer's first GEMMs read, in the order it reads them, up to `budget`
  // bytes (the last range cut short).
  static ops::PrefetchL2Params next_layer_ranges(const LayerWeights& N, size_t budget) {
    ops::PrefetchL2Params pp;
    const Buffer* parts[] = {&N.qkv.data,           &N.qkv.scale,           &N.o_proj.data,        &N.o_proj.scale,
                             &N.shared_gate_up.data, &N.shared_gate_up.scale, &N.shared_down.data, &N.shared_down.scale};
    static_assert(sizeof(parts) / sizeof(parts[0]) <= ops::PrefetchL2Params::kMaxRanges);
    for (const Buffer* b : parts) {
      if (budget == 0) break;
      if (!b->data() || b->bytes() == 0) continue;
      pp.ptr[pp.count] = b->data();
      pp.bytes[pp.count] = std::min(budget, b->bytes());
      budget -= pp.bytes[pp.count++];
    }
    return pp;
  }

  // The routed experts (and the shared expert) of x into part; x8: the same rows quantized for
  // FP8 weights (or x). next: the next layer's weights (null for the last layer), which a decode
  // step prefetches into L2 beside the routing.
  void moe(const LayerWeights& L, const LayerWeights* next, const Act& x, const Act& x8, int64_t n) {
    StepBuffers& sb = step_;
    const int E = cfg_.num_local_experts, k = cfg_.num_experts_per_tok;
    // The router GEMM (fp32 weights, fp32 sums) runs inside the routing op.
    ops::MoeRouteParams mr;
    mr.x = x.data;
    mr.x_dtype = x.dtype;
    mr.hidden = cfg_.hidden_size;
    mr.ldx = x.ld;
    mr.gate = L.router.data.as<float>();
    mr.bias = L.router_bias.rows ? L.router_bias.data.as<float>() : nullptr;
    mr.num_tokens = n;
    mr.num_experts = E;
    mr.topk = k;
    mr.renormalize = cfg_.norm_topk_prob;
    mr.scaling = cfg_.routed_scaling_factor;
    mr.ids = sb.route_ids.as<int32_t>();
    mr.weights = sb.route_w.as<float>();
    mr.id_offset = layout_.expert0;  // expert parallelism: ids of this rank's experts from 0
    // The experts add into part: the shared expert sets it first (or it starts at zero). It
    // does not depend on the routing, so with a side stream it runs beside it (its kernels, its
    // buffers gate_up and act, and part, which nothing on the main stream touches until the
    // join); the same ops on the same inputs either way.
    const bool beside = L.shared_gate_up.rows && side_ && stream_.cuda_stream && ops::moe_route_splits(mr, stream_);
    if (beside) side_.fork(stream_.cuda_stream);
    // The routing, the shared expert and the sort leave DRAM mostly idle: the next layer's qkv,
    // o_proj and shared expert weights are read into L2 meanwhile, beside them (a branch that
    // writes nothing; joined after the experts), so those GEMMs find them there.
    const size_t budget = next && prefetch_ && stream_.cuda_stream ? ops::l2_prefetch_budget(n, stream_) : 0;
    const ops::PrefetchL2Params pp = budget ? next_layer_ranges(*next, budget) : ops::PrefetchL2Params{};
    if (pp.count) {
      prefetch_.fork(stream_.cuda_stream);
      ops::Stream ps = stream_;
      ps.cuda_stream = prefetch_.stream();
      ops::prefetch_l2(pp, ps);
    }
    ops::moe_route(mr, stream_);
    if (L.shared_gate_up.rows) {
      const Act& xs = x8.scale && L.shared_gate_up.dtype == DType::FP8_E4M3 ? x8 : x;
      if (beside) {
        const ops::Stream main = stream_;
        stream_.cuda_stream = side_.stream();
        mlp(xs, L.shared_gate_up, L.shared_down, n, false);
        stream_ = main;
        side_.join(stream_.cuda_stream);
      } else {
        mlp(xs, L.shared_gate_up, L.shared_down, n, false);
      }
    } else {
      // No fill op on the contract: part - part is exactly 0 for the finite values it holds.
      ops::AddParams zero;
      zero.y = sb.part.data();
      zero.x = sb.part.data();
      zero.dtype = part_;
      zero.n = n * cfg_.hidden_size;
      zero.alpha = -1.0f;
      ops::add(zero, stream_);
    }
    const Weight& gu0 = L.expert_gate_up[0];
    ops::MoeExpertsParams me;
    me.x = x.data;
    me.act_dtype = x.dtype;
    if (x8.scale && gu0.dtype == DType::FP8_E4M3) {
      me.x = x8.data;
      me.x_scale = x8.scale;
    }
    me.num_tokens = n;
    me.hidden = cfg_.hidden_size;
    me.inter = layout_.expert_inter;
    me.num_experts = layout_.experts;
    me.topk = k;
    me.ids = sb.route_ids.as<int32_t>();
    me.weights = sb.route_w.as<float>();
    me.w_gate_up = static_cast<const void* const*>(L.expert_gate_up_ptrs.data());
    me.w_down = static_cast<const void* const*>(L.expert_down_ptrs.data());
    me.w_dtype = gu0.dtype;
    me.w_gate_up_scale = static_cast<const float* const*>(L.expert_gate_up_scale_ptrs.data());
    me.w_down_scale = static_cast<const float* const*>(L.expert_down_scale_ptrs.data());
    me.scale_block_rows = gu0.block_rows;
    me.scale_block_cols = gu0.block_cols;
    me.scale_tiled = L.expert_scale_tiled;
    me.alpha = cfg_.swiglu_alpha;
    me.limit = cfg_.swiglu_limit;
    me.beta = cfg_.swiglu_beta;
    me.out = sb.part.data();
    me.out_bf16 = part_ == DType::BF16;  // x stays fp32 (act_dtype) for the router's sake
    ops::moe_experts(me, stream_);
    if (pp.count) prefetch_.join(stream_.cuda_stream);  // long done: the experts need none of it
  }

  // part (+)= down(swiglu_oai(gate_up(x)))
  void mlp(const Act& x, const Weight& gu, const Weight& down, int64_t n, bool acc) {
    StepBuffers& sb = step_;
    const int64_t I = down.cols;
    linear(x, gu, sb.gate_up.data(), act_, 2 * I, n, false);
    const Act a = gemm_input(down, sb.act, sb.act_scale, I);
    ops::SwigluOaiParams sp;
    sp.gate_up = sb.gate_up.data();
    sp.out = a.data;
    sp.out_scale = a.scale;
    sp.dtype = act_;
    sp.rows = n;
    sp.inter = I;
    sp.ld_in = 2 * I;
    sp.ld_out = I;
    sp.alpha = cfg_.swiglu_alpha;
    sp.limit = cfg_.swiglu_limit;
    sp.beta = cfg_.swiglu_beta;
    ops::swiglu_oai(sp, stream_);
    linear(a, down, sb.part.data(), part_, cfg_.hidden_size, n, acc);
  }

  // Where the input of a GEMM with weight w goes: FP8 with 1 x 128 scales when w is FP8 on CUDA
  // (the norm or activation before it quantizes), the activation dtype otherwise (on the CPU
  // fp32 always: linear dequantizes the weight exactly).
  Act gemm_input(const Weight& w, Buffer& buf, Buffer& scale, int64_t cols) const {
    if (dev_.is_cuda() && w.dtype == DType::FP8_E4M3) return Act{buf.data(), DType::FP8_E4M3, scale.as<float>(), cols};
    return Act{buf.data(), act_, nullptr, cols};
  }

  // out = rms_norm(h + part) of `rows` rows from row0, after h += part in fp32 (when add); else of h.
  // out8: the same rows quantized to FP8 too (out not FP8).
  void add_norm(const Weight& w, int64_t rows, int64_t row0, bool add, const Act& out, const Act* out8 = nullptr) {
    StepBuffers& sb = step_;
    const int64_t H = cfg_.hidden_size;
    ops::RmsNormParams np;
    float* h = sb.h.as<float>() + row0 * H;
    np.x = add ? static_cast<const void*>(sb.part.as<uint8_t>() + size_t(row0 * H) * dtype_size(part_)) : h;
    np.x_dtype = add ? part_ : DType::F32;
    if (add) {
      np.residual = h;
      np.ldr = H;
      np.residual_f32 = true;
    }
    np.y = out.data;
    np.y_dtype = out.dtype;
    np.y_scale = out.scale;
    if (out8) {
      np.y_fp8 = out8->data;
      np.ld_fp8 = out8->ld;
      np.y_fp8_scale = out8->scale;
    }
    np.weight = w.data.data();
    np.weight_dtype = w.dtype;
    np.rows = rows;
    np.dim = H;
    np.ldx = H;
    np.ldy = out.ld;
    np.eps = cfg_.rms_norm_eps;
    np.gemma = cfg_.use_gemma_norm;
    ops::rms_norm(np, stream_);
  }

  // y[m, w.rows] (+)= x[m, w.cols] . w^T
  void linear(const Act& x, const Weight& w, void* y, DType y_dtype, int64_t ldy, int64_t m, bool acc) {
    ops::LinearParams lp;
    lp.x = x.data;
    lp.x_dtype = x.dtype;
    lp.ldx = x.ld;
    lp.x_scale = x.scale;
    lp.w = w.view();
    lp.y = y;
    lp.y_dtype = y_dtype;
    lp.ldy = ldy;
    lp.m = m;
    lp.accumulate = acc;
    ops::linear(lp, stream_);
  }

  // Activations of forward(), kept between steps: a buffer grows when a step needs more than
  // it holds and is otherwise reused, so a decode step allocates nothing.
  struct StepBuffers {
    Buffer h, part;                // [n, hidden]: residual stream (fp32), sublayer output (part_)
    Buffer xn, xn_scale;           // normed rows (fp32, activation dtype or FP8 + scales)
    Buffer xn8, xn8_scale;         // MoE layers: the fp32 normed rows of xn quantized to FP8
    Buffer qkv, attn, gate_up;     // activation dtype
    Buffer act, act_scale;         // SwiGLU output (activation dtype or FP8 + scales)
    Buffer topk, route_ids, route_w;
    Buffer sel, sel_scale;         // normed logits rows
    Buffer logits;                 // fp32 [nl, vocab / tp]: this rank's columns, before the gather
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
    const int64_t hd = cfg_.head_dim, idim = cfg_.sparse_index_dim;
    const int64_t q_cols = int64_t(layout_.q_heads) * hd;
    const int64_t qkv_cols = q_cols + 2 * int64_t(layout_.kv_heads) * hd + (layout_.index_heads + 1) * idim;
    const int64_t ffn = std::max<int64_t>({layout_.dense_inter, layout_.shared_inter, 1});
    const size_t a = dtype_size(act_);
    StepBuffers& sb = step_;
    sized(sb.h, size_t(n * H) * 4);
    sized(sb.part, size_t(n * H) * dtype_size(part_));
    sized(sb.xn, size_t(n * H) * 4);
    sized(sb.xn_scale, size_t(n * ops::fp8_groups(H)) * 4);
    sized(sb.xn8, size_t(n * H));
    sized(sb.xn8_scale, size_t(n * ops::fp8_groups(H)) * 4);
    sized(sb.qkv, size_t(n * qkv_cols) * a);
    sized(sb.attn, size_t(n * q_cols) * a);
    sized(sb.gate_up, size_t(n * 2 * ffn) * a);
    sized(sb.act, size_t(n * ffn) * a);
    sized(sb.act_scale, size_t(n * ops::fp8_groups(ffn)) * 4);
    sized(sb.topk, size_t(n * std::max(layout_.index_heads, 1) * K) * 4);
    sized(sb.route_ids, size_t(n * cfg_.num_experts_per_tok) * 4);
    sized(sb.route_w, size_t(n * cfg_.num_experts_per_tok) * 4);
    sized(sb.sel, size_t(nl * H) * a);
    sized(sb.sel_scale, size_t(nl * ops::fp8_groups(H)) * 4);
    if (group_) sized(sb.logits, size_t(nl * layout_.vocab) * 4);
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
    sized(rope_, table.size() * sizeof(float));
    copy_to_device(dev_, rope_.data(), table.data(), table.size() * sizeof(float));
    rope_positions_ = want;
  }

  ModelConfig cfg_;
  RankLayout layout_;
  ModelWeights w_;
  Device dev_;
  DType act_;           // activations between ops: fp32 on the CPU, bf16 on CUDA
  DType part_;          // sublayer outputs (`part`) and their all-reduce: act_ (fp32 with f32_partials)
  // The rank's communicator; null: no communication (one rank, or a shard run alone). A group of
  // one runs its collectives (the identity), so that a test can compare them with none.
  ops::Collective* group_;
  ops::Stream stream_;      // forward()'s
  SideStream side_;         // the shared experts' (CUDA, unless LoadOptions::side_stream is false)
  SideStream prefetch_;     // the L2 prefetch of the next layer's weights (the same condition)
  CacheOptions cache_opts_;
  std::vector<LayerCache> caches_;
  Buffer rope_;
  int64_t rope_positions_ = 0;
  StepBuffers step_;
  SelectionStats stats_;
  uint64_t epoch_ = 0;  // bumped when a buffer that captured steps point at is replaced
};

}  // namespace

std::unique_ptr<Model> make_minimax_m3(ModelConfig cfg, const RankLayout& layout, ModelWeights w, const Device& dev,
                                       ops::Collective* group, bool side_stream, bool f32_partials) {
  return std::make_unique<MiniMaxM3>(std::move(cfg), layout, std::move(w), dev, group, side_stream, f32_partials);
}

}  // namespace sieve::model
