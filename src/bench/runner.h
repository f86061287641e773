// Drives a serving benchmark: releases requests on vLLM's schedule (all at t=0, or Poisson /
// gamma arrivals), holds at most --max-concurrency in flight, streams each one and records it.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/http_client.h"
#include "bench/metrics.h"

namespace sieve::bench {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::optional<int> max_concurrency;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  bool ignore_eos = false;
  std::optional<double> temperature;
  int num_warmups = 0;
  uint64_t seed = 0;
  ClientOptions client;
  bool progress = false;           // a bar on a terminal (stderr), else a log line every few seconds
  const TextCodec* tok = nullptr;  // counts output tokens when usage is missing
};

bool is_chat_endpoint(const std::string& endpoint);

// The JSON body of one streamed request.
nlohmann::json make_payload(const SampleRequest& r, const BenchConfig& c);

// Release times (seconds from the start) of n requests: all 0 for an infinite rate; otherwise
// gamma-distributed gaps (shape = burstiness, mean 1/rate; burstiness 1 is Poisson), scaled so
// the last release falls at n/rate as vLLM does; burstiness = inf gives even spacing.
std::vector<double> release_times(int n, double rate, double burstiness, uint64_t seed);

struct BenchRun {
  std::vector<RequestRecord> records;  // in request order; only requests that finished
  double duration_s = 0;               // first release to last completion
  bool interrupted = false;
};

// `stop` (optional) ends the run early: no new requests start, streams in flight are cut and
// left out, and the records so far come back. Progress and notes go to `log`.
BenchRun run_benchmark(const std::vector<SampleRequest>& reqs, const BenchConfig& c,
                       std::atomic<bool>* stop, std::ostream& log);

}  // namespace sieve::bench
