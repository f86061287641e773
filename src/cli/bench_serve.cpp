// `sieve bench serve`: vLLM's serving benchmark against any OpenAI-compatible server.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <limits>
#include <regex>

#include "bench/serve.h"
#include "cli/command.h"
#include "core/error.h"

namespace {

std::atomic<bool> g_stop{false};

void on_sigint(int) {
  if (g_stop.exchange(true)) std::_Exit(130);  // a second Ctrl-C leaves at once
}

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return std::numeric_limits<double>::infinity();
  try {
    size_t pos = 0;
    double v = std::stod(s, &pos);
    if (pos == s.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw sieve::Error("--request-rate must be a positive number or inf, got \"" + s + "\"");
}

int run_bench_serve(const std::vector<std::string>& argv) {
  sieve::cli::Args a("bench serve", argv);
  a.opt({"--base-url"}, "URL", "server base URL (default http://HOST:PORT)")
      .opt({"--host"}, "HOST", "server host when --base-url is not given", "127.0.0.1")
      .opt({"--port"}, "PORT", "server port when --base-url is not given", "8000")
      .opt({"--endpoint"}, "PATH", "/v1/completions or /v1/chat/completions", "/v1/completions")
      .opt({"--model"}, "NAME", "model name sent in requests (default: the first of /v1/models)")
      .opt({"--tokenizer"}, "DIR",
           "tokenizer directory, for text prompts and output counts without usage")
      .opt({"--label"}, "NAME", "result label (default: openai / openai-chat)")
      .opt({"--dataset-name"}, "NAME", "random, gsm8k or jsonl", "random")
      .opt({"--dataset-path"}, "FILE",
           "gsm8k: a jsonl of {question, answer} (default data/gsm8k/test.jsonl); jsonl: rows "
           "{prompt, output_len?}")
      .opt({"--random-input-len", "--input-len"}, "N", "random dataset: input tokens", "1024")
      .opt({"--random-output-len"}, "N", "random dataset: output tokens", "128")
      .opt({"--output-len"}, "N",
           "gsm8k/jsonl: max output tokens (random: same as --random-output-len)")
      .opt({"--random-range-ratio"}, "R", "length spread, see --range-ratio-mode", "0")
      .opt({"--range-ratio-mode"}, "MODE",
           "vllm: lengths in [L(1-r), L(1+r)]; atom: in [L*r, L] (ATOM's tables)", "vllm")
      .opt({"--random-prefix-len"}, "N", "random dataset: shared prefix tokens before each prompt",
           "0")
      .opt({"--random-vocab-size"}, "N",
           "token ids are drawn from [0, N) when there is no --tokenizer", "1000")
      .opt({"--num-prompts"}, "N", "number of requests", "1000")
      .opt({"--max-concurrency"}, "N", "client-side limit on requests in flight")
      .opt({"--request-rate"}, "RPS",
           "inf: all at t=0; else Poisson (or gamma with --burstiness) arrivals", "inf")
      .opt({"--burstiness"}, "B", "gamma shape of the arrival gaps (1 = Poisson)", "1.0")
      .flag({"--ignore-eos"},
            "set ignore_eos in each request (always on for the random dataset, as vLLM)")
      .opt({"--temperature"}, "T", "sampling temperature sent in requests (default: the server's)")
      .opt({"--percentile-metrics"}, "LIST", "metrics to report: ttft,tpot,itl,e2el",
           "ttft,tpot,itl")
      .opt({"--metric-percentiles"}, "LIST", "percentiles to report, e.g. 50,90,99", "99")
      .opt({"--goodput"}, "SLOS",
           "SLOs in ms, e.g. \"ttft:500 tpot:50\" (vLLM's space-separated form works too)")
      .opt({"--num-warmups"}, "N", "warm-up requests before the run", "0")
      .opt({"--seed"}, "N", "random seed", "0")
      .flag({"--save-result"}, "write the result JSON")
      .flag({"--save-detailed"}, "keep per-request arrays in the JSON")
      .opt({"--result-dir"}, "DIR", "directory for the result JSON")
      .opt({"--result-filename"}, "FILE",
           "name of the result JSON (default "
           "{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json)")
      .opt({"--request-timeout"}, "S", "fail a request after S seconds without data", "21600")
      .flag({"--disable-tqdm"}, "no progress (a bar on a terminal, else a log line every 10 s)");
  if (!a.parse()) return 0;

  sieve::bench::ServeOptions o;
  o.base_url = a.has("--base-url") ? a.get("--base-url")
                                   : "http://" + a.get("--host") + ":" + a.get("--port");
  o.endpoint = a.get("--endpoint");
  o.model = a.get("--model");
  o.tokenizer_dir = a.get("--tokenizer");
  o.label = a.get("--label");
  o.dataset_name = a.get("--dataset-name");
  o.dataset_path = a.get("--dataset-path");
  o.random_input_len = int(a.get_int("--random-input-len"));
  o.random_output_len = int(a.get_int("--random-output-len"));
  if (a.has("--output-len")) {
    o.output_len = int(a.get_int("--output-len"));
    if (!a.has("--random-output-len")) o.random_output_len = o.output_len;
  }
  o.random_range_ratio = a.get_double("--random-range-ratio");
  o.range_ratio_mode = a.get("--range-ratio-mode");
  o.random_prefix_len = int(a.get_int("--random-prefix-len"));
  o.random_vocab_size = int(a.get_int("--random-vocab-size"));
  o.num_prompts = int(a.get_int("--num-prompts"));
  if (a.has("--max-concurrency")) o.max_concurrency = int(a.get_int("--max-concurrency"));
  o.request_rate = parse_rate(a.get("--request-rate"));
  o.burstiness = a.get("--burstiness") == "inf" ? std::numeric_limits<double>::infinity()
                                                : a.get_double("--burstiness");
  o.ignore_eos = a.get_flag("--ignore-eos");
  if (a.has("--temperature")) o.temperature = a.get_double("--temperature");
  o.percentile_metrics = sieve::bench::parse_metric_list(a.get("--percentile-metrics"));
  o.metric_percentiles = sieve::bench::parse_percentile_list(a.get("--metric-percentiles"));
  o.goodput = a.get("--goodput");
  // vLLM spells --goodput ttft:500 tpot:50: the extra KEY:VALUE words arrive as positionals.
  static const std::regex slo("^(ttft|tpot|e2el):.*");
  for (const auto& p : a.positional()) {
    if (!a.has("--goodput") || !std::regex_match(p, slo))
      throw sieve::Error("sieve bench serve: unexpected argument \"" + p + "\" (see --help)");
    o.goodput += " " + p;
  }
  o.num_warmups = int(a.get_int("--num-warmups"));
  o.seed = uint64_t(a.get_int("--seed"));
  o.save_result = a.get_flag("--save-result");
  o.save_detailed = a.get_flag("--save-detailed");
  o.result_dir = a.get("--result-dir");
  o.result_filename = a.get("--result-filename");
  o.client.read_timeout_s = a.get_double("--request-timeout");
  o.progress = !a.get_flag("--disable-tqdm");

  g_stop = false;
  auto old = std::signal(SIGINT, on_sigint);
  sieve::bench::ServeOutcome r;
  try {
    r = sieve::bench::run_serve(o, &g_stop, std::cout);
  } catch (...) {
    std::signal(SIGINT, old);
    throw;
  }
  std::signal(SIGINT, old);
  if (!r.saved_path.empty()) std::cout << "Results saved to " << r.saved_path << std::endl;
  return r.interrupted ? 130 : 0;
}

sieve::cli::Register reg{"bench serve",
                         "serving benchmark against an OpenAI-compatible server (vLLM's report)",
                         &run_bench_serve};

}  // namespace
