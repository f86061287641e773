// The dashboard's data: the server's own Prometheus metrics sampled every second into a ring of
// the last minutes, so a page opened now still draws what happened before it. Samples are taken
// from the exposition text, so a metric that /metrics gains (speculative acceptance, say)
// reaches the dashboard without changes here.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sieve::server {

// Samples of the Prometheus text exposition format: "name{labels} value" per line. The label
// `model_name` is dropped (one model per server); other labels stay in the key, as
// `name{le="0.5"}`. Comments, blank lines and lines that do not parse are skipped.
std::vector<std::pair<std::string, double>> parse_prometheus(std::string_view text);

class MetricsHistory {
 public:
  // `source` returns the current exposition text; it is called from the sampling thread.
  MetricsHistory(std::function<std::string()> source, double period_s = 1.0, size_t capacity = 900);
  ~MetricsHistory();
  MetricsHistory(const MetricsHistory&) = delete;
  MetricsHistory& operator=(const MetricsHistory&) = delete;

  // Starts the sampling thread (a sample now, then one every period).
  void start();
  void stop();
  // Takes one sample now (the thread does this every period).
  void sample();

  // {"period_s", "now", "t": [unix seconds...], "series": {name: [values...]}} for the samples
  // taken after `after` (unix seconds; 0: all kept). A series missing from a sample is null there.
  nlohmann::json json_since(double after) const;

 private:
  struct Sample {
    double t;
    std::vector<double> values;  // by column; NaN where the series was absent
  };
  void loop();

  std::function<std::string()> source_;
  double period_s_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, size_t> column_;
  std::vector<std::string> names_;
  std::deque<Sample> samples_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sieve::server
