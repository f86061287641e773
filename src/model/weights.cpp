#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/splitmix.h"
#include "model/weight_formats.h"

namespace sieve::model {

using detail::Fp8Source;
using detail::HostWeight;
using detail::Slice;

// Whether ops::moe_experts takes FP8 expert weights with block scales (it does; false would
// dequantize FP8 experts at load, exactly, to F32, and leave them BF16 under --quantization fp8).
constexpr bool kMoeTakesFp8 = true;

ops::WeightView Weight::view() const {
  SIEVE_CHECK(!scale_tiled, "a WeightView of an expert whose scales are tiled (only the MoE op reads them)");
  ops::WeightView v;
  v.data = data.data();
  v.dtype = dtype;
  v.rows = rows;
  v.cols = cols;
  if (dtype == DType::FP8_E4M3) {
    v.scale = scale.as<float>();
    v.scale_block_rows = block_rows;
    v.scale_block_cols = block_cols;
    if (scale_lt.bytes()) v.scale_lt = scale_lt.as<float>();
  }
  return v;
}

namespace {

// Device memory for the weights: the smaller ones packed into shared allocations. A CUDA
// allocation takes whole 2 MiB pages, so one per tensor wasted ~24 GiB on one TP8 rank of
// MiniMax-M3 (~29,000 expert tensors of 0.07-4.7 MB).
class Arena {
 public:
  Arena(const Device& dev, std::vector<Buffer>& chunks) : dev_(dev), chunks_(chunks) {}
  Buffer take(size_t bytes) {
    if (!dev_.is_cuda() || bytes >= kOwn) return Buffer(dev_, bytes);
    const size_t padded = (bytes + 255) / 256 * 256;  // every weight 256-byte aligned
    if (chunks_.empty() || used_ + padded > chunks_.back().bytes()) {
      chunks_.emplace_back(dev_, kChunk);
      used_ = 0;
    }
    Buffer v = Buffer::view_of(chunks_.back(), used_, bytes);
    used_ += padded;
    return v;
  }

 private:
  static constexpr size_t kOwn = size_t(32) << 20, kChunk = size_t(256) << 20;
  Device dev_;
  std::vector<Buffer>& chunks_;
  size_t used_ = 0;
};

// Weight::scale_lt of a projection on a GPU, from the host copy of its scales.
void upload_lt_scales(Weight& w, const float* host_scale, Arena& arena) {
  if (w.dtype != DType::FP8_E4M3 || !w.data.device().is_cuda()) return;
  const std::vector<float> lt = ops::lt_weight_scales(w.view(), host_scale);
  if (lt.empty()) return;
  w.scale_lt = arena.take(lt.size() * 4);
  copy_to_device(w.data.device(), w.scale_lt.data(), lt.data(), lt.size() * 4);
}

}  // namespace

bool experts_take_fp8() { return kMoeTakesFp8; }

std::string effective_quantization(const ModelConfig& cfg, const std::string& q) {
  if (q.empty() || q == "none" || q == cfg.quant_method) return cfg.quant_method;
  if (q != "fp8")
    throw Error("--quantization " + q + " is not supported (expected fp8: BF16 weights quantized per 128x128 block at load)");
  if (!cfg.quant_method.empty())
    throw Error("--quantization fp8: the checkpoint is already quantized (" + cfg.quant_method +
                "); leave --quantization out to use its weights as stored");
  return "fp8";
}

namespace {

// One weight of the model: the checkpoint tensors (or parts of them) whose rows it stacks.
struct Part {
  std::string name;  // after the prefix: "layers.3.self_attn.q_proj.weight"; "lm_head.weight" is special
  Slice slice;
};
struct Spec {
  Weight* out = nullptr;
  std::vector<Part> parts;
  bool linear = false;  // a projection: FP8 formats apply
  bool f32 = false;     // norms, router, bias
  bool expert = false;  // a routed expert's (the MoE op's formats)
  bool gate_up = false;  // a routed expert's [gate | up] (its scales' tiled layout differs from down's)
  // FP8 scales per row whatever the blocks: an expert's two matrices share one block shape in
  // the MoE op, so down follows gate_up when gate_up's stacked halves are not whole blocks.
  bool per_row = false;
};

bool fp8_ok(const Spec& s) { return s.linear && (!s.expert || kMoeTakesFp8); }

Slice rows_of(int64_t rows, int64_t cols, int64_t row0, int64_t nrows) {
  return Slice{rows, cols, row0, nrows, 0, std::max<int64_t>(cols, 1)};
}
Slice whole(int64_t rows, int64_t cols) { return rows_of(rows, cols, 0, rows); }
Slice cols_of(int64_t rows, int64_t cols, int64_t col0, int64_t ncols) { return Slice{rows, cols, 0, rows, col0, ncols}; }

// Every weight of the model, with the rank's slices (rank_layout.h). Sizes mw.layers.
std::vector<Spec> plan(const ModelConfig& c, const RankLayout& l, ModelWeights& mw) {
  const int64_t H = c.hidden_size, hd = c.head_dim, idim = c.sparse_index_dim;
  std::vector<Spec> specs;
  auto add = [&](Weight& w, std::vector<Part> parts, bool linear, bool f32) {
    specs.push_back(Spec{&w, std::move(parts), linear, f32});
  };
  add(mw.embed, {{"embed_tokens.weight", rows_of(c.vocab_size, H, l.vocab0, l.vocab)}}, false, false);
  add(mw.norm, {{"norm.weight", whole(H, 0)}}, false, true);
  add(mw.lm_head, {{"lm_head.weight", rows_of(c.vocab_size, H, l.vocab0, l.vocab)}}, false, false);
  mw.layers.resize(size_t(c.num_hidden_layers));
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, nidx = c.sparse_num_index_heads;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = mw.layers[size_t(i)];
    L.sparse = c.is_sparse_layer(i);
    L.moe = c.is_moe_layer(i);
    const std::string p = "layers." + std::to_string(i) + ".";
    add(L.input_norm, {{p + "input_layernorm.weight", whole(H, 0)}}, false, true);
    add(L.post_norm, {{p + "post_attention_layernorm.weight", whole(H, 0)}}, false, true);
    std::vector<Part> qkv = {
        {p + "self_attn.q_proj.weight", rows_of(nq * hd, H, l.q_head0 * hd, l.q_heads * hd)},
        {p + "self_attn.k_proj.weight", rows_of(nkv * hd, H, l.kv_head0 * hd, l.kv_heads * hd)},
        {p + "self_attn.v_proj.weight", rows_of(nkv * hd, H, l.kv_head0 * hd, l.kv_heads * hd)}};
    if (L.sparse) {
      qkv.push_back({p + "self_attn.index_q_proj.weight", rows_of(nidx * idim, H, l.index_head0 * idim, l.index_heads * idim)});
      qkv.push_back({p + "self_attn.index_k_proj.weight", whole(idim, H)});
    }
    add(L.qkv, qkv, true, false);
    add(L.o_proj, {{p + "self_attn.o_proj.weight", cols_of(H, nq * hd, l.q_head0 * hd, l.q_heads * hd)}}, true, false);
    add(L.q_norm, {{p + "self_attn.q_norm.weight", whole(hd, 0)}}, false, true);
    add(L.k_norm, {{p + "self_attn.k_norm.weight", whole(hd, 0)}}, false, true);
    if (L.sparse) {
      add(L.index_q_norm, {{p + "self_attn.index_q_norm.weight", whole(idim, 0)}}, false, true);
      add(L.index_k_norm, {{p + "self_attn.index_k_norm.weight", whole(idim, 0)}}, false, true);
    }
    // [gate | up] of the rank's intermediate columns, and the matching columns of down.
    auto mlp = [&](Weight& gu, Weight& down, const std::string& gate, const std::string& up, const std::string& dn,
                   int64_t inter, int64_t i0, int64_t n, bool expert) {
      for (int part = 0; part < 2; ++part) {
        if (part == 0)
          add(gu, {{gate, rows_of(inter, H, i0, n)}, {up, rows_of(inter, H, i0, n)}}, true, false);
        else
          add(down, {{dn, cols_of(H, inter, i0, n)}}, true, false);
        specs.back().expert = expert;
        specs.back().gate_up = part == 0;
        specs.back().per_row = expert && n % 128 != 0;
      }
    };
    if (L.moe) {
      const int E = c.num_local_experts;
      const std::string b = p + "block_sparse_moe.";
      add(L.router, {{b + "gate.weight", whole(E, H)}}, false, true);
      if (c.use_routing_bias) add(L.router_bias, {{b + "e_score_correction_bias", whole(E, 0)}}, false, true);
      // The rank's experts (all of them unless expert-parallel), each its intermediate slice.
      L.expert_gate_up.resize(size_t(l.experts));
      L.expert_down.resize(size_t(l.experts));
      for (int e = 0; e < l.experts; ++e) {
        const std::string x = b + "experts." + std::to_string(l.expert0 + e) + ".";
        mlp(L.expert_gate_up[size_t(e)], L.expert_down[size_t(e)], x + "w1.weight", x + "w3.weight", x + "w2.weight",
            c.intermediate_size, l.expert_inter0, l.expert_inter, true);
      }
      if (c.n_shared_experts > 0 && c.shared_intermediate_size > 0) {
        const std::string s = b + "shared_experts.";
        mlp(L.shared_gate_up, L.shared_down, s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight",
            c.shared_intermediate_size, l.shared_inter0, l.shared_inter, false);
      }
    } else {
      mlp(L.mlp_gate_up, L.mlp_down, p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight",
          c.dense_intermediate_size, l.dense_inter0, l.dense_inter, false);
    }
  }
  return specs;
}

// What a stored tensor becomes on the device (its dtype and scale blocks) and how many bytes
// that takes; `src` is the stored dtype (F8_E4M3 for an FP8 projection).
struct Target {
  DType dtype = DType::BF16;
  int block_rows = 0, block_cols = 0;
  bool regrouped = false;  // blocks of our own (from the part's first row), not the checkpoint's
};

Target target_of(const Spec& s, DType src, const std::string& quant, const WeightOptions& o) {
  if (s.f32) return {DType::F32};
  if (fp8_ok(s) && src == DType::FP8_E4M3 && quant == "mxfp8")
    return o.scale_blocks128 ? Target{DType::FP8_E4M3, 128, 128, true}
                             : Target{DType::FP8_E4M3, 1, o.device.is_cuda() ? 128 : 32};
  if (fp8_ok(s) && (src == DType::FP8_E4M3 || (quant == "fp8" && src == DType::BF16))) return {DType::FP8_E4M3, 128, 128};
  return {src == DType::BF16 ? DType::BF16 : DType::F32};
}

// The spec's weight on the device, parts stacked as detail::stack does (FP8 block rows stay when
// every part starts and, but for the last, ends on one; else the scales go per row).
struct Shape {
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
  int block_rows = 0, block_cols = 0;
  int64_t scales = 0;
  size_t bytes() const { return size_t(rows * cols) * dtype_size(dtype) + size_t(scales) * 4; }
};

Shape shape_of(const Spec& s, const Target& t) {
  Shape sh;
  sh.dtype = t.dtype;
  sh.cols = s.parts[0].slice.ncols;
  bool aligned = !s.per_row;
  for (size_t i = 0; i < s.parts.size(); ++i) {
    const Slice& sl = s.parts[i].slice;
    sh.rows += sl.nrows;
    if (t.block_rows > 1 && ((i + 1 < s.parts.size() && sl.nrows % t.block_rows != 0) ||
                             (!t.regrouped && sl.row0 % t.block_rows != 0)))
      aligned = false;
  }
  if (t.dtype != DType::FP8_E4M3) return sh;
  sh.block_rows = aligned ? t.block_rows : 1;
  sh.block_cols = t.block_cols;
  int64_t scale_rows = 0;
  for (const Part& p : s.parts) scale_rows += (p.slice.nrows + sh.block_rows - 1) / sh.block_rows;
  sh.scales = scale_rows * ((sh.cols + t.block_cols - 1) / t.block_cols);
  return sh;
}

// Checkpoint tensor names: one prefix for all, and the lm_head's own.
class Names {
 public:
  explicit Names(const Checkpoint& ck, const ModelConfig& c) : ck_(ck), tied_(c.tie_word_embeddings) {
    for (const char* p : {"language_model.model.", "model.language_model.", "model.", ""})
      if (ck.has(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        return;
      }
    throw Error("checkpoint " + ck.dir() +
                ": tensor language_model.model.embed_tokens.weight not found (also tried the "
                "prefixes model.language_model., model. and none)");
  }
  std::string full(const std::string& name) const {
    if (name != "lm_head.weight") return prefix_ + name;
    if (tied_) return prefix_ + "embed_tokens.weight";
    for (const std::string n : {"language_model.lm_head.weight", "lm_head.weight", "model.lm_head.weight"})
      if (ck_.has(n)) return n;
    throw Error("checkpoint " + ck_.dir() + ": tensor language_model.lm_head.weight not found (tie_word_embeddings is false)");
  }

 private:
  const Checkpoint& ck_;
  bool tied_;
  std::string prefix_;
};

std::string scale_name(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size()) + ".weight_scale_inv";
}

const TensorInfo& checked_tensor(const Checkpoint& ck, const std::string& name, const Slice& s) {
  const TensorInfo& t = ck.get(name);
  const std::vector<int64_t> want = s.cols ? std::vector<int64_t>{s.rows, s.cols} : std::vector<int64_t>{s.rows};
  if (t.shape != want)
    throw Error("checkpoint " + ck.dir() + ": tensor " + name + " has shape " + shape_str(t.shape) + ", expected " +
                shape_str(want));
  if (t.dtype != DType::BF16 && t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::FP8_E4M3)
    throw Error("checkpoint " + ck.dir() + ": tensor " + name + " has dtype " + std::string(dtype_name(t.dtype)) +
                ", expected BF16, F16, F32 or F8_E4M3");
  return t;
}

// Whether an expert's scales go to the device tiled (CUDA, FP8 with (1, 128) blocks).
bool tiled_scales(const Device& dev, bool expert, DType dtype, int block_rows, int block_cols) {
  return expert && dev.is_cuda() && dtype == DType::FP8_E4M3 && block_rows == 1 && block_cols == ops::kFp8Group;
}

// A weight's scales (host copy `host`, WeightView layout, n floats) to the device. CUDA, FP8 experts
// with (1, 128) blocks: tiled (Weight::scale_tiled, ops::fp8_scales_moe_tiled; gate_up: which of
// the expert's matrices), so that the MoE kernels read a stage's scales as one run.
void upload_scales(Weight& w, const float* host, size_t n, const Device& dev, bool expert, bool gate_up,
                   Arena& arena) {
  std::vector<float> tiled;
  if (tiled_scales(dev, expert, w.dtype, w.block_rows, w.block_cols)) {
    SIEVE_CHECK(n == size_t(w.rows * ops::fp8_groups(w.cols)), "expert scales: unexpected (1, 128) scale count");
    tiled = ops::fp8_scales_moe_tiled(host, w.rows, w.cols, gate_up);
    host = tiled.data();
    n = tiled.size();
    w.scale_tiled = true;
  }
  w.scale = arena.take(n * 4);  // 256-byte aligned: the kernels' bulk copies need 16
  copy_to_device(dev, w.scale.data(), host, n * 4);
  if (!expert) upload_lt_scales(w, host, arena);
}

// Moves a host weight to the device.
void upload(HostWeight&& h, Weight& w, const Device& dev, bool projection, bool gate_up, Arena& arena) {
  w.dtype = h.dtype;
  w.rows = h.rows;
  w.cols = h.cols;
  w.block_rows = h.block_rows;
  w.block_cols = h.block_cols;
  w.data = arena.take(h.data.size());
  copy_to_device(dev, w.data.data(), h.data.data(), h.data.size());
  if (!h.scale.empty()) upload_scales(w, h.scale.data(), h.scale.size(), dev, !projection, gate_up, arena);
}

// The MoE op's device arrays of expert pointers; one dtype and block shape for all experts.
void expert_arrays(LayerWeights& L, const Device& dev, int layer) {
  if (L.expert_gate_up.empty()) return;
  std::vector<const void*> gu, dn, gus, dns;
  const Weight& first = L.expert_gate_up[0];
  for (size_t e = 0; e < L.expert_gate_up.size(); ++e) {
    for (const Weight* w : {&L.expert_gate_up[e], &L.expert_down[e]})
      if (w->dtype != first.dtype || w->block_rows != first.block_rows || w->block_cols != first.block_cols ||
          w->scale_tiled != first.scale_tiled)
        throw Error("layer " + std::to_string(layer) + ": the experts' weights differ in format (" +
                    std::string(dtype_name(w->dtype)) + " " + std::to_string(w->block_rows) + "x" +
                    std::to_string(w->block_cols) + " vs " + std::string(dtype_name(first.dtype)) + " " +
                    std::to_string(first.block_rows) + "x" + std::to_string(first.block_cols) +
                    (w->scale_tiled != first.scale_tiled ? ", scale layouts" : "") +
                    "); the MoE op takes one format for all experts");
    gu.push_back(L.expert_gate_up[e].data.data());
    dn.push_back(L.expert_down[e].data.data());
    gus.push_back(L.expert_gate_up[e].scale.data());
    dns.push_back(L.expert_down[e].scale.data());
  }
  auto put = [&](Buffer& b, const std::vector<const void*>& v) {
    b = Buffer(dev, v.size() * sizeof(void*));
    copy_to_device(dev, b.data(), v.data(), v.size() * sizeof(void*));
  };
  put(L.expert_gate_up_ptrs, gu);
  put(L.expert_down_ptrs, dn);
  L.expert_scale_tiled = first.scale_tiled;
  if (first.dtype == DType::FP8_E4M3) {
    put(L.expert_gate_up_scale_ptrs, gus);
    put(L.expert_down_scale_ptrs, dns);
  }
}

void finish(ModelWeights& mw, const Device& dev) {
  for (size_t i = 0; i < mw.layers.size(); ++i) expert_arrays(mw.layers[i], dev, int(i));
}

Fp8Source fp8_source(const std::string& quant) {
  return quant == "mxfp8" ? Fp8Source::Mx : quant == "fp8" ? Fp8Source::Block128 : Fp8Source::None;
}

}  // namespace

size_t estimate_weight_bytes(const ModelConfig& cfg, const WeightOptions& o, const Checkpoint* ck) {
  const std::string quant = effective_quantization(cfg, o.quantization);
  ModelWeights shapes;
  const std::vector<Spec> specs = plan(cfg, o.layout, shapes);
  std::unique_ptr<Names> names;
  if (ck) names = std::make_unique<Names>(*ck, cfg);
  size_t total = 0;
  for (const Spec& s : specs) {
    DType src = quant.empty() || !fp8_ok(s) || o.quantization == "fp8" ? DType::BF16 : DType::FP8_E4M3;
    if (ck) src = ck->get(names->full(s.parts[0].name)).dtype;
    const Shape sh = shape_of(s, target_of(s, src, quant, o));
    total += sh.bytes();
    if (sh.dtype == DType::FP8_E4M3 && tiled_scales(o.device, s.expert, sh.dtype, sh.block_rows, sh.block_cols))
      total += size_t(ops::fp8_moe_tiled_size(sh.rows, sh.cols, s.gate_up) - sh.scales) * 4;  // the tiles' padding
    if (o.device.is_cuda() && !s.expert && sh.dtype == DType::FP8_E4M3 && sh.block_cols == 128 && sh.scales > 0) {
      // Weight::scale_lt (ops::lt_weight_scales' sizes).
      const int64_t kb = (sh.cols + sh.block_cols - 1) / sh.block_cols;
      if (sh.block_rows == 1)
        total += size_t(sh.scales) * 4;
      else if (kb % 4 != 0)
        total += size_t((sh.rows + sh.block_rows - 1) / sh.block_rows * ((kb + 3) / 4 * 4)) * 4;
    }
  }
  return total;
}

ModelWeights load_weights(const Checkpoint& ck, const ModelConfig& cfg, const WeightOptions& o) {
  const std::string quant = effective_quantization(cfg, o.quantization);
  const bool online = o.quantization == "fp8" && cfg.quant_method.empty();
  const Fp8Source src = fp8_source(cfg.quant_method);
  const Names names(ck, cfg);
  ModelWeights mw;
  const std::vector<Spec> specs = plan(cfg, o.layout, mw);
  const uint64_t total = estimate_weight_bytes(cfg, o, &ck);
  Arena arena(o.device, mw.arena);
  for (const Spec& s : specs) {
    std::vector<HostWeight> parts;
    for (const Part& p : s.parts) {
      const std::string name = names.full(p.name);
      const TensorInfo& t = checked_tensor(ck, name, p.slice);
      const double fraction = double(p.slice.nrows * p.slice.ncols) / double(std::max<int64_t>(t.numel(), 1));
      if (t.dtype == DType::FP8_E4M3) {
        if (src == Fp8Source::None)
          throw Error("checkpoint " + ck.dir() + ": tensor " + name +
                      " is F8_E4M3 but config.json has no quantization_config (expected quant_method mxfp8 or fp8)");
        if (!s.linear)
          throw Error("checkpoint " + ck.dir() + ": tensor " + name + " is F8_E4M3; only projections may be fp8");
        const std::string sn = scale_name(name);
        if (!ck.has(sn)) throw Error("checkpoint " + ck.dir() + ": FP8 tensor " + name + " has no " + sn);
        const TensorInfo& sc = ck.get(sn);
        parts.push_back(detail::read_fp8(t, sc, p.slice, src, ck.dir()));
        mw.file_bytes += size_t(double(t.nbytes + sc.nbytes) * fraction);
        if (!fp8_ok(s))
          parts.back() = detail::dequantize(parts.back());
        else if (src == Fp8Source::Mx && o.scale_blocks128)
          parts.back() = detail::regroup_block128(parts.back(), &mw.regroup_inexact);
        else if (o.device.is_cuda() && src == Fp8Source::Mx)
          parts.back() = detail::regroup_1x128(parts.back(), &mw.regroup_inexact);
      } else {
        parts.push_back(detail::read_plain(t, p.slice, s.f32));
        mw.file_bytes += size_t(double(t.nbytes) * fraction);
        if (fp8_ok(s) && online && parts.back().dtype == DType::BF16) parts.back() = detail::quantize_block128(parts.back());
      }
    }
    HostWeight h = detail::stack(std::move(parts));
    if (s.per_row) h = detail::expand_rows(h);
    upload(std::move(h), *s.out, o.device, !s.expert, s.gate_up, arena);
    mw.bytes += s.out->bytes();
    if (o.progress) o.progress(mw.bytes, total);
  }
  finish(mw, o.device);
  return mw;
}

ModelWeights dummy_weights(const ModelConfig& cfg, const WeightOptions& o) {
  const std::string quant = effective_quantization(cfg, o.quantization);
  ModelWeights mw;
  const std::vector<Spec> specs = plan(cfg, o.layout, mw);
  const uint64_t total = estimate_weight_bytes(cfg, o, nullptr);
  Arena arena(o.device, mw.arena);
  // A pool of pseudo-random values copied to the device at a different offset for every weight
  // (generating each weight's own values would take minutes at the real size). Projections and
  // tables ~ U(-0.02, 0.02); FP8 codes are random (NaN codes skipped) with scales 2^-14, so an
  // FP8 weight is at most 448 * 2^-14 = 0.027; norm weights and biases are small.
  constexpr size_t kPool = size_t(16) << 20;
  std::vector<uint8_t> fp8_pool(kPool), bf16_pool(kPool * 2), f32_pool(kPool * 4);
  SplitMix64 rng{0x5eed};
  for (size_t i = 0; i < kPool; ++i) {
    const uint64_t r = rng.next();
    uint8_t q = uint8_t(r);
    if ((q & 0x7f) == 0x7f) q ^= 0x01;  // 0x7f / 0xff are NaN in e4m3fn
    fp8_pool[i] = q;
    const float v = float((double(r >> 11) / double(1ull << 53) * 2.0 - 1.0) * 0.02);
    store_from_f32(bf16_pool.data(), DType::BF16, i, v);
    store_from_f32(f32_pool.data(), DType::F32, i, v);
  }
  size_t offset = 0;
  auto fill = [&](Buffer& b, const std::vector<uint8_t>& pool) {
    // Copies the pool over the buffer from a moving start (pool sizes are multiples of 16).
    size_t at = 0;
    offset = (offset + 4099 * 16) % pool.size();
    while (at < b.bytes()) {
      const size_t start = at == 0 ? offset : 0;
      const size_t n = std::min(b.bytes() - at, pool.size() - start);
      copy_to_device(o.device, static_cast<uint8_t*>(b.data()) + at, pool.data() + start, n);
      at += n;
    }
  };
  for (const Spec& s : specs) {
    // (Dummy FP8 experts the MoE op cannot take are made BF16.)
    const DType src = fp8_ok(s) && !quant.empty() ? DType::FP8_E4M3 : DType::BF16;
    const Shape sh = shape_of(s, target_of(s, src, quant, o));
    Weight& w = *s.out;
    w.dtype = sh.dtype;
    w.rows = sh.rows;
    w.cols = sh.cols;
    w.block_rows = sh.block_rows;
    w.block_cols = sh.block_cols;
    w.data = arena.take(size_t(sh.rows * sh.cols) * dtype_size(sh.dtype));
    fill(w.data, sh.dtype == DType::FP8_E4M3 ? fp8_pool : sh.dtype == DType::BF16 ? bf16_pool : f32_pool);
    if (sh.scales > 0) {
      const std::vector<float> sc(size_t(sh.scales), std::ldexp(1.0f, -14));
      upload_scales(w, sc.data(), sc.size(), o.device, s.expert, s.gate_up, arena);
    }
    mw.bytes += w.bytes();
    if (o.progress) o.progress(mw.bytes, total);
  }
  finish(mw, o.device);
  return mw;
}

}  // namespace sieve::model
