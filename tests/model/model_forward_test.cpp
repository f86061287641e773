// The engine's paged path (chunked prefill over a cached prefix, then decode, block tables with
// shuffled physical blocks) against the plain full-sequence reference in reference_forward.cpp,
// on tiny random models whose sparse layers keep 2 of up to 8 blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "engine/runner.h"
#include "io/config.h"
#include "io/tiny_model.h"
#include "model/model.h"
#include "reference_forward.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("sieve_model_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<int32_t> random_ids(int n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = d(rng);
  return ids;
}

// Runs the sequence through the engine: prefill of the first `prefill` tokens in chunks of
// `chunk`, then one decode step per remaining token. Returns logits for every position.
std::vector<float> engine_logits(engine::Runner& r, const std::vector<int32_t>& ids, int prefill,
                                 int chunk, uint64_t seed) {
  model::Model& m = r.model();
  const int bs = m.block_size();
  const int T = int(ids.size());
  const int blocks = (T + bs - 1) / bs;
  const int64_t V = m.vocab_size();
  // Physical blocks: a random subset of a larger pool, in random order.
  const int pool = int(m.cache_options().num_blocks);
  std::vector<int32_t> phys(pool);
  for (int i = 0; i < pool; ++i) phys[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(phys.begin(), phys.end(), rng);
  const int max_blocks = blocks + 3;  // wider than needed, as the runner's tables are
  std::vector<int32_t> table(max_blocks, 0);
  for (int b = 0; b < blocks; ++b) table[b] = phys[b];

  std::vector<float> out(size_t(T) * V, NAN);
  auto run = [&](int begin, int end) {
    engine::StepInputs in;
    for (int p = begin; p < end; ++p) {
      in.token_ids.push_back(ids[p]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(int64_t(table[p / bs]) * bs + p % bs);
      in.logits_indices.push_back(p - begin);
    }
    in.query_start_loc = {0, end - begin};
    in.seq_lens = {end};
    in.block_tables = table;
    in.max_blocks_per_seq = max_blocks;
    std::vector<float> logits;
    r.run(in, logits);
    std::copy(logits.begin(), logits.end(), out.begin() + size_t(begin) * V);
  };
  for (int at = 0; at < prefill; at += chunk) run(at, std::min(prefill, at + chunk));
  for (int p = prefill; p < T; ++p) run(p, p + 1);
  return out;
}

struct Case {
  std::string name;
  TinyModelOptions opts;
  std::string overrides;
  int length;
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, size_t begin, size_t end) {
  double d = 0;
  for (size_t i = begin; i < end; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  }
  return d;
}

void check_case(const Case& c) {
  std::string dir = temp_dir(c.name);
  write_tiny_model(c.opts, dir);
  model::LoadOptions lo;
  lo.hf_overrides = c.overrides;
  auto m = model::Model::load(dir, lo);
  engine::Runner runner(*m);
  const ModelConfig& cfg = m->config();
  const auto ids = random_ids(c.length, cfg.vocab_size, c.opts.seed + 17);
  const int64_t V = cfg.vocab_size;

  // Sanity: the sequence is long enough that selection drops blocks.
  ASSERT_GT((c.length + 127) / 128, cfg.sparse_topk_blocks) << c.name;

  std::vector<float> ref_f32;
  for (DType dt : {DType::F32, DType::BF16, DType::FP8_E4M3}) {
    testing::ReferenceOptions ro;
    ro.kv_dtype = ro.index_dtype = dt;
    std::vector<float> ref = testing::reference_logits(dir, cfg, ids, ro);
    if (dt == DType::F32) ref_f32 = ref;
    // The cache dtype must matter, or the comparison below would not test its rounding.
    else EXPECT_GT(max_abs_diff(ref, ref_f32, 0, ref.size()), 1e-3) << dtype_name(dt);
    double scale = 0;
    for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
    ASSERT_GT(scale, 0.5) << "logits too small to test anything";
    const double tol = dt == DType::F32 ? 1e-4 : dt == DType::BF16 ? 5e-3 : 1e-2;

    model::CacheOptions co;
    co.kv_dtype = co.index_dtype = dt;
    co.num_blocks = (c.length + 127) / 128 + 5;
    m->allocate_caches(co);
    int seed = 0;
    for (int chunk : {c.length, 128, 97}) {
      const int decode = 5;
      const int prefill = c.length - decode;
      std::vector<float> got = engine_logits(runner, ids, prefill, chunk, uint64_t(++seed));
      double d = max_abs_diff(got, ref, 0, got.size());
      std::printf("[ diff ] %s %s chunk %d: max abs diff %.3g (scale %.3g)\n", c.name.c_str(), std::string(dtype_name(dt)).c_str(), chunk, d, scale);
      EXPECT_LT(d, tol) << c.name << " cache " << dtype_name(dt) << " chunk " << chunk
                        << " (logit scale " << scale << ")";
      // The decode steps are compared too (they are part of `got`); spot-check that they exist.
      EXPECT_FALSE(std::isnan(got[size_t(c.length - 1) * V]));
    }
  }
  fs::remove_all(dir);
}

TEST(ModelForward, M3LayoutMatchesReference) {
  Case c;
  c.name = "m3";
  c.opts.seed = 11;
  c.length = 700;
  check_case(c);
}

TEST(ModelForward, UnusualLayoutMatchesReference) {
  // MoE on a dense-attention layer, a dense MLP on a sparse layer, an init block, two local
  // blocks, no shared expert, GQA group of 3.
  Case c;
  c.name = "unusual";
  c.opts.seed = 23;
  c.opts.num_layers = 4;
  c.opts.sparse_layers = {0, 1, 1, 0};
  c.opts.moe_layers = {1, 0, 1, 1};
  c.opts.num_heads = 6;
  c.opts.num_kv_heads = 2;
  c.opts.init_blocks = 1;
  c.opts.local_blocks = 2;
  c.opts.topk_blocks = 4;
  c.opts.shared_intermediate = 0;
  c.length = 900;
  check_case(c);
}

TEST(ModelForward, IndexSharingMatchesReference) {
  Case c;
  c.name = "sharing";
  c.opts.seed = 31;
  c.opts.num_layers = 5;
  c.overrides = R"({"use_index_cache": true, "index_topk_freq": 2})";
  c.length = 520;
  check_case(c);
}

TEST(ModelForward, Mxfp8CheckpointMatchesReference) {
  Case c;
  c.name = "mxfp8";
  c.opts.seed = 41;
  c.opts.quant = "mxfp8";
  c.opts.num_shards = 2;
  c.length = 300;
  check_case(c);
}

TEST(ModelForward, BlockFp8CheckpointMatchesReference) {
  Case c;
  c.name = "fp8";
  c.opts.seed = 43;
  c.opts.quant = "fp8";
  c.opts.hidden_size = 160;  // partial 128-column blocks
  c.length = 300;
  check_case(c);
}

TEST(ModelForward, DenseOptionSelectsEveryBlock) {
  std::string dir = temp_dir("dense");
  TinyModelOptions o;
  o.seed = 5;
  write_tiny_model(o, dir);
  auto m = model::Model::load(dir);
  const auto ids = random_ids(400, m->vocab_size(), 99);
  testing::ReferenceOptions ro;
  ro.dense = true;
  auto ref = testing::reference_logits(dir, m->config(), ids, ro);
  model::CacheOptions co;
  co.kv_dtype = co.index_dtype = DType::F32;
  co.num_blocks = 8;
  co.dense = true;
  m->allocate_caches(co);
  engine::Runner runner(*m);
  auto got = engine_logits(runner, ids, 390, 150, 3);
  EXPECT_LT(max_abs_diff(got, ref, 0, got.size()), 2e-3);
  // And sparse selection really changes the result on this prompt.
  testing::ReferenceOptions sparse;
  auto ref_sparse = testing::reference_logits(dir, m->config(), ids, sparse);
  EXPECT_GT(max_abs_diff(ref_sparse, ref, 0, ref.size()), 1e-2);
  fs::remove_all(dir);
}

// Three sequences prefilled one by one, then decoded together. The decode step padded as the
// CUDA graphs pad it (more sequences, wider tables, a padding block) gives the same logits for
// the real rows, and the padding rows are well-formed.
TEST(ModelForward, PaddedDecodeStepKeepsItsRows) {
  std::string dir = temp_dir("padded");
  TinyModelOptions o;
  o.seed = 7;
  write_tiny_model(o, dir);
  auto m = model::Model::load(dir);
  engine::Runner runner(*m);
  const int bs = m->block_size();
  const int64_t V = m->vocab_size();
  model::CacheOptions co;
  co.kv_dtype = co.index_dtype = DType::BF16;
  co.num_blocks = 12;
  m->allocate_caches(co);
  // Lengths 60, 200, 300 in blocks unlike their logical order; block 11 stays free (padding).
  const std::vector<int> lens = {60, 2 * bs - 56, 2 * bs + 44};
  const std::vector<std::vector<int32_t>> tables = {{9}, {3, 7}, {10, 1, 5}};
  std::vector<float> logits;
  std::vector<int32_t> next;
  for (size_t s = 0; s < lens.size(); ++s) {
    engine::StepInputs in;
    in.token_ids = random_ids(lens[s], V, 50 + s);
    for (int p = 0; p < lens[s]; ++p) {
      in.positions.push_back(p);
      in.slot_mapping.push_back(int64_t(tables[s][size_t(p / bs)]) * bs + p % bs);
    }
    in.query_start_loc = {0, lens[s]};
    in.seq_lens = {lens[s]};
    in.block_tables = tables[s];
    in.max_blocks_per_seq = int(tables[s].size());
    in.logits_indices = {lens[s] - 1};
    runner.run(in, logits);
    next.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  engine::StepInputs dec;
  dec.max_blocks_per_seq = 4;  // wider than any sequence needs, as the runner's tables can be
  dec.block_tables.assign(lens.size() * 4, 0);
  dec.query_start_loc = {0};
  for (size_t s = 0; s < lens.size(); ++s) {
    dec.token_ids.push_back(next[s]);
    dec.positions.push_back(lens[s]);
    dec.slot_mapping.push_back(int64_t(tables[s][size_t(lens[s] / bs)]) * bs + lens[s] % bs);
    dec.query_start_loc.push_back(int32_t(s + 1));
    dec.seq_lens.push_back(lens[s] + 1);
    std::copy(tables[s].begin(), tables[s].end(), dec.block_tables.begin() + long(s * 4));
    dec.logits_indices.push_back(int32_t(s));
  }
  std::vector<float> plain;
  runner.run(dec, plain);

  const engine::StepInputs pad = engine::pad_decode_step(dec, 8, 6, 11, bs);
  ASSERT_EQ(pad.token_ids.size(), 8u);
  ASSERT_EQ(pad.query_start_loc.size(), 9u);
  EXPECT_EQ(pad.query_start_loc[8], 8);
  EXPECT_EQ(pad.max_blocks_per_seq, 6);
  ASSERT_EQ(pad.block_tables.size(), 48u);
  for (size_t s = 0; s < 8; ++s) {
    const size_t blocks = s < lens.size() ? tables[s].size() : 1;
    for (size_t b = 0; b < 6; ++b) {
      const int32_t want = s < lens.size() && b < blocks ? tables[s][b] : 11;
      EXPECT_EQ(pad.block_tables[s * 6 + b], want) << "row " << s << " block " << b;
    }
    if (s >= lens.size()) {
      EXPECT_EQ(pad.seq_lens[s], 1);
      EXPECT_EQ(pad.positions[s], 0);
      EXPECT_EQ(pad.slot_mapping[s], 11 * bs);
    }
    EXPECT_EQ(pad.logits_indices[s], int32_t(s));
  }
  std::vector<float> padded;
  runner.run(pad, padded);
  ASSERT_EQ(padded.size(), size_t(8 * V));
  EXPECT_LE(max_abs_diff(padded, plain, 0, plain.size()), 1e-5);
  for (size_t i = plain.size(); i < padded.size(); ++i) ASSERT_TRUE(std::isfinite(padded[i])) << i;
  EXPECT_THROW(engine::pad_decode_step(dec, 2, 6, 11, bs), Error);  // fewer rows than sequences
  EXPECT_THROW(engine::pad_decode_step(dec, 4, 2, 11, bs), Error);  // a table too narrow
  fs::remove_all(dir);
}

TEST(ModelForward, BadStepInputsAreErrors) {
  std::string dir = temp_dir("bad");
  TinyModelOptions o;
  write_tiny_model(o, dir);
  auto m = model::Model::load(dir);
  engine::Runner runner(*m);
  model::CacheOptions co;
  co.num_blocks = 2;
  m->allocate_caches(co);
  engine::StepInputs in;
  in.token_ids = {int32_t(m->vocab_size())};  // outside the vocabulary
  in.positions = {0};
  in.slot_mapping = {0};
  in.query_start_loc = {0, 1};
  in.seq_lens = {1};
  in.block_tables = {0};
  in.max_blocks_per_seq = 1;
  in.logits_indices = {0};
  std::vector<float> logits;
  EXPECT_THROW(runner.run(in, logits), Error);
  in.token_ids = {1};
  in.block_tables = {7};  // outside the cache
  EXPECT_THROW(runner.run(in, logits), Error);
  fs::remove_all(dir);
}

TEST(ModelLoad, MissingTensorIsNamed) {
  std::string dir = temp_dir("missing");
  TinyModelOptions o;
  write_tiny_model(o, dir);
  fs::remove(fs::path(dir) / "model.safetensors");
  try {
    model::Model::load(dir);
    FAIL() << "loading a directory without weights must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("safetensors"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sieve
