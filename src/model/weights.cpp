#include "model/weights.h"

#include <cstring>

#include "core/error.h"

namespace sieve::model {

namespace {

// A matrix read from the checkpoint into host memory, in BF16 or F32.
struct HostMat {
  DType dtype = DType::BF16;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
};

std::string shape_of(const TensorInfo& t) { return shape_str(t.shape); }

class Reader {
 public:
  Reader(const Checkpoint& ckpt, const ModelConfig& cfg) : ckpt_(ckpt), cfg_(cfg) {
    for (const char* p : {"language_model.model.", "model.language_model.", "model.", ""}) {
      if (ckpt.has(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        found_ = true;
        break;
      }
    }
    if (!found_)
      throw Error("checkpoint " + ckpt.dir() +
                  ": tensor language_model.model.embed_tokens.weight not found (also tried the "
                  "prefixes model.language_model., model. and none)");
  }

  const std::string& prefix() const { return prefix_; }

  std::string lm_head_name() const {
    for (const std::string n : {"language_model.lm_head.weight", "lm_head.weight",
                                "model.lm_head.weight"})
      if (ckpt_.has(n)) return n;
    throw Error("checkpoint " + ckpt_.dir() +
                ": tensor language_model.lm_head.weight not found (tie_word_embeddings is false)");
  }

  // Reads `name` (full name) expecting [rows, cols] (cols == 0: a vector of `rows`).
  HostMat read(const std::string& name, int64_t rows, int64_t cols, bool want_f32 = false) const {
    const TensorInfo& t = ckpt_.get(name);
    std::vector<int64_t> expect = cols ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    if (t.shape != expect)
      throw Error("checkpoint " + ckpt_.dir() + ": tensor " + name + " has shape " + shape_of(t) +
                  ", expected " + shape_str(expect));
    HostMat m;
    m.rows = rows;
    m.cols = cols ? cols : 1;
    const int64_t n = rows * m.cols;
    std::string base = name.substr(0, name.size() - std::string(".weight").size());
    bool is_fp8 = t.dtype == DType::FP8_E4M3;
    if (is_fp8) {
      // MXFP8: one E8M0 scale per 1x32 block along K (`weight_scale_inv`, U8), exact in BF16.
      std::string sname = base + ".weight_scale_inv";
      if (!ckpt_.has(sname))
        throw Error("checkpoint " + ckpt_.dir() + ": FP8 tensor " + name + " has no " + sname);
      const TensorInfo& s = ckpt_.get(sname);
      int64_t kb = (m.cols + 31) / 32;
      if (s.dtype == DType::U8 && s.shape == std::vector<int64_t>{rows, kb}) {
        m.dtype = want_f32 ? DType::F32 : DType::BF16;
        m.bytes.resize(size_t(n) * dtype_size(m.dtype));
        const uint8_t* w = static_cast<const uint8_t*>(t.data);
        const uint8_t* sc = static_cast<const uint8_t*>(s.data);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < m.cols; ++c) {
            float v = fp8e4m3_to_f32(w[r * m.cols + c]) * e8m0_to_f32(sc[r * kb + c / 32]);
            store_from_f32(m.bytes.data(), m.dtype, size_t(r * m.cols + c), v);
          }
        return m;
      }
      throw Error("checkpoint " + ckpt_.dir() + ": tensor " + sname + " has dtype " +
                  std::string(dtype_name(s.dtype)) + " and shape " + shape_of(s) +
                  ", expected U8 " + shape_str({rows, kb}) + " (MXFP8, E8M0 per 1x32 block)");
    }
    if (t.dtype != DType::BF16 && t.dtype != DType::F32 && t.dtype != DType::F16)
      throw Error("checkpoint " + ckpt_.dir() + ": tensor " + name + " has dtype " +
                  std::string(dtype_name(t.dtype)) + ", expected BF16, F16, F32 or F8_E4M3");
    m.dtype = (t.dtype == DType::BF16 && !want_f32) ? DType::BF16 : DType::F32;
    m.bytes.resize(size_t(n) * dtype_size(m.dtype));
    if (t.dtype == m.dtype) {
      std::memcpy(m.bytes.data(), t.data, m.bytes.size());
    } else {
      for (int64_t i = 0; i < n; ++i)
        store_from_f32(m.bytes.data(), m.dtype, size_t(i), load_as_f32(t.data, t.dtype, size_t(i)));
    }
    return m;
  }

  HostMat layer(int i, const std::string& rest, int64_t rows, int64_t cols, bool f32 = false) const {
    return read(prefix_ + "layers." + std::to_string(i) + "." + rest, rows, cols, f32);
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  std::string prefix_;
  bool found_ = false;
};

// Stacks matrices with equal column counts row-wise; BF16 when every part is BF16, else F32.
HostMat stack(const std::vector<HostMat>& parts) {
  HostMat out;
  out.cols = parts.at(0).cols;
  bool all_bf16 = true;
  for (const auto& p : parts) {
    SIEVE_CHECK(p.cols == out.cols, "stacked weights differ in width");
    out.rows += p.rows;
    all_bf16 = all_bf16 && p.dtype == DType::BF16;
  }
  out.dtype = all_bf16 ? DType::BF16 : DType::F32;
  out.bytes.resize(size_t(out.rows * out.cols) * dtype_size(out.dtype));
  size_t at = 0;
  for (const auto& p : parts) {
    const int64_t n = p.rows * p.cols;
    if (p.dtype == out.dtype) {
      std::memcpy(out.bytes.data() + at * dtype_size(out.dtype), p.bytes.data(), p.bytes.size());
    } else {
      for (int64_t i = 0; i < n; ++i)
        store_from_f32(out.bytes.data(), out.dtype, at + size_t(i),
                       load_as_f32(p.bytes.data(), p.dtype, size_t(i)));
    }
    at += size_t(n);
  }
  return out;
}

Weight upload(const HostMat& m, const Device& device) {
  Weight w;
  w.dtype = m.dtype;
  w.rows = m.rows;
  w.cols = m.cols;
  w.buf = Buffer(device, m.bytes.size());
  copy_to_device(device, w.buf.data(), m.bytes.data(), m.bytes.size());
  return w;
}

}  // namespace

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& c, const Device& dev) {
  Reader rd(ckpt, c);
  const std::string& P = rd.prefix();
  const int64_t H = c.hidden_size;
  const int64_t hd = c.head_dim;
  ModelWeights mw;
  mw.embed = upload(rd.read(P + "embed_tokens.weight", c.vocab_size, H), dev);
  mw.norm = upload(rd.read(P + "norm.weight", H, 0, true), dev);
  if (c.tie_word_embeddings)
    mw.lm_head = upload(rd.read(P + "embed_tokens.weight", c.vocab_size, H), dev);
  else
    mw.lm_head = upload(rd.read(rd.lm_head_name(), c.vocab_size, H), dev);

  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights L;
    L.sparse = c.is_sparse_layer(i);
    L.moe = c.is_moe_layer(i);
    L.input_norm = upload(rd.layer(i, "input_layernorm.weight", H, 0, true), dev);
    L.post_norm = upload(rd.layer(i, "post_attention_layernorm.weight", H, 0, true), dev);
    std::vector<HostMat> qkv = {
        rd.layer(i, "self_attn.q_proj.weight", int64_t(c.num_attention_heads) * hd, H),
        rd.layer(i, "self_attn.k_proj.weight", int64_t(c.num_key_value_heads) * hd, H),
        rd.layer(i, "self_attn.v_proj.weight", int64_t(c.num_key_value_heads) * hd, H)};
    if (L.sparse) {
      qkv.push_back(rd.layer(i, "self_attn.index_q_proj.weight",
                             int64_t(c.sparse_num_index_heads) * c.sparse_index_dim, H));
      qkv.push_back(rd.layer(i, "self_attn.index_k_proj.weight", c.sparse_index_dim, H));
    }
    L.qkv = upload(stack(qkv), dev);
    L.o_proj = upload(rd.layer(i, "self_attn.o_proj.weight", H, int64_t(c.num_attention_heads) * hd), dev);
    L.q_norm = upload(rd.layer(i, "self_attn.q_norm.weight", hd, 0, true), dev);
    L.k_norm = upload(rd.layer(i, "self_attn.k_norm.weight", hd, 0, true), dev);
    if (L.sparse) {
      L.index_q_norm = upload(rd.layer(i, "self_attn.index_q_norm.weight", c.sparse_index_dim, 0, true), dev);
      L.index_k_norm = upload(rd.layer(i, "self_attn.index_k_norm.weight", c.sparse_index_dim, 0, true), dev);
    }
    if (L.moe) {
      const int E = c.num_local_experts;
      const int64_t I = c.intermediate_size;
      L.router = upload(rd.layer(i, "block_sparse_moe.gate.weight", E, H, true), dev);
      if (c.use_routing_bias)
        L.router_bias = upload(rd.layer(i, "block_sparse_moe.e_score_correction_bias", E, 0, true), dev);
      std::vector<const void*> gu_ptrs, down_ptrs;
      for (int e = 0; e < E; ++e) {
        std::string ep = "block_sparse_moe.experts." + std::to_string(e) + ".";
        L.expert_gate_up.push_back(
            upload(stack({rd.layer(i, ep + "w1.weight", I, H), rd.layer(i, ep + "w3.weight", I, H)}), dev));
        L.expert_down.push_back(upload(rd.layer(i, ep + "w2.weight", H, I), dev));
        gu_ptrs.push_back(L.expert_gate_up.back().data());
        down_ptrs.push_back(L.expert_down.back().data());
      }
      // One dtype for all experts: the op takes a single w_dtype.
      for (int e = 1; e < E; ++e)
        if (L.expert_gate_up[e].dtype != L.expert_gate_up[0].dtype ||
            L.expert_down[e].dtype != L.expert_gate_up[0].dtype)
          throw Error("checkpoint " + ckpt.dir() + ": layer " + std::to_string(i) +
                      " experts mix weight dtypes; expected all BF16 or all F32");
      L.expert_gate_up_ptrs = Buffer(dev, gu_ptrs.size() * sizeof(void*));
      copy_to_device(dev, L.expert_gate_up_ptrs.data(), gu_ptrs.data(), gu_ptrs.size() * sizeof(void*));
      L.expert_down_ptrs = Buffer(dev, down_ptrs.size() * sizeof(void*));
      copy_to_device(dev, L.expert_down_ptrs.data(), down_ptrs.data(), down_ptrs.size() * sizeof(void*));
      if (c.n_shared_experts > 0 && c.shared_intermediate_size > 0) {
        const int64_t S = c.shared_intermediate_size;
        L.shared_gate_up = upload(stack({rd.layer(i, "block_sparse_moe.shared_experts.gate_proj.weight", S, H),
                                         rd.layer(i, "block_sparse_moe.shared_experts.up_proj.weight", S, H)}),
                                  dev);
        L.shared_down = upload(rd.layer(i, "block_sparse_moe.shared_experts.down_proj.weight", H, S), dev);
      }
    } else {
      const int64_t D = c.dense_intermediate_size;
      L.mlp_gate_up = upload(stack({rd.layer(i, "mlp.gate_proj.weight", D, H), rd.layer(i, "mlp.up_proj.weight", D, H)}), dev);
      L.mlp_down = upload(rd.layer(i, "mlp.down_proj.weight", H, D), dev);
    }
    mw.layers.push_back(std::move(L));
  }
  return mw;
}

}  // namespace sieve::model
