#include "engine/metrics.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace sieve::engine {

void Histogram::observe(double v) {
  size_t i = size_t(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++counts[i];
  sum += v;
  ++count;
}

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
}
std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> e2e_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0, 15.0,
          20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
}

std::string stats_log_line(const EngineStats& before, const EngineStats& now, double seconds) {
  const uint64_t prompt = now.prompt_tokens - before.prompt_tokens;
  const uint64_t gen = now.generation_tokens - before.generation_tokens;
  if (prompt == 0 && gen == 0 && now.num_running == 0 && now.num_waiting == 0) return {};
  const double s = seconds > 0 ? seconds : 1.0;
  const uint64_t queried = now.prefix_query_tokens - before.prefix_query_tokens;
  const uint64_t hit = now.prefix_hit_tokens - before.prefix_hit_tokens;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %lld "
                "reqs, Waiting: %lld reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                double(prompt) / s, double(gen) / s, static_cast<long long>(now.num_running),
                static_cast<long long>(now.num_waiting), 100.0 * now.kv_usage,
                queried ? 100.0 * double(hit) / double(queried) : 0.0);
  std::string line = buf;
  // Speculative decoding over the interval, as vLLM's "SpecDecoding metrics" line.
  const uint64_t drafts = now.spec_num_drafts - before.spec_num_drafts;
  if (drafts > 0) {
    const uint64_t drafted = now.spec_num_draft_tokens - before.spec_num_draft_tokens;
    const uint64_t accepted = now.spec_num_accepted_tokens - before.spec_num_accepted_tokens;
    std::snprintf(buf, sizeof buf,
                  ", Spec decode: mean acceptance length %.2f, accepted %llu of %llu draft tokens (%.1f%%), "
                  "per-position acceptance",
                  1.0 + double(accepted) / double(drafts), static_cast<unsigned long long>(accepted),
                  static_cast<unsigned long long>(drafted), drafted ? 100.0 * double(accepted) / double(drafted) : 0.0);
    line += buf;
    for (size_t i = 0; i < now.spec_accepted_per_pos.size(); ++i) {
      const uint64_t a = now.spec_accepted_per_pos[i] - (i < before.spec_accepted_per_pos.size() ? before.spec_accepted_per_pos[i] : 0);
      std::snprintf(buf, sizeof buf, "%s%.2f", i ? ", " : " ", double(a) / double(drafts));
      line += buf;
    }
  }
  return line;
}

}  // namespace sieve::engine
