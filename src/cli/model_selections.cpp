// `sieve eval selections`: what a trained indexer's block selections look like to tiled sparse
// attention. Runs the model on the CPU over a text, recomputes each sparse layer's selections
// from its index queries and cached index keys (at any block size / topk: the tiny model has few
// blocks of 128), and prints their locality (kernels_bench::LocalityStats) and the passes the
// tiled prefill kernel makes over them, with tokens in order and regrouped (TilePassAccum);
// --random does the same for random index queries and keys (the benchmark's inputs), --fit the
// benchmark generator's rule fitted to what was measured.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "cli/command.h"
#include "cli/model_load_flags.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/single_sequence.h"
#include "kernels/bench/selections.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "model/locate.h"
#include "model/model.h"
#ifdef SIEVE_HAVE_TEXT
#include "text/tokenizer.h"
#endif

namespace sieve::cli {
namespace {

using kernels_bench::LocalityStats;
using kernels_bench::TilePassAccum;

struct Shape {
  int block_size = 128, topk = 16, init_blocks = 0, local_blocks = 1, dim = 128;
};

// Top-`topk` blocks of positions [pos0, pos0 + n) of one head, as the indexer chooses them (max
// over a block's causal keys, forced local and init blocks, then the CPU indexer's own top-k and
// tie rule), into out[(pos - pos0) * topk ...]. q: [n, dim] (token stride q_stride), k: [pos0 + n, dim].
void select_rows(const Shape& s, const float* q, int64_t q_stride, const float* k, int pos0, int n, int32_t* out) {
  auto work = [&](int i0, int i1) {
    std::vector<float> score;
    for (int i = i0; i < i1; ++i) {
      const int pos = pos0 + i, n_blk = pos / s.block_size + 1;
      score.assign(size_t(n_blk), -INFINITY);
      const float* qi = q + int64_t(i) * q_stride;
      for (int j = 0; j <= pos; ++j) {
        const float* kj = k + int64_t(j) * s.dim;
        float dot = 0;
        for (int d = 0; d < s.dim; ++d) dot += qi[d] * kj[d];
        float& b = score[size_t(j / s.block_size)];
        b = std::max(b, dot);
      }
      for (int b = 0; b < n_blk; ++b)
        if (b >= n_blk - s.local_blocks) score[size_t(b)] = 2e30f;
        else if (b < s.init_blocks) score[size_t(b)] = 1e30f;
      cpu::select_topk_blocks(score.data(), n_blk, s.topk, out + size_t(i) * s.topk);
    }
  };
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  // Later rows cost more (more keys): interleaved chunks balance the threads.
  for (int w = 0; w < nt; ++w)
    th.emplace_back([&, w] {
      for (int c = w * 16; c < n; c += nt * 16) work(c, std::min(n, c + 16));
    });
  for (auto& t : th) t.join();
}

void print_stats(const char* name, const LocalityStats& s) {
  std::printf("%-22s %7lld %6.2f %6.2f %6.2f  %6.3f  %6.3f  %6.3f ", name, (long long)s.tokens, s.tile_union[0],
              s.tile_union[1], s.tile_union[2], s.shared_prev, s.local_share, s.block0_share);
  for (double d : s.distance) std::printf(" %5.3f", d);
  std::printf("\n");
}

void print_passes_header(int window) {
  std::printf("\ntiled sparse prefill passes (tiles of %d tokens split into two halves the way with the fewest "
              "(half, block) passes, as the TP4 kernel does; / 2 topk):\n",
              kernels_bench::kPassTile);
  std::printf("%-22s %7s %12s %12s\n", "selections", "tiles", "consecutive",
              ("regrouped " + std::to_string(window)).c_str());
}

void print_passes(const char* name, const TilePassAccum& p) {
  std::printf("%-22s %7lld %12.3f %12.3f\n", name, (long long)p.tiles(), p.passes(), p.regrouped_passes());
}

void print_header(const Shape& s, int tokens) {
  std::printf("blocks of %d, topk %d, %d local, %d tokens; union = distinct blocks of a tile / topk\n",
              s.block_size, s.topk, s.local_blocks, tokens);
  std::printf("%-22s %7s %6s %6s %6s  %6s  %6s  %6s  %s\n", "selections", "tokens", "u8", "u16", "u64", "prev",
              "local", "blk0", "non-local picks by distance: 1 2-3 4-7 8-15 16-31 32+");
}

int run_selections(const std::vector<std::string>& argv) {
  Args a("eval selections", argv);
  a.opt({"--model"}, "DIR", "model directory (default: the bundled model)")
      .opt({"--file"}, "TEXT", "text to run (default: data/heldout/heldout.txt)")
      .opt({"--tokens"}, "N", "tokens of the text to run", "8192")
      .opt({"--block-size"}, "N", "block size of the recomputed selections (default: the model's)")
      .opt({"--topk"}, "N", "blocks selected per token (default: the model's keys per token / block size)")
      .opt({"--prefill-chunk"}, "N", "prefill in chunks of N tokens", "2048")
      .opt({"--seed"}, "N", "seed of --random and --fit", "1")
      .opt({"--regroup-window"}, "N",
           "the passes table's regrouping: tokens regrouped into tiles within aligned windows of N", "512")
      .flag({"--random"}, "random index queries and keys instead of the model (the benchmark's inputs)")
      .flag({"--fit"}, "also fit the benchmark generator's rule at its shape (blocks of 128, topk 16)");
  add_model_load_flags(a);
  add_parallel_flags(a);
  if (!a.parse()) return 0;
  const int tokens = int(a.get_int("--tokens"));
  if (tokens < 64) throw Error("--tokens must be at least 64");
  const uint64_t seed = uint64_t(a.get_int("--seed"));
  const int window = int(a.get_int("--regroup-window"));
  if (window < kernels_bench::kPassTile)
    throw Error("--regroup-window must be at least " + std::to_string(kernels_bench::kPassTile));
  std::vector<kernels_bench::LocalityAccum> per_layer;
  kernels_bench::LocalityAccum all;
  Shape s;
  auto set_shape = [&](int model_block, int model_topk) {
    s.block_size = a.has("--block-size") ? int(a.get_int("--block-size")) : model_block;
    if (s.block_size < 1) throw Error("--block-size must be >= 1");
    s.topk = a.has("--topk") ? int(a.get_int("--topk")) : std::max(1, model_topk * model_block / s.block_size);
    if (s.topk < s.local_blocks + s.init_blocks) throw Error("--topk must exceed the forced blocks");
    if ((tokens - 1) / s.block_size + 1 <= s.topk)
      throw Error("--tokens: no token has more than topk (" + std::to_string(s.topk) +
                  ") blocks to choose from; give more tokens, a smaller --block-size or --topk");
  };

  if (a.get_flag("--random")) {
    set_shape(128, 16);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> nd(-1.f, 1.f);  // the benchmark's fill: uniform on [-1, 1)
    std::vector<float> q(size_t(tokens) * s.dim), k(q.size());
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    std::vector<int32_t> ids(size_t(tokens) * s.topk);
    select_rows(s, q.data(), s.dim, k.data(), 0, tokens, ids.data());
    all.add_rows(ids.data(), tokens, s.topk, 0, s.block_size, s.local_blocks);
    print_header(s, tokens);
    print_stats("random q/k", all.result());
    TilePassAccum passes;
    passes.add_rows(ids.data(), tokens, s.topk, 0, s.block_size, window);
    print_passes_header(window);
    print_passes("random q/k", passes);
  } else {
#ifndef SIEVE_HAVE_TEXT
    throw Error("eval selections needs the tokenizer, which this build lacks (or use --random)");
#else
    std::string dir = a.get("--model");
    if (dir.empty()) dir = model::bundled_model_dir(SIEVE_SOURCE_DIR);
    if (dir.empty()) throw Error("--model: no model directory given and no bundled model under models/");
    std::string path = a.has("--file") ? a.get("--file") : std::string(SIEVE_SOURCE_DIR) + "/data/heldout/heldout.txt";
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("--file: cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    const auto group = load_model_group(dir, a);
    if (follow_node_zero(*group)) return 0;
    const ModelConfig& cfg = group->model().config();
    if (!cfg.use_sparse_attention) throw Error("--model: " + dir + " has no sparse layers");
    s.init_blocks = cfg.sparse_init_block, s.local_blocks = cfg.sparse_local_block, s.dim = cfg.sparse_index_dim;
    set_shape(cfg.sparse_block_size, cfg.sparse_topk_blocks);
    std::vector<int32_t> ids = text::Tokenizer::load(dir).encode(ss.str(), false);
    if (int(ids.size()) < tokens) throw Error("--file: " + path + " has fewer than --tokens tokens");
    ids.resize(size_t(tokens));
    // One selection array per (index layer, head): the tap sees the index layers in order each step.
    const int heads = cfg.sparse_num_index_heads;
    int layers = 0;
    for (int l = 0; l < cfg.num_hidden_layers; ++l) layers += cfg.is_sparse_layer(l) && !cfg.shares_index_topk(l);
    std::vector<std::vector<int32_t>> sel(size_t(layers * heads), std::vector<int32_t>(size_t(tokens) * s.topk));
    int64_t calls = 0, same = 0, compared = 0;
    ops::set_indexer_tap([&](const ops::IndexerParams& p) {
      const ops::BatchView& b = p.batch;
      SIEVE_CHECK(b.num_seqs == 1, "eval selections: one sequence a step");
      const int layer = int(calls++ % layers), qlen = b.query_start_loc[1] - b.query_start_loc[0];
      const int len = b.seq_lens[0], pos0 = len - qlen, bs = p.cache.block_size;
      std::vector<float> k(size_t(len) * s.dim), q(size_t(qlen) * s.dim);
      for (int j = 0; j < len; ++j) {
        const int64_t blk = b.block_tables[j / bs];
        for (int d = 0; d < s.dim; ++d)
          k[size_t(j) * s.dim + d] = load_as_f32(p.cache.k, p.cache.dtype, size_t((blk * bs + j % bs) * s.dim + d));
      }
      for (int h = 0; h < p.num_index_heads; ++h) {
        for (int i = 0; i < qlen; ++i)
          for (int d = 0; d < s.dim; ++d)
            q[size_t(i) * s.dim + d] = load_as_f32(p.index_q, p.q_dtype, size_t(i * p.q_stride + h * s.dim + d));
        int32_t* out = sel[size_t(layer * heads + h)].data() + size_t(pos0) * s.topk;
        select_rows(s, q.data(), s.dim, k.data(), pos0, qlen, out);
        if (s.block_size != bs || s.topk != p.topk) continue;
        // At the model's own shape: the recomputed selection against the model's (as sets).
        for (int i = 0; i < qlen; ++i) {
          std::vector<int32_t> x(out + size_t(i) * s.topk, out + size_t(i + 1) * s.topk);
          std::vector<int32_t> y(p.topk_idx + (size_t(i) * p.num_index_heads + h) * p.topk,
                                 p.topk_idx + (size_t(i) * p.num_index_heads + h + 1) * p.topk);
          std::sort(x.begin(), x.end()), std::sort(y.begin(), y.end());
          same += x == y, ++compared;
        }
      }
    });
    model::CacheOptions co = model::cache_options_from_flags("auto", "auto");
    engine::SingleSequence seq(group->leader(), co, tokens);
    seq.append(ids, false, a.get_int("--prefill-chunk"));
    ops::set_indexer_tap(nullptr);
    if (calls == 0) throw Error("--device: eval selections reads the CPU backend's selections; pass --device cpu");
    print_header(s, tokens);
    std::vector<TilePassAccum> passes(size_t(layers) + 1);
    for (int l = 0; l < layers; ++l) {
      kernels_bench::LocalityAccum acc;
      for (int h = 0; h < heads; ++h) {
        const auto& v = sel[size_t(l * heads + h)];
        acc.add_rows(v.data(), tokens, s.topk, 0, s.block_size, s.local_blocks);
        all.add_rows(v.data(), tokens, s.topk, 0, s.block_size, s.local_blocks);
        passes[size_t(l)].add_rows(v.data(), tokens, s.topk, 0, s.block_size, window);
      }
      passes[size_t(layers)].merge(passes[size_t(l)]);
      print_stats(("index layer " + std::to_string(l)).c_str(), acc.result());
    }
    print_stats("all layers", all.result());
    print_passes_header(window);
    for (int l = 0; l <= layers; ++l)
      print_passes(l < layers ? ("index layer " + std::to_string(l)).c_str() : "all layers", passes[size_t(l)]);
    if (compared)
      std::printf("recomputed = the model's selection on %.4f of %lld rows\n", double(same) / double(compared),
                  (long long)compared);
#endif
  }
  if (a.get_flag("--fit")) {
    const LocalityStats m = all.result();
    const double sink = std::min(1.0, m.block0_share * (s.topk - s.local_blocks));
    const auto rule = kernels_bench::fit_trained_like(m, sink, 16, 128, 1, 0, 8192, seed);
    std::printf("fitted rule at blocks of 128, topk 16, 8192 tokens: keep %.2f recency %.2f sink %.2f\n", rule.keep,
                rule.recency, rule.sink);
    std::vector<int32_t> g(size_t(8192) * 16);
    kernels_bench::generate_selections(rule, 16, 128, 1, 0, 8192, seed, g.data());
    print_stats("generated (fitted)", kernels_bench::locality(g.data(), 8192, 16, 0, 128, 1));
    kernels_bench::generate_selections(kernels_bench::trained_like(), 16, 128, 1, 0, 8192, seed, g.data());
    print_stats("generated (bench)", kernels_bench::locality(g.data(), 8192, 16, 0, 128, 1));
    TilePassAccum passes;
    passes.add_rows(g.data(), 8192, 16, 0, 128, window);
    print_passes_header(window);
    print_passes("generated (bench)", passes);
  }
  return 0;
}

Register reg{"eval selections", "locality of the sparse layers' block selections (tiled attention's view)",
             &run_selections};

}  // namespace
}  // namespace sieve::cli
