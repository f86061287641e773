// `sieve make-tiny-model`: a random-weight MiniMax-M3 checkpoint in the published layout, small
// enough for tests and demos, configurable in every dimension the engine cares about.
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "io/tiny_model.h"

#if defined(SIEVE_HAVE_TEXT) && __has_include("text/byte_level.h")
#include "text/byte_level.h"
#define SIEVE_TINY_TOKENIZER 1
#endif

namespace {

int run_make_tiny_model(const std::vector<std::string>& argv) {
  sieve::TinyModelOptions d;  // defaults shown in --help
  sieve::cli::Args a("make-tiny-model", argv);
  a.opt({"--out", "-o"}, "DIR", "output directory (created if needed)")
      .opt({"--seed"}, "S", "random seed; the same options and seed give the same files", "0")
      .opt({"--num-layers"}, "N", "decoder layers", std::to_string(d.num_layers))
      .opt({"--sparse-layers"}, "LIST",
           "sparse (MSA) layers: ids \"1,2,3\", a 0/1 flag per layer, \"all\" or \"none\" "
           "(default: every layer but 0)")
      .opt({"--moe-layers"}, "LIST", "MoE layers, same forms (default: every layer but 0)")
      .opt({"--hidden-size"}, "N", "hidden size", std::to_string(d.hidden_size))
      .opt({"--num-heads"}, "N", "query heads", std::to_string(d.num_heads))
      .opt({"--num-kv-heads"}, "N", "kv heads (= index heads)", std::to_string(d.num_kv_heads))
      .opt({"--head-dim"}, "N", "head dimension", std::to_string(d.head_dim))
      .opt({"--rotary-dim"}, "N", "rotated dimensions per head", std::to_string(d.rotary_dim))
      .opt({"--vocab-size"}, "N", "vocabulary size", std::to_string(d.vocab_size))
      .opt({"--num-experts"}, "N", "routed experts", std::to_string(d.num_experts))
      .opt({"--experts-per-tok"}, "K", "experts chosen per token",
           std::to_string(d.experts_per_tok))
      .opt({"--expert-intermediate"}, "N", "routed expert width",
           std::to_string(d.expert_intermediate))
      .opt({"--shared-intermediate"}, "N", "shared expert width (0 = none)",
           std::to_string(d.shared_intermediate))
      .opt({"--dense-intermediate"}, "N", "dense MLP width", std::to_string(d.dense_intermediate))
      .opt({"--index-dim"}, "N", "indexer head dimension", std::to_string(d.index_dim))
      .opt({"--topk-blocks"}, "K", "blocks kept per query in sparse layers",
           std::to_string(d.topk_blocks))
      .opt({"--init-blocks"}, "N", "forced leading blocks", std::to_string(d.init_blocks))
      .opt({"--local-blocks"}, "N", "forced trailing blocks", std::to_string(d.local_blocks))
      .opt({"--max-position"}, "N", "max_position_embeddings", std::to_string(d.max_position))
      .opt({"--rope-theta"}, "X", "RoPE base", "10000")
      .opt({"--routed-scaling-factor"}, "X", "MoE routed scaling factor", "2")
      .opt({"--dtype-scale", "--weight-scale"}, "X",
           "multiplies the standard deviation of every projection", "1")
      .opt({"--shards"}, "N", "safetensors files (> 1 writes model.safetensors.index.json)", "1")
      .opt({"--bos-token-id"}, "ID",
           "bos id written to the configs (default: none, or the tokenizer's)")
      .opt({"--eos-token-id"}, "IDS",
           "eos id(s), comma separated (default: none, or the tokenizer's)")
      .opt({"--quant"}, "FORMAT",
           "projections as mxfp8 (fp8 e4m3 + E8M0 weight_scale_inv per 1x32) or fp8 (fp8 e4m3 + F32 "
           "weight_scale_inv per 128x128); default BF16")
      .flag({"--mxfp8"}, "the same as --quant mxfp8")
      .flag({"--no-tokenizer"}, "do not write tokenizer files");
  if (!a.parse()) return 0;
  if (!a.has("--out")) throw sieve::Error("sieve make-tiny-model: --out DIR is required");

  auto int_opt = [&](const char* name, long long lo) {
    long long v = a.get_int(name);
    if (v < lo || v > std::numeric_limits<int>::max())
      throw sieve::Error(std::string("sieve make-tiny-model: ") + name + " = " + std::to_string(v) +
                         ", expected >= " + std::to_string(lo));
    return v;
  };
  sieve::TinyModelOptions o;
  long long seed = a.get_int("--seed");
  o.seed = uint64_t(seed);
  o.num_layers = int(int_opt("--num-layers", 1));
  if (a.has("--sparse-layers"))
    o.sparse_layers =
        sieve::parse_layer_list(a.get("--sparse-layers"), o.num_layers, "--sparse-layers");
  if (a.has("--moe-layers"))
    o.moe_layers = sieve::parse_layer_list(a.get("--moe-layers"), o.num_layers, "--moe-layers");
  o.hidden_size = int_opt("--hidden-size", 1);
  o.num_heads = int(int_opt("--num-heads", 1));
  o.num_kv_heads = int(int_opt("--num-kv-heads", 1));
  o.head_dim = int(int_opt("--head-dim", 2));
  o.rotary_dim = int(int_opt("--rotary-dim", 2));
  o.vocab_size = int_opt("--vocab-size", 1);
  o.num_experts = int(int_opt("--num-experts", 1));
  o.experts_per_tok = int(int_opt("--experts-per-tok", 1));
  o.expert_intermediate = int_opt("--expert-intermediate", 1);
  o.shared_intermediate = int_opt("--shared-intermediate", 0);
  o.dense_intermediate = int_opt("--dense-intermediate", 1);
  o.index_dim = int(int_opt("--index-dim", 2));
  o.topk_blocks = int(int_opt("--topk-blocks", 1));
  o.init_blocks = int(int_opt("--init-blocks", 0));
  o.local_blocks = int(int_opt("--local-blocks", 0));
  o.max_position = int_opt("--max-position", 1);
  o.rope_theta = a.get_double("--rope-theta");
  o.routed_scaling_factor = float(a.get_double("--routed-scaling-factor"));
  o.weight_scale = float(a.get_double("--dtype-scale"));
  if (!(o.weight_scale > 0.0f))
    throw sieve::Error("sieve make-tiny-model: --dtype-scale must be > 0");
  o.num_shards = int(int_opt("--shards", 1));
  o.quant = a.get_flag("--mxfp8") ? "mxfp8" : a.get("--quant");
  if (o.quant == "none" || o.quant == "bf16") o.quant.clear();
  if (!o.quant.empty() && o.quant != "mxfp8" && o.quant != "fp8")
    throw sieve::Error("sieve make-tiny-model: --quant " + o.quant + " is not supported (expected mxfp8 or fp8)");
  bool tokenizer = !a.get_flag("--no-tokenizer");
  const std::string out = a.get("--out");

  if (a.has("--bos-token-id")) o.bos_token_id = a.get_int("--bos-token-id");
  if (a.has("--eos-token-id")) {
    std::string s = a.get("--eos-token-id");
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t comma = s.find(',', pos);
      std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      try {
        size_t used = 0;
        long long v = std::stoll(tok, &used);
        if (used != tok.size() || v < 0) throw std::invalid_argument(tok);
        o.eos_token_ids.push_back(v);
      } catch (const std::exception&) {
        throw sieve::Error("sieve make-tiny-model: --eos-token-id: \"" + s +
                           "\" is not a comma-separated list of token ids");
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  for (int64_t id : o.eos_token_ids)
    if (id >= o.vocab_size)
      throw sieve::Error("sieve make-tiny-model: --eos-token-id " + std::to_string(id) +
                         " is outside the vocabulary (" + std::to_string(o.vocab_size) + ")");
  if (o.bos_token_id >= o.vocab_size)
    throw sieve::Error("sieve make-tiny-model: --bos-token-id " + std::to_string(o.bos_token_id) +
                       " is outside the vocabulary (" + std::to_string(o.vocab_size) + ")");

  (void)sieve::tiny_model_config(o);  // invalid options fail before anything is written

#ifdef SIEVE_TINY_TOKENIZER
  // 256 byte tokens plus the chat special tokens (the text library checks they fit the vocab);
  // its bos/eos go into config.json and generation_config.json unless given explicitly.
  if (tokenizer) {
    if (o.vocab_size > std::numeric_limits<int32_t>::max())
      throw sieve::Error("sieve make-tiny-model: --vocab-size is too large for a tokenizer");
    sieve::text::ByteLevelTokenizerInfo info;
    try {
      info = sieve::text::write_byte_level_tokenizer(out, int32_t(o.vocab_size));
    } catch (const sieve::Error& e) {
      throw sieve::Error(std::string(e.what()) + " (--no-tokenizer writes the model alone)");
    }
    if (!a.has("--bos-token-id")) o.bos_token_id = info.bos_id;
    if (!a.has("--eos-token-id")) o.eos_token_ids = {info.eos_id};
  }
#else
  tokenizer = false;  // this build has no text library
#endif
  sieve::write_tiny_model(o, out);
  sieve::ModelConfig c = sieve::tiny_model_config(o);
  int sparse = 0, moe = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    sparse += c.is_sparse_layer(i);
    moe += c.is_moe_layer(i);
  }
  std::printf("wrote %s: %d layers (%d sparse, %d MoE), hidden %lld, vocab %lld, %s%s\n",
              out.c_str(), c.num_hidden_layers, sparse, moe, (long long)c.hidden_size,
              (long long)c.vocab_size, o.quant == "mxfp8" ? "MXFP8" : o.quant == "fp8" ? "FP8 128x128" : "BF16", tokenizer ? ", tokenizer" : "");
  return 0;
}

sieve::cli::Register reg{"make-tiny-model", "write a random-weight MiniMax-M3 checkpoint for tests",
                         &run_make_tiny_model};

}  // namespace
