// `sieve serve`: the OpenAI-compatible server (vLLM's flags and routes) over one model.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/sizing.h"
#include "cli/command.h"
#include "cli/model_load_flags.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "kernels/memory.h"
#include "model/locate.h"
#include "model/model.h"
#include "server/reasoning.h"
#include "server/server.h"
#include "server/tool_calls.h"
#include "spec/config.h"
#include "spec/eagle3.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sieve::cli {
namespace {

namespace fs = std::filesystem;

// Where a generated tiny model goes when no model is bundled: next to the binary (build/), else
// the user's cache directory.
std::string tiny_model_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path() / "tiny-model";
    if (fs::exists(dir / "config.json") || ::access(exe.parent_path().c_str(), W_OK) == 0)
      return dir.string();
  }
  return (fs::path(env::user_cache_dir()) / "sieve" / "tiny-model").string();
}

std::string default_model() {
  std::string dir = model::bundled_model_dir(SIEVE_SOURCE_DIR);
  if (!dir.empty()) {
    SIEVE_LOG(Info, "no --model given: serving the bundled model " << dir);
    return dir;
  }
  dir = tiny_model_dir();
  if (fs::exists(fs::path(dir) / "config.json") && fs::exists(fs::path(dir) / "tokenizer.json")) {
    SIEVE_LOG(
        Info,
        "no --model given and no bundled model under models/: serving the generated tiny model "
            << dir);
    return dir;
  }
  auto& cmds = commands();
  auto it = cmds.find("make-tiny-model");
  if (it == cmds.end())
    throw Error(
        "--model: no model given, none bundled under models/, and this build cannot generate one");
  SIEVE_LOG(Info,
            "no --model given and no bundled model under models/: generating a random tiny model "
            "(byte-level tokenizer) into "
                << dir << " and serving it; its output is noise");
  fs::create_directories(dir);
  int rc = it->second.fn({"--out", dir});
  if (rc != 0) throw Error("generating the tiny model into " + dir + " failed");
  return dir;
}

sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

nlohmann::json read_json_file(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(what + ": cannot read " + path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + ": " + path.string() + " is not valid JSON: " + e.what());
  }
}

// Sampling defaults as vLLM's --generation-config and --override-generation-config give them.
server::RequestDefaults request_defaults(const std::string& mode, const std::string& model_dir,
                                         const std::string& overrides_arg, int max_logprobs) {
  nlohmann::json cfg, overrides = nlohmann::json::object();
  if (mode == "auto") {
    const fs::path f = fs::path(model_dir) / "generation_config.json";
    if (fs::exists(f)) cfg = read_json_file(f, "--generation-config auto");
  } else if (mode != "vllm") {
    const fs::path f = fs::path(mode) / "generation_config.json";
    if (!fs::exists(f)) throw Error("--generation-config " + mode + ": no generation_config.json in that folder");
    cfg = read_json_file(f, "--generation-config");
  }
  if (!overrides_arg.empty()) {
    try {
      overrides = nlohmann::json::parse(overrides_arg);
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("--override-generation-config: not valid JSON: ") + e.what());
    }
  }
  server::RequestDefaults base;
  base.max_logprobs = max_logprobs;
  server::RequestDefaults d = server::request_defaults_from(cfg, overrides, base);
  const server::RequestDefaults neutral;
  std::string changed;
  auto note = [&](const char* k, auto v) {
    changed += std::string(changed.empty() ? "" : ", ") + k + " " + nlohmann::json(v).dump();
  };
  if (d.temperature != neutral.temperature) note("temperature", d.temperature);
  if (d.top_p != neutral.top_p) note("top_p", d.top_p);
  if (d.top_k != neutral.top_k) note("top_k", d.top_k);
  if (d.min_p != neutral.min_p) note("min_p", d.min_p);
  if (d.repetition_penalty != neutral.repetition_penalty) note("repetition_penalty", d.repetition_penalty);
  if (d.max_tokens) note("max_tokens", d.max_tokens);
  if (!changed.empty())
    SIEVE_LOG(Info, "default sampling parameters from the generation config: "
                        << changed << " (requests that set a field keep theirs; --generation-config vllm for none)");
  return d;
}

// A parser flag's value (empty: not given) must be one of `names`.
void check_parser_name(const std::string& flag, const std::string& value, const std::vector<std::string>& names) {
  if (value.empty() || std::find(names.begin(), names.end(), value) != names.end()) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw Error(flag + " " + value + " is unknown (expected one of " + list + ")");
}

// Seconds between the periodic stats lines: SIEVE_LOG_STATS_INTERVAL, else vLLM's
// VLLM_LOG_STATS_INTERVAL, else 10.
double stats_interval_s() { return env::log_stats_interval_s(); }

// Calls `tick` every `interval_s` seconds on a thread of its own, until destroyed or until tick
// returns false.
class Periodic {
 public:
  Periodic(double interval_s, std::function<bool()> tick) : interval_(interval_s), tick_(std::move(tick)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Periodic() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::duration<double>(interval_), [this] { return stop_; })) {
      lk.unlock();
      const bool go_on = tick_();
      lk.lock();
      if (!go_on) return;
    }
  }
  double interval_;
  std::function<bool()> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Logs engine::stats_log_line every `interval` seconds while there is work.
std::unique_ptr<Periodic> log_stats(const engine::Engine& e, double interval) {
  return std::make_unique<Periodic>(interval, [&e, before = e.stats(), t0 = std::chrono::steady_clock::now()]() mutable {
    engine::EngineStats now = e.stats();
    const auto t1 = std::chrono::steady_clock::now();
    const std::string line = engine::stats_log_line(before, now, std::chrono::duration<double>(t1 - t0).count());
    if (!line.empty()) SIEVE_LOG(Info, line);
    before = std::move(now);
    t0 = t1;
    return true;
  });
}

int run_serve(const std::vector<std::string>& argv) {
  // SIGINT and SIGTERM go to one waiting thread. They are blocked before anything starts a
  // thread (model load, the CUDA runtime's own threads, worker pools), so every thread inherits
  // the mask: a signal that reached a thread with the default action would end the process
  // without draining. Until the server runs, a signal ends the process at once.
  sigset_t sigs = shutdown_signals();
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::atomic<server::Server*> serving{nullptr};
  std::atomic<bool> stopped{false};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (stopped) return;
    server::Server* srv = serving.load();
    if (!srv) {
      SIEVE_LOG(Info, "signal " << sig << " before the server started: exiting");
      std::fflush(nullptr);
      std::_Exit(0);
    }
    SIEVE_LOG(Info, "signal " << sig << ": shutting down (finishing in-flight requests)");
    std::thread([sigs]() mutable {
      int again = 0;
      sigwait(&sigs, &again);
      std::_Exit(0);  // a second signal: stop now
    }).detach();
    srv->shutdown();
  });
  struct JoinWatcher {
    std::thread& t;
    std::atomic<bool>& stopped;
    ~JoinWatcher() {
      // run() has returned (or serving never began): make the watcher exit either way.
      if (!stopped.exchange(true)) pthread_kill(t.native_handle(), SIGTERM);
      t.join();
    }
  } join_watcher{watcher, stopped};

  Args a("serve", argv);
  a.opt({"--model"}, "DIR",
        "model directory (default: the bundled model, else a generated tiny model)")
      .opt({"--host"}, "HOST", "address to listen on", "127.0.0.1")
      .opt({"--port", "--server-port"}, "PORT", "port to listen on (0: any free port)", "8000")
      .opt({"--served-model-name"}, "NAME", "model name in the API (default: the --model argument, or the bundled model's folder name)")
      .opt({"--api-key"}, "KEY",
           "require 'Authorization: Bearer KEY' on /v1 routes (env: SIEVE_API_KEY, VLLM_API_KEY)")
      .opt({"--tokenizer"}, "DIR", "tokenizer (and chat template) from DIR instead of the model directory")
      .opt({"--block-size"}, "N", "tokens per KV cache block (128 for MiniMax-M3)", "128")
      .opt({"--max-num-batched-tokens"}, "N", "token budget of one engine step (chunked prefill)",
           "8192")
      .opt({"--max-model-len"}, "N",
           "longest prompt + completion (default: the model's, capped by the cache)")
      .opt({"--max-num-seqs"}, "N", "most requests in one step", "256")
      .opt({"--gpu-memory-utilization"}, "F",
           "fraction of GPU memory the engine may use (GPU backend)", "0.9")
      .opt({"--kv-cache-memory"}, "BYTES", "KV + index cache size on the CPU, e.g. 512MiB, 4G",
           "512MiB")
      .opt({"--kv-cache-dtype", "--kv_cache_dtype"}, "DTYPE", "auto (bf16), bf16, fp8 or fp32",
           "auto")
      .opt({"--index-cache-dtype", "--index_cache_dtype"}, "DTYPE",
           "index-key cache dtype (default: the kv cache dtype)")
      .opt({"--profiler-dir", "--torch-profiler-dir"}, "DIR",
           "enable POST /start_profile and /stop_profile, writing Chrome traces here")
      .opt({"--max-request-bytes"}, "BYTES", "largest request body accepted (larger: 413)", "32MiB")
      .opt({"--max-connections"}, "N", "open connections accepted at once (beyond: 503 at once)", "10000")
      .opt({"--http-threads"}, "N", "HTTP worker threads (0: from the machine's cores)", "0")
      .opt({"--generation-config"}, "auto|vllm|DIR",
           "default sampling parameters: the model's generation_config.json (auto), vLLM's neutral ones "
           "(vllm), or DIR/generation_config.json",
           "auto")
      .opt({"--override-generation-config"}, "JSON",
           "JSON object of sampling defaults over the generation config, e.g. '{\"temperature\": 0.6}'")
      .opt({"--max-logprobs"}, "N", "most log-prob alternatives a request may ask for", "20")
      .opt({"--speculative-config"}, "JSON",
           "speculative decoding, e.g. '{\"method\": \"eagle3\", \"model\": DIR, \"num_speculative_tokens\": 3}' or "
           "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 4}'")
      .opt({"--seed"}, "N",
           "seed of requests that bring none (with their arrival order); default: random")
      .opt({"--chat-template"}, "FILE|TEMPLATE", "chat template file, or the template itself, instead of the model's")
      .opt({"--default-chat-template-kwargs"}, "JSON",
           "JSON object of chat template variables for requests that leave them out, e.g. "
           "'{\"thinking_mode\": \"disabled\"}'")
      .opt({"--dtype"}, "DTYPE",
           "auto or bfloat16: weights as stored (bf16, or fp8 with --quantization fp8 or an fp8 checkpoint); "
           "activations bf16 on a GPU (fp32 residual stream), fp32 on the CPU",
           "auto")
      .opt({"--tool-call-parser"}, "NAME", "with --enable-auto-tool-choice: MiniMax's XML tool calls into tool_calls (minimax_m3, minimax_m2)")
      .flag({"--enable-auto-tool-choice"}, "parse tool calls out of chat output (tool_choice \"auto\")")
      .opt({"--reasoning-parser"}, "NAME",
           "chat: the thinking block into the message's reasoning: minimax_m3 (<mm:think>), minimax_m2, "
           "deepseek_r1, qwen3 (<think>)")
      .flag({"--disable-log-stats"}, "no periodic throughput and cache log line")
      .flag({"--disable-log-requests"}, "accepted for vLLM compatibility; requests are not logged")
      .flag({"--enforce-eager"}, "CUDA: launch every kernel of every step (no CUDA graphs for decode steps)")
      .flag({"--trust-remote-code"}, "accepted for vLLM compatibility; no effect")
      .flag({"--enable-prefix-caching"}, "reuse cached KV + index blocks of shared prompt prefixes (the default)")
      .flag({"--no-enable-prefix-caching"}, "compute every prompt from its first token")
      .flag({"--disable-web-ui"}, "no chat page at / and no dashboard (the API alone)");
  add_model_load_flags(a);
  add_parallel_flags(a);
  if (!a.parse()) return 0;

  const long long port = a.get_int("--port");
  if (port < 0 || port > 65535)
    throw Error("--port must be in 0..65535, got " + std::to_string(port));
  const long long max_seqs = a.get_int("--max-num-seqs");
  if (max_seqs < 1 || max_seqs > 65536) throw Error("--max-num-seqs must be in 1..65536");
  const long long max_batched = a.get_int("--max-num-batched-tokens");
  if (max_batched < 1) throw Error("--max-num-batched-tokens must be at least 1");
  const double gpu_util = a.get_double("--gpu-memory-utilization");
  if (!(gpu_util > 0 && gpu_util <= 1)) throw Error("--gpu-memory-utilization must be in (0, 1]");
  if (a.get_flag("--enable-prefix-caching") && a.get_flag("--no-enable-prefix-caching"))
    throw Error("--enable-prefix-caching and --no-enable-prefix-caching contradict each other");
  // On by default, as in vLLM: reuse is exact (tests/model/prefix_cache_test.cpp).
  const bool prefix_caching = !a.get_flag("--no-enable-prefix-caching");
  const long long max_logprobs = a.get_int("--max-logprobs");
  if (max_logprobs < 0 || max_logprobs > 1000000) throw Error("--max-logprobs must be in 0..1000000");
  if (const std::string dt = a.get("--dtype"); dt != "auto" && dt != "bfloat16" && dt != "bf16")
    throw Error("--dtype " + dt +
                " is not supported: Sieve keeps the weights as stored (bf16 or fp8) and computes in bf16 "
                "on a GPU, fp32 on the CPU (use auto or bfloat16)");
  const double stats_interval = stats_interval_s();
  const std::string tool_parser = a.get("--tool-call-parser");
  check_parser_name("--tool-call-parser", tool_parser, server::tool_parser_names());
  if (a.get_flag("--enable-auto-tool-choice") && tool_parser.empty())
    throw Error("--enable-auto-tool-choice needs --tool-call-parser (minimax_m3)");
  if (!tool_parser.empty() && !a.get_flag("--enable-auto-tool-choice"))
    SIEVE_LOG(Warn, "--tool-call-parser without --enable-auto-tool-choice: tool calls stay in the text");
  const std::string reasoning_parser = a.get("--reasoning-parser");
  check_parser_name("--reasoning-parser", reasoning_parser, server::reasoning_parser_names());
  std::optional<uint64_t> seed;
  if (a.has("--seed")) {
    const long long v = a.get_int("--seed");
    if (v < 0) throw Error("--seed must be at least 0");
    seed = uint64_t(v);
  }
  const spec::SpeculativeConfig spec_cfg = spec::parse_speculative_config(a.get("--speculative-config"));
  const uint64_t cache_bytes = cache::parse_bytes(a.get("--kv-cache-memory"), "--kv-cache-memory");
  const uint64_t max_body = cache::parse_bytes(a.get("--max-request-bytes"), "--max-request-bytes");

  std::string api_key = a.get("--api-key");
  if (api_key.empty()) api_key = env::api_key();

  const std::string dir = a.has("--model") ? a.get("--model") : default_model();
  // Checked before the weights load, so a mistake in them fails at once.
  server::RequestDefaults defaults =
      request_defaults(a.get("--generation-config"), dir, a.get("--override-generation-config"), int(max_logprobs));
  if (a.has("--default-chat-template-kwargs")) {
    const std::string arg = a.get("--default-chat-template-kwargs");
    nlohmann::ordered_json kw = nlohmann::ordered_json::parse(arg, nullptr, false);
    if (kw.is_discarded() || !kw.is_object())
      throw Error("--default-chat-template-kwargs: expected a JSON object, got " + arg);
    if (std::string why = server::check_chat_template_kwargs(kw); !why.empty())
      throw Error("--default-chat-template-kwargs: " + why);
    defaults.chat_template_kwargs = std::move(kw);
  }
  std::optional<std::string> chat_template;
  if (a.has("--chat-template")) chat_template = text::chat_template_arg(a.get("--chat-template"));
  model::LoadOptions lo = model_load_options(a);
  lo.gpu_memory_utilization = gpu_util;
  const engine::RunnerOptions ro{.enforce_eager = a.get_flag("--enforce-eager"),
                                 .max_graph_batch = int(std::min<long long>(max_seqs, 256))};
  const auto group = load_model_group(dir, a, lo, ro);
  if (follow_node_zero(*group)) return 0;  // HTTP on node 0 only
  model::Model* m = &group->model();
  lo.device = m->device();  // the CPU when --device auto fell back
  engine::Runner& runner = group->leader();
  std::unique_ptr<spec::Eagle3Draft> draft;
  if (spec_cfg.method == spec::Method::Eagle3) {
    runner.check_draft_allowed();
    draft = spec::Eagle3Draft::load(spec_cfg.model, m->config(), lo.device, m->input_embedding());
    runner.set_draft(draft.get());
  }
  if (lo.device.is_cuda())
    SIEVE_LOG(Info, (ro.enforce_eager ? std::string("--enforce-eager: every step launches its kernels")
                                      : "CUDA graphs for decode steps of up to " + std::to_string(ro.max_graph_batch) +
                                            " sequences, each shape captured on first use (--enforce-eager: off)"));
  const ModelConfig& cfg = m->config();
  cache::check_block_size(int(a.get_int("--block-size")), m->block_size(),
                          cfg.use_sparse_attention);

  text::Tokenizer tok = text::Tokenizer::load(a.has("--tokenizer") ? a.get("--tokenizer") : dir);
  if (chat_template) tok.set_chat_template(*chat_template);

  model::CacheOptions co;
  co.kv_dtype = model::parse_cache_dtype(a.get("--kv-cache-dtype"), "--kv-cache-dtype");
  co.index_dtype =
      a.has("--index-cache-dtype")
          ? model::parse_cache_dtype(a.get("--index-cache-dtype"), "--index-cache-dtype")
          : co.kv_dtype;
  const size_t per_block = m->cache_bytes_per_block(co.kv_dtype, co.index_dtype) +
                           (draft ? draft->cache_bytes_per_block(co.kv_dtype, m->block_size()) : 0);
  if (lo.device.is_cuda()) {
    // As vLLM: the engine may use this fraction of the device; weights (loaded above), the
    // activations of the largest step (reserved here) and whatever else is resident come off
    // it, the rest is cache.
    runner.reserve(max_batched, max_seqs);
    {
      const int64_t n = std::min<int64_t>(max_batched, cfg.max_position_embeddings > 0
                                                           ? cfg.max_position_embeddings
                                                           : max_batched);
      const auto t0 = std::chrono::steady_clock::now();
      engine::warm_up(runner, co.kv_dtype, co.index_dtype, n);
      const double ms =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3;
      SIEVE_LOG(Info, "warm-up step of " << n << " tokens on " << lo.device.str() << ": " << ms
                                         << " ms");
    }
    // Every rank holds a cache of the same blocks: the GPU with the least room sets their number.
    size_t free_b = 0, total_b = 0;
    for (int r = 0; r < group->size(); ++r) {
      size_t f = 0, t = 0;
      model::device_memory(group->model(r).device(), &f, &t);
      if (r == 0 || f < free_b) free_b = f, total_b = t;
    }
    co.num_blocks = cache::blocks_for_gpu(total_b, free_b, gpu_util, per_block);
    const double gib = double(1ull << 30);
    SIEVE_LOG(Info, "memory on " << lo.device.str() << ": " << double(total_b) / gib << " GiB; weights "
                                 << double(m->weight_bytes()) / gib << " GiB; activations, workspaces and others "
                                 << double(total_b - free_b - m->weight_bytes()) / gib << " GiB; cache "
                                 << double(co.num_blocks) * double(per_block) / gib << " GiB ("
                                 << co.num_blocks << " blocks of " << m->block_size()
                                 << " tokens) at --gpu-memory-utilization " << gpu_util);
  } else {
    co.num_blocks = cache::blocks_for_bytes(cache_bytes, per_block, "--kv-cache-memory");
  }
  const int64_t capacity = co.num_blocks * m->block_size();
  int64_t max_len = std::min<int64_t>(
      cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : capacity, capacity);
  if (a.has("--max-model-len")) {
    max_len = a.get_int("--max-model-len");
    if (max_len < 2) throw Error("--max-model-len must be at least 2");
    if (cfg.max_position_embeddings > 0 && max_len > cfg.max_position_embeddings)
      throw Error("--max-model-len " + std::to_string(max_len) +
                  " is longer than the model's max_position_embeddings (" +
                  std::to_string(cfg.max_position_embeddings) + ")");
  }
  runner.allocate_caches(co);
  if (draft) draft->allocate_cache(co.kv_dtype, co.num_blocks, m->block_size(), max_len + spec_cfg.num_speculative_tokens + 1);

  engine::EngineConfig ec;
  ec.scheduler = {.max_num_batched_tokens = max_batched,
                  .max_num_seqs = int(max_seqs),
                  .max_model_len = max_len};
  ec.num_blocks = co.num_blocks;
  ec.enable_prefix_caching = prefix_caching;
  ec.seed = seed;
  ec.speculative = spec_cfg;
  if (spec_cfg.enabled())
    SIEVE_LOG(Info, "speculative decoding: " << spec::method_name(spec_cfg.method) << ", "
                                             << spec_cfg.num_speculative_tokens << " draft tokens a step"
                                             << (draft ? " (draft " + spec_cfg.model + ")" : std::string()));
  ec.eos_ids = tok.eos_ids();
  for (int64_t e : cfg.eos_token_ids)
    if (std::find(ec.eos_ids.begin(), ec.eos_ids.end(), int32_t(e)) == ec.eos_ids.end())
      ec.eos_ids.push_back(int32_t(e));
  engine::Engine engine(runner, ec);

  server::ServerOptions so;
  so.host = a.get("--host");
  so.port = int(port);
  // As vLLM: the --model argument names the model; the bundled default goes by its folder name.
  so.served_model_names = {a.has("--served-model-name") ? a.get("--served-model-name")
                           : a.has("--model")            ? dir
                                                         : fs::path(dir).filename().string()};
  so.model_dir = dir;
  so.api_key = api_key;
  so.max_body_bytes = size_t(max_body);
  const long long max_conns = a.get_int("--max-connections");
  if (max_conns < 1) throw Error("--max-connections must be at least 1");
  so.max_connections = size_t(max_conns);
  const long long http_threads = a.get_int("--http-threads");
  if (http_threads < 0 || http_threads > 1024) throw Error("--http-threads must be in 0..1024");
  so.http_threads = int(http_threads);
  so.profiler_dir = a.get("--profiler-dir");
  so.defaults = defaults;
  so.reasoning_parser = reasoning_parser;
  if (a.get_flag("--enable-auto-tool-choice")) so.tool_parser = tool_parser;
  so.web_ui = !a.get_flag("--disable-web-ui");
  auto cache_dtype = [](DType t) { return t == DType::FP8_E4M3 ? "fp8" : t == DType::BF16 ? "bf16" : "fp32"; };
  so.ui_info = {{"device", lo.device.str()},
                {"kv_cache_dtype", cache_dtype(co.kv_dtype)},
                {"index_cache_dtype", cache_dtype(co.index_dtype)},
                {"cache_bytes_per_block", per_block}};

  server::Server srv(engine, tok, so);
  srv.bind();
  engine.start();
  serving = &srv;
  SIEVE_LOG(Info, "serving " << so.served_model_names[0] << " on http://" << so.host << ":"
                             << srv.port() << " (" << co.num_blocks << " cache blocks of "
                             << m->block_size() << " tokens, max model len " << max_len
                             << ", prefix caching " << (prefix_caching ? "on" : "off") << ")");
  std::unique_ptr<Periodic> stats_log;
  if (!a.get_flag("--disable-log-stats")) stats_log = log_stats(engine, stats_interval);
  // Once the engine can run no more steps (a tensor-parallel rank failed) the requests in flight
  // have had their errors (503): stop serving, and exit non-zero below.
  Periodic fatal_watch(0.1, [&] {
    if (engine.stats().fatal_error.empty()) return true;
    srv.shutdown();
    return false;
  });
  srv.run();
  serving = nullptr;
  stats_log.reset();
  engine.stop();
  if (const std::string why = engine.stats().fatal_error; !why.empty()) {
    SIEVE_LOG(Error, "server stopped: the engine can run no more steps: " << why);
    return 1;
  }
  SIEVE_LOG(Info, "server stopped");
  return 0;
}

Register reg{"serve", "OpenAI-compatible server (continuous batching over paged caches)",
             &run_serve};

}  // namespace
}  // namespace sieve::cli
