#include "bench/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace sieve::bench {

std::vector<double> RequestRecord::itls() const {
  std::vector<double> out;
  if (!success()) return out;
  for (size_t i = 1; i < chunk_times.size(); ++i)
    out.push_back(chunk_times[i] - chunk_times[i - 1]);
  return out;
}

int RequestRecord::output_len() const {
  if (!success()) return 0;
  if (output_tokens > 0) return output_tokens;
  if (fallback_output_tokens > 0) return fallback_output_tokens;
  return 1;
}

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

double std_of(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size()));
}

double percentile_of(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double rank = p / 100.0 * double(v.size() - 1);
  size_t lo = size_t(std::floor(rank));
  size_t hi = std::min(lo + 1, v.size() - 1);
  double frac = rank - double(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

double median_of(const std::vector<double>& v) {
  return percentile_of(v, 50.0);
}

namespace {

MetricStats stats_ms(const std::vector<double>& seconds, const std::vector<double>& percentiles) {
  MetricStats s;
  s.mean_ms = mean_of(seconds) * 1000.0;
  s.median_ms = median_of(seconds) * 1000.0;
  s.std_ms = std_of(seconds) * 1000.0;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile_of(seconds, p) * 1000.0);
  return s;
}

}  // namespace

Metrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                        const std::vector<double>& percentiles, const GoodputConfig& goodput) {
  Metrics m;
  std::vector<double> ttfts, tpots, all_tpots, itls, e2els, queues, e2els_q;
  for (const auto& r : records) {
    if (!r.success()) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    int out = r.output_len();
    m.output_lens.push_back(out);
    m.total_input += r.prompt_len;
    m.total_output += out;
    double tpot = 0.0;  // requests with one output token count as 0 for goodput only
    if (out > 1) {
      tpot = (r.latency() - r.ttft()) / double(out - 1);
      tpots.push_back(tpot);
    }
    all_tpots.push_back(tpot);
    for (double g : r.itls()) itls.push_back(g);
    ttfts.push_back(r.ttft());
    e2els.push_back(r.latency());
    queues.push_back(r.queue_time());
    e2els_q.push_back(r.latency() + r.queue_time());
    ++m.completed;
  }

  if (!goodput.empty()) {
    int good = 0;
    for (size_t i = 0; i < ttfts.size(); ++i) {
      bool ok = true;
      for (const auto& [name, slo_ms] : goodput) {
        double v = name == "ttft" ? ttfts[i] : name == "tpot" ? all_tpots[i] : e2els[i];
        if (v > slo_ms / 1000.0) ok = false;
      }
      good += ok;
    }
    m.request_goodput = duration_s > 0 ? good / duration_s : 0.0;
  }

  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = double(m.total_output) / duration_s;
    m.total_token_throughput = double(m.total_input + m.total_output) / duration_s;
  }
  m.ttft = stats_ms(ttfts, percentiles);
  m.tpot = stats_ms(tpots, percentiles);
  m.itl = stats_ms(itls, percentiles);
  m.e2el = stats_ms(e2els, percentiles);
  m.client_queue_time = stats_ms(queues, percentiles);
  m.e2el_including_client_queue = stats_ms(e2els_q, percentiles);

  // Peak output tokens per second: one stamp per chunk (first chunk + each ITL), in 1-s buckets
  // from the earliest successful start, as vLLM counts it.
  double min_start = 0, max_end = 0;
  bool any = false;
  for (const auto& r : records) {
    if (!r.success()) continue;
    double end = r.start_time + r.latency();
    if (!any || r.start_time < min_start) min_start = r.start_time;
    if (!any || end > max_end) max_end = end;
    any = true;
  }
  if (any) {
    size_t buckets = size_t(std::ceil(max_end - min_start)) + 1;
    std::vector<double> per_second(buckets, 0.0);
    std::vector<std::pair<double, int>> events;
    for (const auto& r : records) {
      if (!r.success()) continue;
      for (double t : r.chunk_times) {
        long long b = (long long)(t - min_start);  // truncation, as Python's int()
        if (b >= 0 && b < (long long)buckets) per_second[size_t(b)] += 1;
      }
      events.emplace_back(r.start_time, +1);
      events.emplace_back(r.start_time + r.latency(), -1);
    }
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
    // Half-open [start, end): at equal times a departure precedes an arrival.
    std::sort(events.begin(), events.end());
    int cur = 0;
    for (const auto& e : events) {
      cur += e.second;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, cur);
    }
  }
  return m;
}

GoodputConfig parse_goodput(const std::string& spec) {
  GoodputConfig g;
  std::string s = spec;
  for (char& c : s)
    if (c == ',') c = ' ';
  std::istringstream in(s);
  std::string item;
  while (in >> item) {
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw Error("--goodput: \"" + item + "\" is not KEY:VALUE (e.g. ttft:500 tpot:50, in ms)");
    std::string key = item.substr(0, colon), val = item.substr(colon + 1);
    if (key != "ttft" && key != "tpot" && key != "e2el")
      throw Error("--goodput: unknown metric \"" + key + "\"; expected ttft, tpot or e2el");
    double v = 0;
    try {
      size_t pos = 0;
      v = std::stod(val, &pos);
      if (pos != val.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw Error("--goodput: value of " + key + " must be a number of ms, got \"" + val + "\"");
    }
    if (v < 0) throw Error("--goodput: value of " + key + " must be non-negative");
    g[key] = v;
  }
  return g;
}

std::string percentile_word(double p) {
  if (double(static_cast<long long>(p)) == p) return std::to_string(static_cast<long long>(p));
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, p);
  return std::string(buf, res.ptr);
}

}  // namespace sieve::bench
