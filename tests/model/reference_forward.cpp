#include "reference_forward.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "io/safetensors.h"

namespace sieve::testing {
namespace {

using Vec = std::vector<double>;

struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<float> w;
  Vec apply(const Vec& x) const {
    Vec y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[c];
      y[r] = s;
    }
    return y;
  }
};

class Weights {
 public:
  explicit Weights(const std::string& dir) : ckpt_(Checkpoint::open(dir)) {
    for (const char* p : {"language_model.model.", "model.language_model.", "model.", ""})
      if (ckpt_.has(std::string(p) + "embed_tokens.weight")) {
        prefix_ = p;
        break;
      }
  }
  Mat get(const std::string& name) const {
    const TensorInfo& t = ckpt_.get(name);
    Mat m;
    m.rows = t.shape[0];
    m.cols = t.shape.size() > 1 ? t.shape[1] : 1;
    m.w.resize(size_t(m.rows * m.cols));
    std::string scale = name.substr(0, name.size() - 7) + ".weight_scale_inv";
    for (size_t i = 0; i < m.w.size(); ++i) {
      float v = load_as_f32(t.data, t.dtype, i);
      if (t.dtype == DType::FP8_E4M3) {
        // MXFP8: U8 E8M0 per 1x32; block fp8: a float multiplier per 128x128.
        const TensorInfo& s = ckpt_.get(scale);
        int64_t r = int64_t(i) / m.cols, c = int64_t(i) % m.cols;
        if (s.dtype == DType::U8)
          v *= std::ldexp(1.0f, int(static_cast<const uint8_t*>(s.data)[r * s.shape[1] + c / 32]) - 127);
        else
          v *= load_as_f32(s.data, s.dtype, size_t((r / 128) * s.shape[1] + c / 128));
      }
      m.w[i] = v;
    }
    return m;
  }
  Mat model(const std::string& rest) const { return get(prefix_ + rest); }
  Mat layer(int i, const std::string& rest) const {
    return get(prefix_ + "layers." + std::to_string(i) + "." + rest);
  }
  Mat lm_head() const {
    for (const std::string n : {"language_model.lm_head.weight", "lm_head.weight"})
      if (ckpt_.has(n)) return get(n);
    return model("embed_tokens.weight");
  }

 private:
  Checkpoint ckpt_;
  std::string prefix_;
};

Vec gemma_norm(const Vec& x, const Mat& w, double eps, bool gemma) {
  double ss = 0;
  for (double v : x) ss += v * v;
  double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (gemma ? 1.0 + w.w[i] : w.w[i]);
  return y;
}

// The fp32 rounding the engine's activations carry makes no difference at this tolerance;
// cos/sin follow transformers' fp32 table.
void rope(double* x, int rot, int pos, double theta) {
  int half = rot / 2;
  for (int j = 0; j < half; ++j) {
    float inv = 1.0f / std::pow(float(theta), float(2 * j) / float(rot));
    float ang = float(pos) * inv;
    double c = std::cos(ang), s = std::sin(ang);
    double a = x[j], b = x[j + half];
    x[j] = a * c - b * s;
    x[j + half] = b * c + a * s;
  }
}

// Round a head vector as the cache stores it.
void store_kv(double* x, int n, DType t) {
  if (t == DType::F32) {
    for (int i = 0; i < n; ++i) x[i] = float(x[i]);
    return;
  }
  for (int i = 0; i < n; ++i) x[i] = round_bf16(float(x[i]));
  if (t == DType::FP8_E4M3) {
    double amax = 0;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    float scale = amax == 0 ? 1.0f : float(amax) / 448.0f;
    for (int i = 0; i < n; ++i) x[i] = double(fp8e4m3_to_f32(f32_to_fp8e4m3(float(x[i]) / scale))) * scale;
  }
}

void store_index(double* x, int n, DType t) {
  for (int i = 0; i < n; ++i) {
    if (t == DType::F32) x[i] = float(x[i]);
    else if (t == DType::BF16) x[i] = round_bf16(float(x[i]));
    else x[i] = fp8e4m3_to_f32(f32_to_fp8e4m3(round_bf16(float(x[i]))));
  }
}

Vec swiglu_mlp(const Mat& gate, const Mat& up, const Mat& down, const Vec& x, const ModelConfig& c) {
  Vec g = gate.apply(x), u = up.apply(x), a(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    double gg = std::min(g[i], double(c.swiglu_limit));
    double uu = std::clamp(u[i], -double(c.swiglu_limit), double(c.swiglu_limit));
    a[i] = gg / (1.0 + std::exp(-double(c.swiglu_alpha) * gg)) * (uu + c.swiglu_beta);
  }
  return down.apply(a);
}

}  // namespace

std::vector<float> reference_logits(const std::string& dir, const ModelConfig& c,
                                    const std::vector<int32_t>& ids, const ReferenceOptions& opt) {
  Weights W(dir);
  const int T = int(ids.size());
  const int H = int(c.hidden_size), nq = c.num_attention_heads, nkv = c.num_key_value_heads,
            hd = c.head_dim, group = nq / nkv;
  const int nidx = c.sparse_num_index_heads, idim = c.sparse_index_dim, bs = c.sparse_block_size;
  const double scale = 1.0 / std::sqrt(double(hd));

  Mat embed = W.model("embed_tokens.weight");
  std::vector<Vec> x(T, Vec(H));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = embed.w[size_t(ids[t]) * H + i];

  // Selected blocks per (token, group) of the most recent full sparse layer.
  std::vector<std::vector<std::vector<int>>> selection;

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const bool sparse = c.is_sparse_layer(l);
    Mat in_norm = W.layer(l, "input_layernorm.weight");
    Mat wq = W.layer(l, "self_attn.q_proj.weight"), wk = W.layer(l, "self_attn.k_proj.weight"),
        wv = W.layer(l, "self_attn.v_proj.weight"), wo = W.layer(l, "self_attn.o_proj.weight");
    Mat qn = W.layer(l, "self_attn.q_norm.weight"), kn = W.layer(l, "self_attn.k_norm.weight");
    std::vector<Vec> q(T), k(T), v(T), iq(T), ik(T);
    const bool full = sparse && !opt.dense && !c.shares_index_topk(l);
    Mat wiq, wik, iqn, ikn;
    if (full) {
      wiq = W.layer(l, "self_attn.index_q_proj.weight");
      wik = W.layer(l, "self_attn.index_k_proj.weight");
      iqn = W.layer(l, "self_attn.index_q_norm.weight");
      ikn = W.layer(l, "self_attn.index_k_norm.weight");
    }
    auto head_norm_rope = [&](Vec& vec, int heads, int dim, const Mat& w, int pos) {
      for (int h = 0; h < heads; ++h) {
        Vec part(vec.begin() + h * dim, vec.begin() + (h + 1) * dim);
        part = gemma_norm(part, w, c.rms_norm_eps, c.use_gemma_norm);
        rope(part.data(), c.rotary_dim, pos, c.rope_theta);
        std::copy(part.begin(), part.end(), vec.begin() + h * dim);
      }
    };
    for (int t = 0; t < T; ++t) {
      Vec xn = gemma_norm(x[t], in_norm, c.rms_norm_eps, c.use_gemma_norm);
      q[t] = wq.apply(xn);
      k[t] = wk.apply(xn);
      v[t] = wv.apply(xn);
      head_norm_rope(q[t], nq, hd, qn, t);
      head_norm_rope(k[t], nkv, hd, kn, t);
      for (int g = 0; g < nkv; ++g) {
        store_kv(k[t].data() + g * hd, hd, opt.kv_dtype);
        store_kv(v[t].data() + g * hd, hd, opt.kv_dtype);
      }
      if (full) {
        iq[t] = wiq.apply(xn);
        ik[t] = wik.apply(xn);
        head_norm_rope(iq[t], nidx, idim, iqn, t);
        head_norm_rope(ik[t], 1, idim, ikn, t);
        store_index(ik[t].data(), idim, opt.index_dtype);
      }
    }
    if (full) {
      selection.assign(T, std::vector<std::vector<int>>(nidx));
      for (int t = 0; t < T; ++t) {
        const int n_blk = t / bs + 1;
        for (int g = 0; g < nidx; ++g) {
          std::vector<std::pair<double, int>> cand;
          for (int b = 0; b < n_blk; ++b) {
            double best = -INFINITY;
            for (int j = b * bs; j < std::min((b + 1) * bs, t + 1); ++j) {
              double s = 0;
              for (int d = 0; d < idim; ++d) s += iq[t][g * idim + d] * ik[j][d];
              best = std::max(best, s);
            }
            if (b < c.sparse_init_block) best = 1e30;
            if (b >= n_blk - c.sparse_local_block) best = 1e29;
            cand.push_back({best, b});
          }
          std::stable_sort(cand.begin(), cand.end(), [](auto& a, auto& b2) { return a.first > b2.first; });
          for (int i = 0; i < std::min<int>(c.sparse_topk_blocks, int(cand.size())); ++i)
            selection[t][g].push_back(cand[i].second);
        }
      }
    }

    Vec attn_row(size_t(nq) * hd);
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < nq; ++h) {
        const int g = h / group;
        std::vector<int> keys;
        if (sparse && !opt.dense) {
          for (int b : selection.at(t).at(g))
            for (int j = b * bs; j < std::min((b + 1) * bs, t + 1); ++j) keys.push_back(j);
        } else {
          for (int j = 0; j <= t; ++j) keys.push_back(j);
        }
        std::vector<double> s(keys.size());
        double mx = -INFINITY;
        for (size_t i = 0; i < keys.size(); ++i) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += q[t][h * hd + e] * k[keys[i]][g * hd + e];
          s[i] = d * scale;
          mx = std::max(mx, s[i]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (size_t i = 0; i < keys.size(); ++i) o += s[i] * v[keys[i]][g * hd + e];
          attn_row[h * hd + e] = o / z;
        }
      }
      Vec o = wo.apply(attn_row);
      for (int i = 0; i < H; ++i) x[t][i] += o[i];
    }

    Mat post = W.layer(l, "post_attention_layernorm.weight");
    if (c.is_moe_layer(l)) {
      const int E = c.num_local_experts, kk = c.num_experts_per_tok;
      Mat router = W.layer(l, "block_sparse_moe.gate.weight");
      Mat bias;
      if (c.use_routing_bias) bias = W.layer(l, "block_sparse_moe.e_score_correction_bias");
      std::map<int, std::array<Mat, 3>> experts;
      bool shared = c.n_shared_experts > 0 && c.shared_intermediate_size > 0;
      Mat sg, su, sd;
      if (shared) {
        sg = W.layer(l, "block_sparse_moe.shared_experts.gate_proj.weight");
        su = W.layer(l, "block_sparse_moe.shared_experts.up_proj.weight");
        sd = W.layer(l, "block_sparse_moe.shared_experts.down_proj.weight");
      }
      for (int t = 0; t < T; ++t) {
        Vec xn = gemma_norm(x[t], post, c.rms_norm_eps, c.use_gemma_norm);
        Vec logit = router.apply(xn);
        std::vector<std::pair<double, int>> choice;
        std::vector<double> sig(E);
        for (int e = 0; e < E; ++e) {
          sig[e] = 1.0 / (1.0 + std::exp(-logit[e]));
          choice.push_back({sig[e] + (c.use_routing_bias ? bias.w[e] : 0.0f), e});
        }
        std::stable_sort(choice.begin(), choice.end(), [](auto& a, auto& b) { return a.first > b.first; });
        double z = 0;
        for (int j = 0; j < kk; ++j) z += sig[choice[j].second];
        for (int j = 0; j < kk; ++j) {
          int e = choice[j].second;
          if (!experts.count(e)) {
            std::string p = "block_sparse_moe.experts." + std::to_string(e) + ".";
            experts[e] = {W.layer(l, p + "w1.weight"), W.layer(l, p + "w3.weight"), W.layer(l, p + "w2.weight")};
          }
          double wgt = sig[e] / (c.norm_topk_prob ? z : 1.0) * c.routed_scaling_factor;
          Vec y = swiglu_mlp(experts[e][0], experts[e][1], experts[e][2], xn, c);
          for (int i = 0; i < H; ++i) x[t][i] += wgt * y[i];
        }
        if (shared) {
          Vec y = swiglu_mlp(sg, su, sd, xn, c);
          for (int i = 0; i < H; ++i) x[t][i] += y[i];
        }
      }
    } else {
      Mat g = W.layer(l, "mlp.gate_proj.weight"), u = W.layer(l, "mlp.up_proj.weight"),
          d = W.layer(l, "mlp.down_proj.weight");
      for (int t = 0; t < T; ++t) {
        Vec y = swiglu_mlp(g, u, d, gemma_norm(x[t], post, c.rms_norm_eps, c.use_gemma_norm), c);
        for (int i = 0; i < H; ++i) x[t][i] += y[i];
      }
    }
  }

  Mat norm = W.model("norm.weight");
  Mat head = W.lm_head();
  std::vector<float> out(size_t(T) * c.vocab_size);
  for (int t = 0; t < T; ++t) {
    Vec y = head.apply(gemma_norm(x[t], norm, c.rms_norm_eps, c.use_gemma_norm));
    for (int64_t i = 0; i < c.vocab_size; ++i) out[size_t(t) * c.vocab_size + i] = float(y[i]);
  }
  return out;
}

}  // namespace sieve::testing
