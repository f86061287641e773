#include "bench/report.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace sieve::bench {

namespace {

std::string line_int(const std::string& label, long long v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-40s %-10lld\n", label.c_str(), v);
  return buf;
}

std::string line_f2(const std::string& label, double v) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-40s %-10.2f\n", label.c_str(), v);
  return buf;
}

bool selected(const ReportOptions& o, const std::string& name) {
  for (const auto& s : o.percentile_metrics)
    if (s == name) return true;
  return false;
}

const MetricStats& stats_for(const Metrics& m, const std::string& name) {
  if (name == "ttft") return m.ttft;
  if (name == "tpot") return m.tpot;
  if (name == "itl") return m.itl;
  if (name == "client_queue_time") return m.client_queue_time;
  if (name == "e2el_including_client_queue") return m.e2el_including_client_queue;
  return m.e2el;
}

struct MetricSection {
  const char* key;
  const char* name;
  const char* header;
};
constexpr MetricSection kSections[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
    {"client_queue_time", "Client Queue Time", "Client-side Queueing"},
    {"e2el_including_client_queue", "E2EL incl. Client Queue",
     "Queue-inclusive End-to-end Latency"},
};

// vLLM reports the queue metrics only when a concurrency limit can make requests wait, and the
// queue-inclusive latency only when requests also arrive over time.
bool applicable(const ReportOptions& o, const std::string& key) {
  if (key == "client_queue_time") return o.max_concurrency.has_value();
  if (key == "e2el_including_client_queue")
    return o.max_concurrency.has_value() && !std::isinf(o.request_rate);
  return true;
}

}  // namespace

std::string centered(const std::string& title, char fill, int width) {
  int pad = width - int(title.size());
  if (pad <= 0) return title;
  int left = pad / 2;
  return std::string(left, fill) + title + std::string(pad - left, fill);
}

std::string format_report(const Metrics& m, const ReportOptions& o) {
  std::string s = centered(" Serving Benchmark Result ", '=') + "\n";
  s += line_int("Successful requests:", m.completed);
  s += line_int("Failed requests:", m.failed);
  if (o.max_concurrency) s += line_int("Maximum request concurrency:", *o.max_concurrency);
  if (!std::isinf(o.request_rate)) s += line_f2("Request rate configured (RPS):", o.request_rate);
  s += line_f2("Benchmark duration (s):", o.duration_s);
  s += line_int("Total input tokens:", m.total_input);
  s += line_int("Total generated tokens:", m.total_output);
  s += line_f2("Request throughput (req/s):", m.request_throughput);
  if (o.goodput) s += line_f2("Request goodput (req/s):", m.request_goodput);
  s += line_f2("Output token throughput (tok/s):", m.output_throughput);
  s += line_f2("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  s += line_f2("Peak concurrent requests:", m.max_concurrent_requests);
  s += line_f2("Total token throughput (tok/s):", m.total_token_throughput);
  for (const auto& sec : kSections) {
    if (!selected(o, sec.key) || !applicable(o, sec.key)) continue;
    const MetricStats& st = stats_for(m, sec.key);
    s += centered(sec.header, '-') + "\n";
    s += line_f2(std::string("Mean ") + sec.name + " (ms):", st.mean_ms);
    s += line_f2(std::string("Median ") + sec.name + " (ms):", st.median_ms);
    for (const auto& [p, v] : st.percentiles_ms)
      s += line_f2("P" + percentile_word(p) + " " + sec.name + " (ms):", v);
  }
  s += std::string(50, '=') + "\n";
  return s;
}

nlohmann::ordered_json benchmark_json(const Metrics& m, const std::vector<RequestRecord>& records,
                                      const ReportOptions& o) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["duration"] = o.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = o.goodput ? ordered_json(m.request_goodput) : ordered_json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  ordered_json input_lens = ordered_json::array(), ttfts = ordered_json::array(),
               itls = ordered_json::array(), latencies = ordered_json::array(),
               starts = ordered_json::array(), queues = ordered_json::array(),
               texts = ordered_json::array(), errors = ordered_json::array();
  for (const auto& r : records) {
    input_lens.push_back(r.prompt_len);
    ttfts.push_back(r.ttft());
    itls.push_back(r.itls());
    latencies.push_back(r.latency());
    starts.push_back(r.start_time);
    queues.push_back(r.queue_time());
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
  }
  j["input_lens"] = input_lens;
  j["output_lens"] = m.output_lens;
  j["ttfts"] = ttfts;
  j["itls"] = itls;
  j["latencies"] = latencies;
  j["start_times"] = starts;
  j["queue_times"] = queues;
  j["generated_texts"] = texts;
  j["errors"] = errors;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  j["rtfx"] = 0.0;
  for (const auto& sec : kSections) {
    if (!selected(o, sec.key) || !applicable(o, sec.key)) continue;
    const MetricStats& st = stats_for(m, sec.key);
    std::string k = sec.key;
    j["mean_" + k + "_ms"] = st.mean_ms;
    j["median_" + k + "_ms"] = st.median_ms;
    j["std_" + k + "_ms"] = st.std_ms;
    for (const auto& [p, v] : st.percentiles_ms) j["p" + percentile_word(p) + "_" + k + "_ms"] = v;
  }
  return j;
}

const std::vector<std::string>& detailed_fields() {
  static const std::vector<std::string> f{"input_lens", "output_lens",     "start_times", "ttfts",
                                          "itls",       "generated_texts", "errors"};
  return f;
}

std::string python_float(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string default_result_filename(const std::string& label, double request_rate,
                                    std::optional<int> max_concurrency, const std::string& model_id,
                                    const std::string& date) {
  std::string base = model_id;
  auto slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  std::string conc = max_concurrency ? "-concurrency" + std::to_string(*max_concurrency) : "";
  return label + "-" + python_float(request_rate) + "qps" + conc + "-" + base + "-" + date +
         ".json";
}

}  // namespace sieve::bench
