// `sieve generate`: one prompt through the paged prefill + decode path of the model, on the CPU
// reference backend or on CUDA (--device; `auto` takes the GPU when the build and machine have one).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_load_flags.h"
#include "core/error.h"
#include "model/locate.h"
#include "model/model.h"
#include "engine/engine.h"
#include "engine/single_sequence.h"
#include "spec/config.h"
#include "spec/eagle3.h"
#ifdef SIEVE_HAVE_TEXT
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#endif

namespace sieve::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t pos = 0;
      long long v = std::stoll(item, &pos);
      if (pos != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      throw Error(flag + ": \"" + item + "\" is not a token id (expected comma-separated integers >= 0)");
    }
  }
  return ids;
}

struct Choice {
  int32_t id;
  double logprob;                                   // natural log, full softmax, temperature 1
  std::vector<std::pair<int32_t, double>> top;      // top-k logprobs
};

Choice sample(const float* logits, int64_t V, double temperature, double top_p, int top_k,
              int n_logprobs, std::mt19937_64& rng) {
  // log-softmax of the raw logits (temperature 1), in double.
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  int32_t chosen = 0;
  if (temperature <= 0) {
    for (int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[chosen]) chosen = int32_t(i);  // ties: lowest id
  } else {
    std::vector<int32_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = int32_t(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    int64_t keep = V;
    if (top_k > 0) keep = std::min<int64_t>(keep, top_k);
    std::vector<double> p(keep);
    double z = 0;
    for (int64_t i = 0; i < keep; ++i) z += p[i] = std::exp((double(logits[order[i]]) - mx) / temperature);
    if (top_p < 1.0) {
      double acc = 0;
      int64_t cut = keep;
      for (int64_t i = 0; i < keep; ++i) {
        acc += p[i] / z;
        if (acc >= top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
      z = 0;
      for (int64_t i = 0; i < keep; ++i) z += p[i];
    }
    double u = std::uniform_real_distribution<double>(0.0, z)(rng);
    chosen = order[keep - 1];
    for (int64_t i = 0; i < keep; ++i) {
      u -= p[i];
      if (u < 0) {
        chosen = order[i];
        break;
      }
    }
  }
  Choice c{chosen, double(logits[chosen]) - lse, {}};
  if (n_logprobs > 0) {
    std::vector<int32_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = int32_t(i);
    int64_t k = std::min<int64_t>(n_logprobs, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int64_t i = 0; i < k; ++i) c.top.push_back({order[i], double(logits[order[i]]) - lse});
  }
  return c;
}

struct SpecRun {
  std::vector<engine::TokenOutput> tokens;
  engine::EngineStats stats;
};

// One request through an engine over `runner` with speculative decoding (`sieve generate`).
SpecRun generate_speculative(engine::Runner& runner, model::CacheOptions co, const spec::SpeculativeConfig& sc,
                             const std::vector<int32_t>& prompt, const engine::SamplingParams& sp,
                             const std::vector<int32_t>& eos) {
  model::Model& m = runner.model();
  std::unique_ptr<spec::Eagle3Draft> draft;
  if (sc.method == spec::Method::Eagle3) {
    runner.check_draft_allowed();
    draft = spec::Eagle3Draft::load(sc.model, m.config(), m.device(), m.input_embedding());
    runner.set_draft(draft.get());
  }
  const int bs = m.block_size();
  const int64_t len = int64_t(prompt.size()) + sp.max_tokens + sc.num_speculative_tokens + 1;
  co.num_blocks = (len + bs - 1) / bs + 1;
  runner.allocate_caches(co);
  if (draft) draft->allocate_cache(co.kv_dtype, co.num_blocks, bs, len);
  engine::EngineConfig ec;
  ec.scheduler.max_model_len = co.num_blocks * bs;
  ec.num_blocks = co.num_blocks;
  ec.eos_ids = eos;
  ec.speculative = sc;
  SpecRun run;
  {
    engine::Engine e(runner, ec);
    e.start();
    auto stream = e.submit(prompt, sp);
    while (true) {
      const engine::FinishReason f = stream->next(run.tokens, std::chrono::milliseconds(100));
      if (f == engine::FinishReason::Error) throw Error(stream->error());
      if (f != engine::FinishReason::None) break;
    }
    run.stats = e.stats();
    e.stop();
  }
  runner.set_draft(nullptr);
  return run;
}

int run_generate(const std::vector<std::string>& argv) {
  Args a("generate", argv);
  a.opt({"--model"}, "DIR", "model directory (default: the bundled model)")
      .opt({"--prompt-ids"}, "IDS", "prompt as comma-separated token ids")
      .opt({"--prompt"}, "TEXT", "prompt text (needs the model's tokenizer)")
      .opt({"--max-tokens"}, "N", "tokens to generate", "32")
      .opt({"--temperature"}, "T", "sampling temperature; 0 = greedy", "0")
      .opt({"--top-p"}, "P", "nucleus sampling mass", "1")
      .opt({"--top-k"}, "K", "sample among the K most likely tokens; 0 = all", "0")
      .opt({"--seed"}, "S", "random seed", "0")
      .opt({"--logprobs"}, "K", "also report the K most likely tokens per step", "0")
      .opt({"--kv-cache-dtype", "--kv_cache_dtype"}, "DTYPE", "auto, bf16, fp8 or fp32", "auto")
      .opt({"--index-cache-dtype", "--index_cache_dtype"}, "DTYPE",
           "auto, bf16, fp8 or fp32 (default: the kv cache dtype)")
      .opt({"--max-model-len"}, "N", "refuse prompts + max tokens longer than this")
      .opt({"--prefill-chunk"}, "N", "prefill in chunks of N tokens", "2048")
      .opt({"--speculative-config"}, "JSON",
           "speculative decoding (as serve): generate through the engine with draft tokens checked by the model")
      .flag({"--ignore-eos"}, "keep generating after an end-of-sequence token")
      .flag({"--dense"}, "select every block in sparse layers")
      .flag({"--enforce-eager"}, "CUDA: launch every kernel of every step (no CUDA graphs for decode steps)")
      .flag({"--json"}, "print one JSON object");
  add_model_load_flags(a);
  add_parallel_flags(a);
  if (!a.parse()) return 0;

  const spec::SpeculativeConfig spec_cfg = spec::parse_speculative_config(a.get("--speculative-config"));
  std::string dir = a.get("--model");
  if (dir.empty()) dir = model::bundled_model_dir(SIEVE_SOURCE_DIR);
  if (dir.empty()) throw Error("--model: no model directory given and no bundled model under models/");

  const auto group = load_model_group(dir, a, {.enforce_eager = a.get_flag("--enforce-eager")});
  if (follow_node_zero(*group)) return 0;
  engine::Runner& runner = group->leader();
  const ModelConfig& cfg = group->model().config();

  std::vector<int32_t> prompt;
#ifdef SIEVE_HAVE_TEXT
  std::unique_ptr<text::Tokenizer> tok;
#endif
  if (a.has("--prompt-ids")) {
    prompt = parse_ids(a.get("--prompt-ids"), "--prompt-ids");
  } else if (a.has("--prompt")) {
#ifdef SIEVE_HAVE_TEXT
    tok = std::make_unique<text::Tokenizer>(text::Tokenizer::load(dir));
    prompt = tok->encode(a.get("--prompt"), true);
#else
    throw Error("--prompt: this build has no tokenizer (use --prompt-ids)");
#endif
  } else {
    throw Error("give a prompt with --prompt-ids or --prompt");
  }
  if (prompt.empty()) throw Error("the prompt is empty");
  for (int32_t id : prompt)
    if (id >= cfg.vocab_size)
      throw Error("--prompt-ids: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(cfg.vocab_size) + ")");
  const long long max_tokens = a.get_int("--max-tokens");
  if (max_tokens < 0) throw Error("--max-tokens must be >= 0");
  const long long total = (long long)prompt.size() + max_tokens;
  if (a.has("--max-model-len") && total > a.get_int("--max-model-len"))
    throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens (" +
                std::to_string(max_tokens) + ") exceeds --max-model-len " + a.get("--max-model-len"));
  const double temperature = a.get_double("--temperature");
  if (temperature < 0) throw Error("--temperature must be >= 0");
  const double top_p = a.get_double("--top-p");
  if (!(top_p > 0 && top_p <= 1)) throw Error("--top-p must be in (0, 1]");
  const int top_k = int(a.get_int("--top-k"));
  const int n_logprobs = int(a.get_int("--logprobs"));
  const long long chunk = a.get_int("--prefill-chunk");
  if (chunk < 1) throw Error("--prefill-chunk must be >= 1");

  model::CacheOptions co =
      model::cache_options_from_flags(a.get("--kv-cache-dtype"), a.get("--index-cache-dtype"));
  co.dense = a.get_flag("--dense");
  std::vector<int32_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
#ifdef SIEVE_HAVE_TEXT
  if (tok)
    for (int32_t e : tok->eos_ids()) eos.push_back(e);
#endif
  std::vector<Choice> out;
  if (spec_cfg.enabled()) {
    // Through the engine, whose steps check the draft tokens.
    engine::SamplingParams sp;
    sp.temperature = temperature;
    sp.top_p = top_p;
    sp.top_k = top_k;
    sp.has_seed = true;
    sp.seed = uint64_t(a.get_int("--seed"));
    sp.max_tokens = std::max<long long>(max_tokens, 1);
    sp.ignore_eos = a.get_flag("--ignore-eos");
    sp.logprobs = true;
    sp.top_logprobs = n_logprobs;
    const SpecRun run = generate_speculative(runner, co, spec_cfg, prompt, sp, eos);
    if (max_tokens > 0)
      for (const auto& t : run.tokens) {
        Choice c{t.token, t.logprob, {}};
        for (const auto& alt : t.top) c.top.push_back({alt.token, alt.logprob});
        out.push_back(c);
      }
    std::fprintf(stderr, "speculative decoding (%s): %llu draft tokens, %llu accepted, mean acceptance length %.2f\n",
                 spec::method_name(spec_cfg.method), (unsigned long long)run.stats.spec_num_draft_tokens,
                 (unsigned long long)run.stats.spec_num_accepted_tokens,
                 run.stats.spec_num_drafts ? 1.0 + double(run.stats.spec_num_accepted_tokens) / double(run.stats.spec_num_drafts) : 0.0);
  } else {
  engine::SingleSequence seq(runner, co, total);
  std::vector<float> logits = seq.append(prompt, false, chunk);
  std::mt19937_64 rng(uint64_t(a.get_int("--seed")));
  for (long long t = 0; t < max_tokens; ++t) {
    Choice c = sample(logits.data(), cfg.vocab_size, temperature, top_p, top_k, n_logprobs, rng);
    out.push_back(c);
    if (!a.get_flag("--ignore-eos") && std::find(eos.begin(), eos.end(), c.id) != eos.end()) break;
    if (t + 1 == max_tokens) break;
    logits = seq.append({c.id}, false, 1);
  }
  }

  if (a.get_flag("--json")) {
    nlohmann::json j;
    j["token_ids"] = nlohmann::json::array();
    j["logprobs"] = nlohmann::json::array();
    j["top_logprobs"] = nlohmann::json::array();
    for (const auto& c : out) {
      j["token_ids"].push_back(c.id);
      j["logprobs"].push_back(c.logprob);
      nlohmann::json tl = nlohmann::json::array();
      for (auto& [id, lp] : c.top) tl.push_back({{"id", id}, {"logprob", lp}});
      j["top_logprobs"].push_back(tl);
    }
    j["prompt_tokens"] = prompt.size();
#ifdef SIEVE_HAVE_TEXT
    if (tok) {
      std::vector<int32_t> ids;
      for (const auto& c : out) ids.push_back(c.id);
      j["text"] = tok->decode(ids, true);
    }
#endif
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
#ifdef SIEVE_HAVE_TEXT
  if (tok) {
    text::StreamDecoder dec(*tok, true);
    std::string s;
    for (const auto& c : out) s += dec.push(c.id);
    s += dec.flush();
    std::printf("%s\n", s.c_str());
    return 0;
  }
#endif
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i].id);
  std::printf("\n");
  return 0;
}

Register reg{"generate", "generate tokens from a prompt (paged prefill, then decode steps)", &run_generate};

}  // namespace
}  // namespace sieve::cli
