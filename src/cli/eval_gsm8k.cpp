// `sieve eval gsm8k`: lm-eval's 5-shot GSM8K against any OpenAI-compatible server.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "cli/command.h"
#include "core/error.h"
#include "eval/gsm8k.h"

namespace {

std::atomic<bool> g_stop{false};

void on_sigint(int) {
  if (g_stop.exchange(true)) std::_Exit(130);
}

int run_eval_gsm8k(const std::vector<std::string>& argv) {
  sieve::cli::Args a("eval gsm8k", argv);
  a.opt({"--base-url"}, "URL", "server base URL", "http://127.0.0.1:8000")
      .opt({"--model"}, "NAME", "model name (default: the first of /v1/models)")
      .opt({"--num-fewshot"}, "K", "few-shot examples from the train split", "5")
      .opt({"--limit"}, "N", "score only the first N test questions")
      .opt({"--num-concurrent"}, "N", "requests in flight", "32")
      .flag({"--chat"}, "use /v1/chat/completions with the examples as earlier turns")
      .opt({"--max-gen-toks"}, "N", "max tokens per answer", "256")
      .opt({"--data-dir"}, "DIR", "folder with train.jsonl and test.jsonl",
           std::string(SIEVE_SOURCE_DIR) + "/data/gsm8k")
      .opt({"--seed"}, "N", "seed of the few-shot draw", "1234")
      .opt({"--output-path"}, "FILE",
           "write one JSON line per question (reply, extractions, score)")
      .opt({"--request-timeout"}, "S", "fail a request after S seconds without data", "3600")
      .flag({"--no-progress"}, "no progress (a bar on a terminal, else a log line every 10 s)");
  if (!a.parse()) return 0;
  if (!a.positional().empty())
    throw sieve::Error("sieve eval gsm8k: unexpected argument \"" + a.positional()[0] + "\"");
  sieve::eval::Gsm8kOptions o;
  o.base_url = a.get("--base-url");
  o.model = a.get("--model");
  o.num_fewshot = int(a.get_int("--num-fewshot"));
  if (a.has("--limit")) o.limit = int(a.get_int("--limit"));
  o.num_concurrent = int(a.get_int("--num-concurrent"));
  o.chat = a.get_flag("--chat");
  o.max_gen_toks = int(a.get_int("--max-gen-toks"));
  o.data_dir = a.get("--data-dir");
  o.seed = uint64_t(a.get_int("--seed"));
  o.output_path = a.get("--output-path");
  o.client.read_timeout_s = a.get_double("--request-timeout");
  o.progress = !a.get_flag("--no-progress");
  g_stop = false;
  auto old = std::signal(SIGINT, on_sigint);
  sieve::eval::Gsm8kResult r;
  try {
    r = sieve::eval::run_gsm8k(o, &g_stop, std::cout);
  } catch (...) {
    std::signal(SIGINT, old);
    throw;
  }
  std::signal(SIGINT, old);
  return g_stop ? 130 : 0;
}

sieve::cli::Register reg{"eval gsm8k",
                         "5-shot GSM8K accuracy of an OpenAI-compatible server (lm-eval's table)",
                         &run_eval_gsm8k};

}  // namespace
