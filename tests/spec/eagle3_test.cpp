// EAGLE3 drafts on the CPU: the loader's checks against the target, the draft's forward pass
// against a plain fp32 reference written from the published layout (first pass over aux hidden
// states, then a one-row pass fed its own output), the target's aux hidden states, and greedy
// output through the engine equal to plain decoding with n-gram and EAGLE3 drafts.
#include "spec/eagle3.h"

#include <gtest/gtest.h>

#include <functional>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/speculation.h"
#include "io/safetensors.h"
#include "io/tiny_model.h"
#include "model/model.h"
#include "sieve_cli_util.h"
#include "spec/config.h"

namespace sieve::spec {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() /
          ("sieve_eagle3_test_" + name + "_" + std::to_string(::getpid())))
      .string();
}

std::string temp_dir(const std::string& name) {
  fs::path p = temp_path(name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TinyModelOptions tiny_target() {
  TinyModelOptions o;
  o.num_layers = 5;
  o.hidden_size = 96;
  o.vocab_size = 300;
  o.seed = 5;
  return o;
}

struct Target {
  std::string dir;
  std::unique_ptr<model::Model> model;
};

Target make_target(const std::string& name) {
  Target t;
  t.dir = temp_dir(name);
  write_tiny_model(tiny_target(), t.dir);
  t.model = model::Model::load(t.dir);
  return t;
}

// ---- a plain fp32 reference of the draft ------------------------------------------------------

struct RefDraft {
  Eagle3Config c;
  std::map<std::string, std::vector<float>> w;
  std::vector<float> target_embed;  // when the draft has none
  std::vector<int64_t> d2t;

  const std::vector<float>& get(const std::string& n) const {
    auto it = w.find(n);
    if (it == w.end()) it = w.find("midlayer." + n);
    if (it == w.end()) throw std::runtime_error("missing " + n);
    return it->second;
  }
};

RefDraft read_ref(const std::string& dir, const ModelConfig& target,
                  const std::string& target_dir) {
  RefDraft r;
  r.c = load_eagle3_config(dir, target);
  Checkpoint ck = Checkpoint::open(dir);
  for (const auto& [name, t] : ck.tensors()) {
    if (name == "d2t") {
      for (int64_t i = 0; i < t.numel(); ++i)
        r.d2t.push_back(static_cast<const int64_t*>(t.data)[i]);
      continue;
    }
    if (t.dtype == DType::U8) continue;
    std::vector<float> v(size_t(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(t.data, t.dtype, i);
    r.w[name] = std::move(v);
  }
  if (!r.w.count("embed_tokens.weight")) {
    Checkpoint tk = Checkpoint::open(target_dir);
    const TensorInfo& e = tk.get("language_model.model.embed_tokens.weight");
    r.target_embed.resize(size_t(e.numel()));
    for (size_t i = 0; i < r.target_embed.size(); ++i)
      r.target_embed[i] = load_as_f32(e.data, e.dtype, i);
  }
  return r;
}

std::vector<double> matvec(const std::vector<float>& W, int64_t rows, int64_t cols, const double* x,
                           int64_t ldw = 0, int64_t col0 = 0) {
  if (!ldw) ldw = cols;
  std::vector<double> y(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) y[size_t(r)] += double(W[size_t(r * ldw + col0 + k)]) * x[k];
  return y;
}

std::vector<double> rms(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(w[i]);
  return y;
}

// One sequence: rows at positions 0..n-1 with g from aux, then a row at position n with g = the
// previous row's output. Returns the draft logits of every row and keeps K/V per position.
struct RefRun {
  std::vector<std::vector<double>> logits, out;  // per row
  std::vector<std::vector<double>> K, V;         // per position [nkv * hd]
};

void ref_row(const RefDraft& d, RefRun& run, int32_t token, int64_t pos,
             const std::vector<double>& g) {
  const Eagle3Config& c = d.c;
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads,
                I = c.intermediate_size;
  std::vector<double> e(static_cast<size_t>(H));
  const std::vector<float>& E =
      d.w.count("embed_tokens.weight") ? d.w.at("embed_tokens.weight") : d.target_embed;
  for (int64_t i = 0; i < H; ++i) e[size_t(i)] = E[size_t(token * H + i)];
  std::vector<double> x = rms(e, d.get("input_layernorm.weight"), c.rms_norm_eps);
  const std::vector<double> gn = rms(g, d.get("hidden_norm.weight"), c.rms_norm_eps);
  x.insert(x.end(), gn.begin(), gn.end());
  std::vector<double> residual = c.norm_before_residual ? gn : g;
  std::vector<double> q = matvec(d.get("self_attn.q_proj.weight"), nh * hd, 2 * H, x.data());
  std::vector<double> k = matvec(d.get("self_attn.k_proj.weight"), nkv * hd, 2 * H, x.data());
  const std::vector<double> v = matvec(d.get("self_attn.v_proj.weight"), nkv * hd, 2 * H, x.data());
  auto rope = [&](std::vector<double>& t, int64_t heads) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < hd / 2; ++j) {
        const double inv = 1.0 / std::pow(c.rope_theta, double(2 * j) / double(hd));
        const double a = double(float(pos) * float(inv)), cs = std::cos(a), sn = std::sin(a);
        double& x0 = t[size_t(h * hd + j)];
        double& x1 = t[size_t(h * hd + j + hd / 2)];
        const double y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
        x0 = y0, x1 = y1;
      }
  };
  rope(q, nh);
  rope(k, nkv);
  if (int64_t(run.K.size()) <= pos) run.K.resize(size_t(pos + 1)), run.V.resize(size_t(pos + 1));
  run.K[size_t(pos)] = k;
  run.V[size_t(pos)] = v;
  std::vector<double> attn(size_t(nh * hd), 0.0);
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g2 = h / (nh / nkv);
    std::vector<double> s(size_t(pos + 1));
    double mx = -1e300;
    for (int64_t j = 0; j <= pos; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < hd; ++i)
        dot += q[size_t(h * hd + i)] * run.K[size_t(j)][size_t(g2 * hd + i)];
      s[size_t(j)] = dot / std::sqrt(double(hd));
      mx = std::max(mx, s[size_t(j)]);
    }
    double z = 0;
    for (double& x2 : s) z += x2 = std::exp(x2 - mx);
    for (int64_t j = 0; j <= pos; ++j)
      for (int64_t i = 0; i < hd; ++i)
        attn[size_t(h * hd + i)] += s[size_t(j)] / z * run.V[size_t(j)][size_t(g2 * hd + i)];
  }
  const std::vector<double> o = matvec(d.get("self_attn.o_proj.weight"), H, nh * hd, attn.data());
  for (int64_t i = 0; i < H; ++i) residual[size_t(i)] += o[size_t(i)];
  const std::vector<double> xn =
      rms(residual, d.get("post_attention_layernorm.weight"), c.rms_norm_eps);
  const std::vector<double> ga = matvec(d.get("mlp.gate_proj.weight"), I, H, xn.data());
  const std::vector<double> up = matvec(d.get("mlp.up_proj.weight"), I, H, xn.data());
  std::vector<double> act(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i)
    act[size_t(i)] = ga[size_t(i)] / (1 + std::exp(-ga[size_t(i)])) * up[size_t(i)];
  const std::vector<double> dn = matvec(d.get("mlp.down_proj.weight"), H, I, act.data());
  for (int64_t i = 0; i < H; ++i) residual[size_t(i)] += dn[size_t(i)];
  run.out.push_back(residual);
  const std::vector<double> fin = rms(residual, d.get("norm.weight"), c.rms_norm_eps);
  run.logits.push_back(matvec(d.get("lm_head.weight"), c.draft_vocab_size, H, fin.data()));
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-6, d = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::fabs(double(got[i]) - want[i]));
  return d / scale;
}

void check_forward(const std::string& name, const RandomEagle3Options& o) {
  Target t = make_target(name);
  const ModelConfig& tc = t.model->config();
  const std::string dd = temp_dir(name + "_draft");
  write_random_eagle3(dd, tc, o);
  auto draft = Eagle3Draft::load(dd, tc, Device{}, t.model->input_embedding());
  const RefDraft ref = read_ref(dd, tc, t.dir);
  const Eagle3Config& c = draft->config();
  ASSERT_EQ(draft->draft_to_target().size(), size_t(c.draft_vocab_size));
  for (int64_t i = 0; i < c.draft_vocab_size; ++i)
    EXPECT_EQ(draft->draft_to_target()[size_t(i)], i + ref.d2t[size_t(i)]);

  // One sequence of n rows on blocks 2, 0 (block size 8), then one more row.
  const int n = 11, bs = 8;
  draft->allocate_cache(DType::F32, 3, bs, 64);
  const int64_t Ht = tc.hidden_size, na = int64_t(c.aux_layers.size());
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> aux(size_t(na * n * Ht));
  for (auto& x : aux) x = nd(rng);
  std::vector<int32_t> ids(n), pos(n), table = {2, 0};
  std::vector<int64_t> slots(n);
  for (int i = 0; i < n; ++i) {
    ids[size_t(i)] = int32_t(rng() % uint64_t(tc.vocab_size));
    pos[size_t(i)] = i;
    slots[size_t(i)] = int64_t(table[size_t(i / bs)]) * bs + i % bs;
  }
  std::vector<int32_t> qsl = {0, n}, lens = {n}, rows;
  for (int i = 0; i < n; ++i) rows.push_back(i);
  std::vector<float> logits(size_t(n * c.draft_vocab_size), NAN);
  DraftStep s;
  s.batch = {1, n, qsl.data(), lens.data(), table.data(), 2, n, n};
  s.token_ids = ids.data();
  s.positions = pos.data();
  s.slot_mapping = slots.data();
  s.max_position = n - 1;
  s.aux = aux.data();
  s.logits_rows = rows.data();
  s.num_logits = int64_t(rows.size());
  s.logits = logits.data();
  draft->forward(s, ops::Stream::cpu());

  RefRun run;
  for (int i = 0; i < n; ++i) {
    std::vector<double> g(size_t(c.hidden_size), 0.0);
    for (int64_t j = 0; j < na; ++j) {
      std::vector<double> a(static_cast<size_t>(Ht));
      for (int64_t k = 0; k < Ht; ++k) a[size_t(k)] = aux[size_t((j * n + i) * Ht + k)];
      const std::vector<double> part =
          matvec(ref.get("fc.weight"), c.hidden_size, Ht, a.data(), na * Ht, j * Ht);
      for (int64_t k = 0; k < c.hidden_size; ++k) g[size_t(k)] += part[size_t(k)];
    }
    ref_row(ref, run, ids[size_t(i)], i, g);
  }
  for (int i = 0; i < n; ++i) {
    std::vector<float> row(logits.begin() + i * c.draft_vocab_size,
                           logits.begin() + (i + 1) * c.draft_vocab_size);
    EXPECT_LT(max_rel(row, run.logits[size_t(i)]), 1e-4) << name << " row " << i;
  }

  // A one-row pass at position n fed row n - 2's output (as after a rejected last draft).
  const int32_t tok = 7, p2 = n, hr = n - 2;
  const int64_t slot2 = int64_t(table[size_t(p2 / bs)]) * bs + p2 % bs;
  std::vector<int32_t> qsl2 = {0, 1}, lens2 = {p2 + 1}, rows2 = {0};
  std::vector<float> logits2(size_t(c.draft_vocab_size), NAN);
  DraftStep s2;
  s2.batch = {1, 1, qsl2.data(), lens2.data(), table.data(), 2, p2 + 1, 1};
  s2.token_ids = &tok;
  s2.positions = &p2;
  s2.slot_mapping = &slot2;
  s2.max_position = p2;
  s2.hidden_rows = &hr;
  s2.prev_rows = n;
  s2.logits_rows = rows2.data();
  s2.num_logits = 1;
  s2.logits = logits2.data();
  draft->forward(s2, ops::Stream::cpu());
  RefRun run2 = run;
  run2.logits.clear();
  ref_row(ref, run2, tok, p2, run.out[size_t(hr)]);
  EXPECT_LT(max_rel(logits2, run2.logits[0]), 1e-4) << name << " second pass";
}

TEST(Eagle3Draft, ForwardMatchesReference) {
  RandomEagle3Options o;
  o.num_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 32;
  o.intermediate_size = 80;
  o.aux_layers = {1, 2, 4};
  check_forward("own_embed", o);
  o.own_embedding = false;
  o.draft_vocab_size = 120;
  o.norm_before_residual = true;
  o.seed = 3;
  check_forward("shared_embed", o);
}

TEST(Eagle3Draft, TargetWritesAuxHiddenStates) {
  Target t = make_target("aux");
  model::Model& m = *t.model;
  const int64_t H = m.config().hidden_size, n = 5;
  m.allocate_caches({.kv_dtype = DType::F32, .index_dtype = DType::F32, .num_blocks = 2});
  std::vector<int32_t> ids = {3, 17, 99, 4, 250}, pos = {0, 1, 2, 3, 4}, qsl = {0, 5}, lens = {5},
                       table = {1};
  std::vector<int64_t> slots = {128, 129, 130, 131, 132};
  std::vector<int32_t> rows = {4};
  const std::vector<int> layers = {0, 3};
  std::vector<float> aux(size_t(2 * n * H), NAN), logits(size_t(m.vocab_size()), NAN),
      plain(logits.size(), NAN);
  model::StepView v;
  v.batch = {1, n, qsl.data(), lens.data(), table.data(), 1, 5, 5};
  v.token_ids = ids.data();
  v.positions = pos.data();
  v.slot_mapping = slots.data();
  v.max_position = 4;
  v.logits_rows = rows;
  v.logits = plain.data();
  m.forward(v, ops::Stream::cpu());
  v.logits = logits.data();
  v.aux_layers = layers;
  v.aux_hidden = aux.data();
  m.forward(v, ops::Stream::cpu());
  EXPECT_EQ(logits, plain) << "aux outputs change nothing";
  // The residual stream entering layer 0 is the embedding.
  const ops::WeightView e = m.input_embedding();
  for (int64_t t2 = 0; t2 < n; ++t2)
    for (int64_t i = 0; i < H; ++i)
      ASSERT_EQ(aux[size_t(t2 * H + i)],
                load_as_f32(e.data, e.dtype, size_t(ids[size_t(t2)] * H + i)));
  double diff = 0;
  for (int64_t i = 0; i < n * H; ++i) {
    ASSERT_TRUE(std::isfinite(aux[size_t(n * H + i)]));
    diff += std::fabs(aux[size_t(n * H + i)] - aux[size_t(i)]);
  }
  EXPECT_GT(diff, 0.0);
}

std::string load_error(const std::string& dir, const ModelConfig& tc) {
  try {
    Eagle3Draft::load(dir, tc, Device{}, {});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Eagle3Draft, DraftsThatDoNotFitTheTargetAreRefused) {
  const std::string tdir = temp_dir("fit");
  write_tiny_model(tiny_target(), tdir);
  const ModelConfig tc = load_model_config(tdir);
  auto edit = [&](const std::string& name, auto change, RandomEagle3Options o = {}) {
    const std::string dd = temp_dir("fit_" + name);
    o.head_dim = 32;
    write_random_eagle3(dd, tc, o);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dd + "/config.json"));
    change(j);
    std::ofstream(dd + "/config.json") << j.dump();
    return load_error(dd, tc);
  };
  EXPECT_NE(edit("hidden", [](auto& j) { j["target_hidden_size"] = 64; })
                .find("does not match the target's hidden_size 96"),
            std::string::npos);
  EXPECT_NE(edit("vocab", [](auto& j) { j["vocab_size"] = 301; })
                .find("vocab_size 301 does not match the target's 300"),
            std::string::npos);
  EXPECT_NE(edit("layer",
                 [](auto& j) {
                   j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 2, 9};
                 })
                .find("aux hidden state layer 9 is not a layer of the target"),
            std::string::npos);
  EXPECT_NE(edit("naux",
                 [](auto& j) {
                   j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 2};
                 })
                .find("fc.weight has shape"),
            std::string::npos);
  EXPECT_NE(edit("dv", [](auto& j) { j["draft_vocab_size"] = 400; }).find("draft_vocab_size 400"),
            std::string::npos);
  EXPECT_NE(edit("act", [](auto& j) { j["hidden_act"] = "gelu"; }).find("hidden_act"),
            std::string::npos);
  // A d2t that maps outside the target's vocabulary.
  {
    const std::string dd = temp_dir("fit_d2t");
    RandomEagle3Options o;
    o.head_dim = 32;
    write_random_eagle3(dd, tc, o);
    auto f = SafetensorsFile::open(dd + "/model.safetensors");
    std::vector<TensorToWrite> ts;
    for (const auto& [n, t] : f->tensors()) {
      TensorToWrite w{n, t.dtype, t.shape,
                      std::vector<uint8_t>(static_cast<const uint8_t*>(t.data),
                                           static_cast<const uint8_t*>(t.data) + t.nbytes)};
      if (n == "d2t") reinterpret_cast<int64_t*>(w.bytes.data())[5] = 1000;
      ts.push_back(std::move(w));
    }
    f.reset();
    write_safetensors(dd + "/model.safetensors", ts);
    EXPECT_NE(load_error(dd, tc).find("d2t maps draft id 5 to 1005"), std::string::npos)
        << load_error(dd, tc);
  }
  // The CLI: one line, exit 2, before any weights load.
  const auto r =
      testing::run_sieve("generate --model " + tdir +
                             " --prompt-ids 1,2 --device cpu --speculative-config "
                             "'{\"method\": \"eagle3\", \"model\": \"" +
                             temp_path("fit_layer") + "\", \"num_speculative_tokens\": 3}'",
                         true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("aux hidden state layer 9"), std::string::npos) << r.out;
  const auto r2 = testing::run_sieve(
      "generate --model " + tdir +
          " --prompt-ids 1,2 --device cpu --speculative-config '{\"method\": \"mtp\", "
          "\"num_speculative_tokens\": 3}'",
      true);
  EXPECT_EQ(r2.rc, 2);
  EXPECT_NE(r2.out.find("--speculative-config: unknown method \"mtp\""), std::string::npos)
      << r2.out;
  const auto r3 = testing::run_sieve(
      "generate --model " + tdir +
          " --prompt-ids 1,2 --device cpu --speculative-config '{\"method\": \"ngram\", "
          "\"num_speculative_tokens\": 40}'",
      true);
  EXPECT_EQ(r3.rc, 2);
  EXPECT_NE(r3.out.find("num_speculative_tokens must be in 1..16"), std::string::npos) << r3.out;
}

// ---- greedy equality through the engine on a real (tiny) model ---------------------------------

// A small random draft of `m` written to `dir` and loaded.
std::unique_ptr<Eagle3Draft> small_random_draft(model::Model& m, const std::string& dir) {
  RandomEagle3Options o;
  o.head_dim = 32;
  o.num_heads = 4;
  o.aux_layers = {1, 2, 3};
  write_random_eagle3(dir, m.config(), o);
  return Eagle3Draft::load(dir, m.config(), Device{}, m.input_embedding());
}

// Greedy outputs of `prompts` (max_tokens each, or max_tokens_of(i)) through an engine; `tweak`
// changes its config.
std::vector<std::vector<int32_t>> run_engine(model::Model& m, Eagle3Draft* draft,
                                             const SpeculativeConfig& sc,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int max_tokens, bool caching,
                                             engine::EngineStats* st,
                                             const std::function<int(size_t)>& max_tokens_of = {},
                                             const std::function<void(engine::EngineConfig&)>& tweak = {}) {
  engine::Runner runner(m);
  const int64_t blocks = 48;
  m.allocate_caches({.kv_dtype = DType::F32, .index_dtype = DType::F32, .num_blocks = blocks});
  if (draft) {
    draft->allocate_cache(DType::F32, blocks, m.block_size(), 2048);
    runner.set_draft(draft);
  }
  engine::EngineConfig ec;
  ec.scheduler = {.max_num_batched_tokens = 200, .max_num_seqs = 8, .max_model_len = 1024};
  ec.num_blocks = blocks;
  ec.enable_prefix_caching = caching;
  ec.speculative = sc;
  if (tweak) tweak(ec);
  engine::Engine e(runner, ec);
  e.start();
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    engine::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = max_tokens_of ? max_tokens_of(i) : max_tokens;
    sp.ignore_eos = true;
    streams.push_back(e.submit(p, sp));
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    std::vector<engine::TokenOutput> toks;
    engine::FinishReason f;
    while ((f = s->next(toks, 100ms)) == engine::FinishReason::None) {
    }
    EXPECT_EQ(f, engine::FinishReason::Length) << s->error();
    out.emplace_back();
    for (auto& t : toks) out.back().push_back(t.token);
  }
  EXPECT_TRUE(e.wait_idle(5s));
  EXPECT_EQ(e.stats().num_free_blocks, blocks);
  *st = e.stats();
  e.stop();
  return out;
}

TEST(Eagle3Draft, GreedyOutputEqualsPlainDecodingOnARealModel) {
  Target t = make_target("greedy");
  model::Model& m = *t.model;
  std::mt19937_64 rng(4);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {3, 40, 127, 128, 200, 300, 330}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    // Half repeated text (n-gram drafts find matches), half random.
    for (int i = 0; i < len; ++i) p[size_t(i)] = i % 2 ? int32_t(rng() % 300) : int32_t(i % 13);
    prompts.push_back(p);
  }
  engine::EngineStats st;
  SpeculativeConfig off;
  const auto want = run_engine(m, nullptr, off, prompts, 24, false, &st);
  const std::string dd = temp_dir("greedy_draft");
  auto draft = small_random_draft(m, dd);
  struct Variant {
    Method method;
    int k;
    bool caching;
  } variants[] = {{Method::Ngram, 3, false},
                  {Method::Ngram, 5, true},
                  {Method::Eagle3, 1, false},
                  {Method::Eagle3, 3, true},
                  {Method::Eagle3, 4, false}};
  for (const auto& v : variants) {
    SpeculativeConfig sc;
    sc.method = v.method;
    sc.num_speculative_tokens = v.k;
    sc.prompt_lookup_min = 1;
    sc.prompt_lookup_max = 4;
    sc.model = dd;
    sc.adaptive = false;
    const auto got = run_engine(m, v.method == Method::Eagle3 ? draft.get() : nullptr, sc, prompts,
                                24, v.caching, &st);
    EXPECT_EQ(got, want) << method_name(v.method) << " K=" << v.k;
    EXPECT_GT(st.spec_num_draft_tokens, 0u) << method_name(v.method) << " K=" << v.k;
  }
}

// The adaptive controller with a useless (random) draft: speculation costs more than it gains, so
// the engine turns to plain decoding, which stops the draft's passes over decode rows (sequences
// it skipped draft no more) and probes now and then with new sequences. Output stays plain
// decoding's, with and without prefix caching.
TEST(Eagle3Draft, AdaptiveDraftThatTurnsOffKeepsGreedyOutput) {
  Target t = make_target("adaptive");
  model::Model& m = *t.model;
  std::mt19937_64 rng(9);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p(size_t(20 + rng() % 150));
    for (auto& x : p) x = int32_t(rng() % 300);
    prompts.push_back(p);
  }
  engine::EngineStats st;
  const auto want = run_engine(m, nullptr, {}, prompts, 90, false, &st);
  const std::string dd = temp_dir("adaptive_draft");
  auto draft = small_random_draft(m, dd);
  SpeculativeConfig sc;
  sc.method = Method::Eagle3;
  sc.num_speculative_tokens = 3;
  sc.model = dd;
  sc.adaptive = true;
  for (bool caching : {false, true}) {
    const auto got = run_engine(m, draft.get(), sc, prompts, 90, caching, &st);
    EXPECT_EQ(got, want) << "prefix caching " << caching;
    std::printf("[ spec ] adaptive random draft: %llu drafts\n", (unsigned long long)st.spec_num_drafts);
  }
}

// While speculation is off (the controller is told steps with drafts cost three plain steps),
// the draft skips the prompts of new sequences except while a probe waits for one that can
// draft: probes still run (with drafts), most prompts never reach the draft, and the output is
// plain decoding's. Requests end at different times, so sequences arrive one by one as in served
// traffic; with prefix caching the prompts share a prefix of several blocks (the draft's K/V of
// a cached block count only when the draft followed it).
TEST(Eagle3Draft, WhileSpeculationIsOffTheDraftSkipsMostPrompts) {
  Target t = make_target("off");
  model::Model& m = *t.model;
  std::mt19937_64 rng(21);
  std::vector<int32_t> shared(size_t(3 * m.block_size() + 5));
  for (auto& x : shared) x = int32_t(rng() % 300);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 60; ++i) {
    std::vector<int32_t> p = i % 2 ? shared : std::vector<int32_t>{};
    const size_t own = 10 + rng() % 50;
    for (size_t j = 0; j < own; ++j) p.push_back(int32_t(rng() % 300));
    prompts.push_back(p);
  }
  const auto max_tokens_of = [](size_t i) { return int(8 + (i * 7) % 29); };
  engine::EngineStats st;
  const auto want = run_engine(m, nullptr, {}, prompts, 0, false, &st, max_tokens_of);
  const std::string dd = temp_dir("off_draft");
  auto draft = small_random_draft(m, dd);
  SpeculativeConfig sc;
  sc.method = Method::Eagle3;
  sc.num_speculative_tokens = 3;
  sc.model = dd;
  sc.adaptive = true;
  const auto slow_drafts = [](engine::EngineConfig& ec) {
    ec.spec_step_seconds = [](int k, int, int64_t) { return k > 0 ? 3.0 : 1.0; };
  };
  for (bool caching : {false, true}) {
    const auto got = run_engine(m, draft.get(), sc, prompts, 0, caching, &st, max_tokens_of, slow_drafts);
    EXPECT_EQ(got, want) << "prefix caching " << caching;
    const double followed = double(st.spec_draft_prompt_rows) / double(st.prompt_tokens);
    std::printf("[ spec ] off: draft over %.0f %% of prompt tokens, %llu probes, %llu drafts (caching %d)\n",
                100 * followed, (unsigned long long)st.spec_probes, (unsigned long long)st.spec_num_drafts,
                int(caching));
    // The first batch of sequences (speculation starts on) and one prompt or two a probe.
    EXPECT_LT(followed, 0.35) << "prefix caching " << caching;
    EXPECT_GE(st.spec_probes, 2u) << "prefix caching " << caching;
    EXPECT_GT(st.spec_num_drafts, st.spec_probes) << "prefix caching " << caching;
  }
  // With speculation on, the draft follows every prompt (recomputes after preemption count again).
  const auto fast_drafts = [](engine::EngineConfig& ec) {
    ec.spec_step_seconds = [](int k, int, int64_t) { return k > 0 ? 0.5 : 1.0; };
  };
  const std::vector<std::vector<int32_t>> few(prompts.begin(), prompts.begin() + 16);
  const auto got = run_engine(m, draft.get(), sc, few, 0, false, &st, max_tokens_of, fast_drafts);
  EXPECT_EQ(got, std::vector<std::vector<int32_t>>(want.begin(), want.begin() + 16));
  EXPECT_GE(st.spec_draft_prompt_rows, st.prompt_tokens);
  EXPECT_EQ(st.spec_probes, 0u);
}

// The trained draft of the bundled model (models/minimax-m3-tiny-eagle3, when present): greedy
// output still equals plain decoding, and drafts are kept often (the training script measured
// the acceptance it should reach; this checks the engine's passes reach a good part of it).
TEST(Eagle3Draft, TrainedDraftOfTheBundledModel) {
  const std::string root = SIEVE_SOURCE_DIR;
  const std::string draft_dir = root + "/models/minimax-m3-tiny-eagle3";
  if (!fs::exists(draft_dir + "/model.safetensors"))
    GTEST_SKIP() << "no trained draft under " << draft_dir;
  auto m = model::Model::load(root + "/models/minimax-m3-tiny");
  const SpeculativeConfig sc = parse_speculative_config(draft_dir + "/speculative.json");
  auto draft = Eagle3Draft::load(sc.model, m->config(), Device{}, m->input_embedding());
  nlohmann::json g = nlohmann::json::parse(
      std::ifstream(std::string(SIEVE_TEST_DATA_DIR) + "/golden/minimax-m3-tiny/moby_dick.json"));
  const std::vector<int32_t> text = g["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i)
    prompts.emplace_back(text.begin() + 300 * i, text.begin() + 300 * i + 200);
  engine::EngineStats st;
  const auto want = run_engine(*m, nullptr, {}, prompts, 32, false, &st);
  SpeculativeConfig on = sc;
  on.adaptive = false;
  const auto got = run_engine(*m, draft.get(), on, prompts, 32, false, &st);
  EXPECT_EQ(got, want);
  const double length =
      1.0 + double(st.spec_num_accepted_tokens) / double(std::max<uint64_t>(st.spec_num_drafts, 1));
  std::printf("[ spec ] trained draft: mean acceptance length %.2f over %llu drafts\n", length,
              (unsigned long long)st.spec_num_drafts);
  EXPECT_GT(length, 1.5);
}

// The benchmark step (sieve bench step): a verification step and the draft's passes after it run
// as built, with a dummy draft of the target's shape.
TEST(Eagle3Draft, SyntheticVerificationStepRuns) {
  Target t = make_target("synthetic");
  model::Model& m = *t.model;
  const std::string dd = temp_dir("synthetic_draft");
  RandomEagle3Options o;
  o.head_dim = 32;
  o.write_weights = false;
  write_random_eagle3(dd, m.config(), o);
  auto draft = Eagle3Draft::load(dd, m.config(), Device{}, m.input_embedding(), /*dummy=*/true);
  const engine::SyntheticVerification v =
      engine::synthetic_verification(3, 300, 3, m.block_size(), m.vocab_size(), 1);
  m.allocate_caches(
      {.kv_dtype = DType::F32, .index_dtype = DType::F32, .num_blocks = v.blocks_needed});
  draft->allocate_cache(DType::F32, v.blocks_needed, m.block_size(), 512);
  engine::Runner runner(m);
  runner.set_draft(draft.get());
  std::vector<float> logits;
  runner.run(v.verify, logits);
  EXPECT_EQ(logits.size(), size_t(3 * 4 * m.vocab_size()));
  std::vector<std::vector<int32_t>> drafts;
  runner.propose(v.draft, drafts);
  ASSERT_EQ(drafts.size(), 3u);
  for (const auto& d : drafts) {
    ASSERT_EQ(d.size(), 3u);
    for (int32_t tok : d) EXPECT_TRUE(tok >= 0 && tok < m.vocab_size());
  }
}

}  // namespace
}  // namespace sieve::spec
