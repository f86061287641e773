// Counters and latency histograms the engine keeps for /metrics (Prometheus semantics:
// cumulative buckets, _sum and _count).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sieve::engine {

struct Histogram {
  std::vector<double> bounds;    // upper bounds, ascending (+Inf implied)
  std::vector<uint64_t> counts;  // per bucket (not cumulative), size bounds + 1
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {})
      : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

// Latency buckets in seconds, as vLLM uses for TTFT / inter-token / end-to-end.
std::vector<double> ttft_buckets();
std::vector<double> itl_buckets();
std::vector<double> e2e_buckets();

struct EngineStats {
  int64_t num_running = 0, num_waiting = 0;
  int64_t num_blocks = 0, num_free_blocks = 0, block_size = 0;
  double kv_usage = 0;  // fraction of blocks in use
  uint64_t prompt_tokens = 0, generation_tokens = 0, preemptions = 0, steps = 0;
  uint64_t prefix_query_tokens = 0, prefix_hit_tokens = 0;
  uint64_t finished_stop = 0, finished_length = 0, finished_abort = 0, finished_error = 0;
  // Steps that failed in a row (0 after a step that ran), and the last failure's message: a
  // device that fails every step (a lost GPU context) makes /health answer 503.
  int64_t consecutive_failed_steps = 0;
  std::string last_step_error;
  // Set when the engine can run no more steps (its tensor-parallel group broke): every request
  // in flight has ended with an error and new ones are refused; the server answers 503 and stops.
  std::string fatal_error;
  Histogram ttft{ttft_buckets()}, itl{itl_buckets()}, e2e{e2e_buckets()};
  // Speculative decoding (vLLM's spec_decode_* counters): verified drafts, their draft tokens,
  // the ones kept, and kept ones per draft position. Exported only when speculative decoding is
  // on (spec_enabled), as vLLM does, so a dashboard can tell "off" from "nothing accepted".
  bool spec_enabled = false;
  uint64_t spec_num_drafts = 0, spec_num_draft_tokens = 0, spec_num_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_pos;
  // EAGLE3: prompt rows the draft ran over, and probes of speculation made in plain mode.
  uint64_t spec_draft_prompt_rows = 0, spec_probes = 0;
};

// vLLM's periodic log line for the `seconds` between two snapshots: average prompt and
// generation throughput, running and waiting requests, cache usage, prefix-cache hit rate over
// the interval. Empty when nothing ran, waited or was computed in it (an idle server is quiet).
std::string stats_log_line(const EngineStats& before, const EngineStats& now, double seconds);

}  // namespace sieve::engine
