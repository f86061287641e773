#include "bench/serve.h"

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

#include "bench/dataset.h"
#include "bench/report.h"
#include "bench/runner.h"
#include "core/error.h"

#ifndef SIEVE_SOURCE_DIR
#define SIEVE_SOURCE_DIR "."
#endif

namespace sieve::bench {

std::vector<std::string> parse_metric_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    if (item != "ttft" && item != "tpot" && item != "itl" && item != "e2el" &&
        item != "client_queue_time" && item != "e2el_including_client_queue")
      throw Error("--percentile-metrics: unknown metric \"" + item +
                  "\" (ttft, tpot, itl, e2el, client_queue_time, e2el_including_client_queue)");
    out.push_back(item);
  }
  return out;
}

std::vector<double> parse_percentile_list(const std::string& s) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    try {
      size_t pos = 0;
      double p = std::stod(item, &pos);
      if (pos != item.size() || !(p >= 0 && p <= 100)) throw std::invalid_argument("range");
      out.push_back(p);
    } catch (const std::exception&) {
      throw Error("--metric-percentiles: \"" + item + "\" is not a percentile in [0, 100]");
    }
  }
  return out;
}

namespace {

std::string now_stamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

}  // namespace

ServeOutcome run_serve(const ServeOptions& o, std::atomic<bool>* stop, std::ostream& out) {
  if (o.num_prompts < 1) throw Error("--num-prompts must be at least 1");
  if (o.max_concurrency && *o.max_concurrency <= 0)
    throw Error("--max-concurrency must be greater than 0");
  const bool chat = is_chat_endpoint(o.endpoint);
  if (o.endpoint != "/v1/completions" && o.endpoint != "/v1/chat/completions")
    throw Error("--endpoint must be /v1/completions or /v1/chat/completions, got " + o.endpoint);
  GoodputConfig goodput = parse_goodput(o.goodput);

  std::unique_ptr<TextCodec> tok;
  if (!o.tokenizer_dir.empty()) tok = load_tokenizer(o.tokenizer_dir);

  std::string model = o.model;
  if (model.empty()) {
    out << "Model not specified, fetching first model from server..." << std::endl;
    model = first_model(o.base_url, o.client);
    out << "First model name: " << model << ", first model id: " << model << std::endl;
  }

  std::vector<SampleRequest> reqs;
  bool ignore_eos = o.ignore_eos;
  if (o.dataset_name == "random") {
    if (!o.dataset_path.empty()) throw Error("--dataset-name random takes no --dataset-path");
    RandomConfig rc;
    rc.input_len = o.random_input_len;
    rc.output_len = o.random_output_len;
    rc.prefix_len = o.random_prefix_len;
    rc.range_ratio = o.random_range_ratio;
    rc.mode = parse_range_mode(o.range_ratio_mode);
    rc.vocab_size = o.random_vocab_size;
    rc.num_prompts = o.num_prompts;
    rc.seed = o.seed;
    reqs = random_dataset(rc, tok.get());
    if (chat && !tok)
      throw Error(
          "--dataset-name random with " + o.endpoint +
          " needs --tokenizer (chat messages are text; token-id prompts need /v1/completions)");
    // As vLLM: random prompts run to their sampled length.
    ignore_eos = true;
  } else if (o.dataset_name == "gsm8k") {
    std::string path = o.dataset_path.empty()
                           ? std::string(SIEVE_SOURCE_DIR) + "/data/gsm8k/test.jsonl"
                           : o.dataset_path;
    reqs = gsm8k_dataset(path, o.num_prompts, o.output_len, o.seed, tok.get());
  } else if (o.dataset_name == "jsonl") {
    if (o.dataset_path.empty()) throw Error("--dataset-name jsonl needs --dataset-path FILE");
    reqs = jsonl_dataset(o.dataset_path, o.num_prompts, o.output_len, o.seed, tok.get());
  } else {
    throw Error("--dataset-name must be random, gsm8k or jsonl, got \"" + o.dataset_name + "\"");
  }

  BenchConfig c;
  c.base_url = o.base_url;
  c.endpoint = o.endpoint;
  c.model = model;
  c.max_concurrency = o.max_concurrency;
  c.request_rate = o.request_rate;
  c.burstiness = o.burstiness;
  c.ignore_eos = ignore_eos;
  c.temperature = o.temperature;
  c.num_warmups = o.num_warmups;
  c.seed = o.seed;
  c.client = o.client;
  c.progress = o.progress;
  c.tok = tok.get();
  BenchRun run = run_benchmark(reqs, c, stop, out);

  ReportOptions ro;
  ro.max_concurrency = o.max_concurrency;
  ro.request_rate = o.request_rate;
  ro.duration_s = run.duration_s;
  ro.percentile_metrics = o.percentile_metrics;
  ro.percentiles = o.metric_percentiles;
  ro.goodput = !goodput.empty();
  Metrics m = compute_metrics(run.records, run.duration_s, o.metric_percentiles, goodput);

  if (run.interrupted)
    out << "Interrupted: results of the " << run.records.size() << " requests that finished"
        << std::endl;
  int shown = 0;
  for (const auto& r : run.records) {
    if (r.success()) continue;
    if (shown == 0)
      out << "Failed requests during benchmark run detected (capping to 10):" << std::endl;
    if (shown < 10) out << "Error " << shown << ": " << r.error << std::endl;
    ++shown;
  }
  out << format_report(m, ro) << std::flush;

  ServeOutcome res;
  res.interrupted = run.interrupted;
  std::string label = o.label.empty() ? (chat ? "openai-chat" : "openai") : o.label;
  std::string date = now_stamp();
  nlohmann::ordered_json j;
  j["date"] = date;
  j["endpoint_type"] = chat ? "openai-chat" : "openai";
  j["backend"] = chat ? "openai-chat" : "openai";
  j["label"] = o.label.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.label);
  j["model_id"] = model;
  j["tokenizer_id"] = o.tokenizer_dir.empty() ? nlohmann::ordered_json(nullptr)
                                              : nlohmann::ordered_json(o.tokenizer_dir);
  j["num_prompts"] = o.num_prompts;
  j["request_rate"] = std::isinf(o.request_rate) ? nlohmann::ordered_json("inf")
                                                 : nlohmann::ordered_json(o.request_rate);
  j["burstiness"] = o.burstiness;
  j["max_concurrency"] = o.max_concurrency ? nlohmann::ordered_json(*o.max_concurrency)
                                           : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json bench = benchmark_json(m, run.records, ro);
  for (auto& [k, v] : bench.items()) j[k] = v;
  if (!o.save_detailed)
    for (const auto& k : detailed_fields()) j.erase(k);
  res.result = j;

  if (o.save_result) {
    std::string name =
        o.result_filename.empty()
            ? default_result_filename(label, o.request_rate, o.max_concurrency, model, date)
            : o.result_filename;
    std::filesystem::path p(name);
    if (!o.result_dir.empty()) {
      std::filesystem::create_directories(o.result_dir);
      p = std::filesystem::path(o.result_dir) / name;
    }
    std::ofstream f(p);
    if (!f) throw Error("cannot write result file " + p.string());
    f << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    res.saved_path = p.string();
  }
  return res;
}

}  // namespace sieve::bench
