// `sieve bench serve` after option parsing: build the prompts, run, print vLLM's block, save
// the JSON. Kept out of src/cli so tests can drive it against an in-process server.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"
#include "bench/metrics.h"

namespace sieve::bench {

struct ServeOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;          // empty: the first of /v1/models
  std::string tokenizer_dir;  // empty: none
  std::string label;          // empty: "openai" or "openai-chat" (vLLM's backend names)
  std::string dataset_name = "random";
  std::string dataset_path;  // gsm8k: default data/gsm8k/test.jsonl of the source tree
  int random_input_len = 1024, random_output_len = 128, random_prefix_len = 0;
  double random_range_ratio = 0.0;
  std::string range_ratio_mode = "vllm";
  int random_vocab_size = 1000;
  int output_len = 256;  // gsm8k / jsonl rows without their own length
  int num_prompts = 1000;
  std::optional<int> max_concurrency;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::vector<std::string> percentile_metrics{"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles{99};
  std::string goodput;  // "ttft:500 tpot:50"
  int num_warmups = 0;
  uint64_t seed = 0;
  bool save_result = false, save_detailed = false;
  std::string result_dir, result_filename;
  bool progress = false;
  ClientOptions client;
};

struct ServeOutcome {
  nlohmann::ordered_json result;  // what --save-result writes
  std::string saved_path;         // empty when not saved
  bool interrupted = false;
};

// Comma lists as vLLM takes them: "ttft,tpot,itl" and "50,90,99".
std::vector<std::string> parse_metric_list(const std::string& s);
std::vector<double> parse_percentile_list(const std::string& s);

// Prints progress notes and the result block to `out`. Throws Error for bad options or an
// unreachable server before the run; failed requests during the run are counted, not thrown.
ServeOutcome run_serve(const ServeOptions& o, std::atomic<bool>* stop, std::ostream& out);

}  // namespace sieve::bench
