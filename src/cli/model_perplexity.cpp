// `sieve eval perplexity`: mean negative log-likelihood of a text over windows of the full
// context length, through the engine's paged (chunked) prefill path.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "cli/model_load_flags.h"
#include "core/error.h"
#include "model/locate.h"
#include "model/model.h"
#include "engine/single_sequence.h"
#ifdef SIEVE_HAVE_TEXT
#include "text/tokenizer.h"
#endif

namespace sieve::cli {
namespace {

int run_perplexity(const std::vector<std::string>& argv) {
  Args a("eval perplexity", argv);
  a.opt({"--model"}, "DIR", "model directory (default: the bundled model)")
      .opt({"--file"}, "TEXT", "text file to score")
      .opt({"--max-model-len"}, "N", "window length in tokens (default: the model's context)")
      .opt({"--prefill-chunk"}, "N", "prefill each window in chunks of N tokens", "2048")
      .opt({"--kv-cache-dtype", "--kv_cache_dtype"}, "DTYPE", "auto, bf16, fp8 or fp32", "auto")
      .opt({"--index-cache-dtype", "--index_cache_dtype"}, "DTYPE",
           "auto, bf16, fp8 or fp32 (default: the kv cache dtype)")
      .opt({"--max-windows"}, "N", "score at most N windows; 0 = all", "0")
      .opt({"--compare-index-dtype"}, "DTYPE",
           "also select blocks from index keys stored in DTYPE and report how often the selections agree")
      .flag({"--dense"}, "select every block in sparse layers")
      .flag({"--json"}, "print one JSON object");
  add_model_load_flags(a);
  add_parallel_flags(a);
  if (!a.parse()) return 0;
#ifndef SIEVE_HAVE_TEXT
  throw Error("eval perplexity needs the tokenizer, which this build lacks");
#else
  std::string dir = a.get("--model");
  if (dir.empty()) dir = model::bundled_model_dir(SIEVE_SOURCE_DIR);
  if (dir.empty()) throw Error("--model: no model directory given and no bundled model under models/");
  if (!a.has("--file")) throw Error("--file: give the text to score");
  std::ifstream f(a.get("--file"), std::ios::binary);
  if (!f) throw Error("--file: cannot read " + a.get("--file"));
  std::stringstream ss;
  ss << f.rdbuf();

  const auto group = load_model_group(dir, a);
  if (follow_node_zero(*group)) return 0;
  engine::Runner& runner = group->leader();
  model::Model* m = &group->model();
  const ModelConfig& cfg = m->config();
  text::Tokenizer tok = text::Tokenizer::load(dir);
  std::vector<int32_t> ids = tok.encode(ss.str(), false);

  long long window = a.has("--max-model-len") ? a.get_int("--max-model-len") : cfg.max_position_embeddings;
  if (window < 2) throw Error("--max-model-len must be at least 2");
  window = std::min<long long>(window, (long long)ids.size());
  if (window < 2) throw Error("--file: the text has fewer than 2 tokens");
  const long long chunk = a.get_int("--prefill-chunk");
  if (chunk < 1) throw Error("--prefill-chunk must be >= 1");

  model::CacheOptions co =
      model::cache_options_from_flags(a.get("--kv-cache-dtype"), a.get("--index-cache-dtype"));
  co.dense = a.get_flag("--dense");
  if (a.has("--compare-index-dtype")) {
    co.compare_index = true;
    co.compare_index_dtype = model::parse_cache_dtype(a.get("--compare-index-dtype"), "--compare-index-dtype");
  }
  engine::SingleSequence seq(runner, co, window);

  const long long max_windows = a.get_int("--max-windows");
  double nll = 0;
  long long count = 0, windows = 0;
  const int64_t V = cfg.vocab_size;
  for (size_t w0 = 0; w0 + 1 < ids.size(); w0 += size_t(window)) {
    if (max_windows > 0 && windows >= max_windows) break;
    const size_t wlen = std::min(size_t(window), ids.size() - w0);
    if (wlen < 2) break;
    ++windows;
    seq.reset();
    std::vector<int32_t> ids_w(ids.begin() + w0, ids.begin() + w0 + wlen);
    std::vector<float> logits = seq.append(ids_w, true, chunk);
    for (size_t i = 0; i + 1 < wlen; ++i) {
      const float* row = logits.data() + i * V;
      double mx = -INFINITY;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
      nll += mx + std::log(z) - double(row[ids_w[i + 1]]);
      ++count;
    }
  }
  const double mean = nll / double(count);
  const model::SelectionStats st = m->selection_stats();
  const double agree = st.selected ? double(st.agreed) / double(st.selected) : 1.0;
  const double same = st.dropping_rows ? double(st.identical_rows) / double(st.dropping_rows) : 1.0;
  if (a.get_flag("--json")) {
    std::printf("{\"tokens\": %lld, \"windows\": %lld, \"mean_nll\": %.6f, \"perplexity\": %.4f",
                count, windows, mean, std::exp(mean));
    if (co.compare_index)
      std::printf(", \"selection_rows\": %lld, \"dropping_rows\": %lld, \"block_agreement\": %.6f, "
                  "\"identical_rows\": %.6f",
                  (long long)st.rows, (long long)st.dropping_rows, agree, same);
    std::printf("}\n");
  } else {
    if (co.compare_index)
      std::printf("selection vs %s index keys: %.4f of selected blocks agree; %.4f of %lld rows that drop "
                  "blocks select the same set\n",
                  a.get("--compare-index-dtype").c_str(), agree, same, (long long)st.dropping_rows);
    std::printf("tokens scored: %lld (%lld windows of up to %lld)\n", count, windows, window);
    std::printf("mean nll: %.6f\n", mean);
    std::printf("perplexity: %.4f\n", std::exp(mean));
  }
  return 0;
#endif
}

Register reg{"eval perplexity", "perplexity of a text file through the paged prefill path", &run_perplexity};

}  // namespace
}  // namespace sieve::cli
