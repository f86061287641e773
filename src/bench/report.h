// The printed result block and the saved JSON of `sieve bench serve`, with vLLM's labels, order,
// widths and field names, so that reports from either tool can be set side by side.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/metrics.h"

namespace sieve::bench {

struct ReportOptions {
  std::optional<int> max_concurrency;
  double request_rate = 0;  // +inf: not printed
  double duration_s = 0;
  std::vector<std::string> percentile_metrics{"ttft", "tpot", "itl"};
  std::vector<double> percentiles{99};
  bool goodput = false;
};

// "{:<40} {:<10}"-style lines between 50-character rules, ending with a newline.
std::string format_report(const Metrics& m, const ReportOptions& o);

// The benchmark part of the result (vLLM's `benchmark()` return value): counts, throughputs,
// per-request arrays, then mean/median/std/pNN per selected metric, in vLLM's key order.
nlohmann::ordered_json benchmark_json(const Metrics& m, const std::vector<RequestRecord>& records,
                                      const ReportOptions& o);

// Keys that --save-detailed keeps and a plain --save-result drops.
const std::vector<std::string>& detailed_fields();

// Python's str(float): 4.0 -> "4.0", inf -> "inf", 0.1 -> "0.1".
std::string python_float(double v);

// {label}-{rate}qps[-concurrency{N}]-{model basename}-{YYYYmmdd-HHMMSS}.json
std::string default_result_filename(const std::string& label, double request_rate,
                                    std::optional<int> max_concurrency, const std::string& model_id,
                                    const std::string& date);

// Lines "{:=^50}" / "{:-^50}": the title centred, left padding rounded down.
std::string centered(const std::string& title, char fill, int width = 50);

}  // namespace sieve::bench
