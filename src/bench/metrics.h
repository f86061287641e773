// Serving-benchmark metrics computed from plain per-request records, defined as vLLM's
// `vllm bench serve` defines them (see docs/benchmarking.md and the serving-benchmark spec).
// Nothing here touches the network: a record is what one streamed request looked like.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace sieve::bench {

// One request as the client saw it. Times are seconds on one monotonic clock.
struct RequestRecord {
  double arrival_time = 0;          // when the schedule released it (before the client queue)
  double start_time = 0;            // just before the POST
  std::vector<double> chunk_times;  // arrival of each SSE data chunk that carried `choices`
  int prompt_len = 0;               // input tokens
  int output_tokens = -1;           // usage.completion_tokens; -1 when the server sent none
  int fallback_output_tokens = -1;  // count used when usage is missing (re-tokenized text)
  std::string generated_text;
  std::string error;  // empty on success

  // A request succeeded when no error was recorded and at least one choice chunk arrived
  // (vLLM: "Never received a valid chunk to calculate TTFT" otherwise).
  bool success() const { return error.empty() && !chunk_times.empty(); }
  double ttft() const { return success() ? chunk_times.front() - start_time : 0.0; }
  double latency() const { return success() ? chunk_times.back() - start_time : 0.0; }
  std::vector<double> itls() const;  // per chunk, not per token
  int output_len() const;            // usage, else fallback, else 1 (vLLM's rule); 0 if failed
  double queue_time() const { return start_time - arrival_time; }
};

// numpy-style statistics (population std, linear-interpolation percentiles); all 0 when empty,
// as numpy does for `values or 0`.
double mean_of(const std::vector<double>& v);
double median_of(const std::vector<double>& v);
double std_of(const std::vector<double>& v);
double percentile_of(std::vector<double> v, double p);

struct MetricStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct Metrics {
  int completed = 0, failed = 0;
  long long total_input = 0, total_output = 0;
  double request_throughput = 0, request_goodput = 0, output_throughput = 0,
         total_token_throughput = 0;
  MetricStats ttft, tpot, itl, e2el;
  // Client-side wait for a --max-concurrency slot, and E2EL including it (successful requests).
  MetricStats client_queue_time, e2el_including_client_queue;
  double max_output_tokens_per_s = 0;
  int max_concurrent_requests = 0;
  std::vector<int> output_lens;  // per request, 0 for failed ones
};

// SLOs in milliseconds, keys ttft, tpot, e2el.
using GoodputConfig = std::map<std::string, double>;

Metrics compute_metrics(const std::vector<RequestRecord>& records, double duration_s,
                        const std::vector<double>& percentiles, const GoodputConfig& goodput);

// Parses "ttft:100 tpot:50" (space or comma separated); throws Error on bad names or values.
GoodputConfig parse_goodput(const std::string& spec);

// "99" -> "99", 99.9 -> "99.9": the label vLLM puts in "P99 TTFT (ms)" and "p99_ttft_ms".
std::string percentile_word(double p);

}  // namespace sieve::bench
