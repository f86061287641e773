// `sieve make-tiny-draft`: a random-weight EAGLE3 draft in the published layout for a target
// model (tests, demos, and the draft of --load-format dummy benchmarks).
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "io/config.h"
#include "model/locate.h"
#include "spec/eagle3.h"

namespace {

std::vector<int> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      const int v = std::stoi(item, &pos);
      if (pos != item.size()) throw std::invalid_argument("");
      out.push_back(v);
    } catch (const std::exception&) {
      throw sieve::Error(flag + ": \"" + item + "\" is not a layer number");
    }
  }
  return out;
}

int run_make_tiny_draft(const std::vector<std::string>& argv) {
  sieve::spec::RandomEagle3Options d;
  sieve::cli::Args a("make-tiny-draft", argv);
  a.opt({"--model"}, "DIR", "target model directory (default: the bundled model)")
      .opt({"--out", "-o"}, "DIR", "output directory (created if needed)")
      .opt({"--seed"}, "S", "random seed", "0")
      .opt({"--hidden-size"}, "N", "draft hidden size (default: the target's)")
      .opt({"--intermediate-size"}, "N", "MLP width (default: 2 x hidden)")
      .opt({"--num-heads"}, "N", "query heads", std::to_string(d.num_heads))
      .opt({"--num-kv-heads"}, "N", "kv heads", std::to_string(d.num_kv_heads))
      .opt({"--head-dim"}, "N", "head dimension", std::to_string(d.head_dim))
      .opt({"--draft-vocab-size"}, "N", "draft vocabulary (default: the target's)")
      .opt({"--aux-layers"}, "LIST", "target layers feeding fc, e.g. 1,3,4 (default: 2, n/2, n-3)")
      .opt({"--weight-scale"}, "X", "multiplies every projection's standard deviation", "1")
      .flag({"--share-embedding"}, "write no embed_tokens (the target's is used)")
      .flag({"--config-only"}, "write config.json only (for --load-format dummy)");
  if (!a.parse()) return 0;
  if (!a.has("--out")) throw sieve::Error("--out is required");
  std::string dir = a.get("--model");
  if (dir.empty()) dir = sieve::model::bundled_model_dir(SIEVE_SOURCE_DIR);
  if (dir.empty())
    throw sieve::Error("--model: no target given and no bundled model under models/");
  const sieve::ModelConfig target = sieve::load_model_config(dir);
  d.seed = uint64_t(a.get_int("--seed"));
  if (a.has("--hidden-size")) d.hidden_size = a.get_int("--hidden-size");
  if (a.has("--intermediate-size")) d.intermediate_size = a.get_int("--intermediate-size");
  d.num_heads = int(a.get_int("--num-heads"));
  d.num_kv_heads = int(a.get_int("--num-kv-heads"));
  d.head_dim = int(a.get_int("--head-dim"));
  if (a.has("--draft-vocab-size")) d.draft_vocab_size = a.get_int("--draft-vocab-size");
  if (a.has("--aux-layers")) d.aux_layers = parse_int_list(a.get("--aux-layers"), "--aux-layers");
  d.weight_scale = float(a.get_double("--weight-scale"));
  d.own_embedding = !a.get_flag("--share-embedding");
  d.write_weights = !a.get_flag("--config-only");
  sieve::spec::write_random_eagle3(a.get("--out"), target, d);
  // Read back: the same checks serve applies.
  sieve::spec::load_eagle3_config(a.get("--out"), target);
  std::printf("wrote %s\n", a.get("--out").c_str());
  return 0;
}

sieve::cli::Register reg{"make-tiny-draft", "write a random-weight EAGLE3 draft for a target model",
                         &run_make_tiny_draft};

}  // namespace
