#include <sstream>

#include "server/server.h"

namespace sieve::server {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

void header(std::ostringstream& os, const char* name, const char* type, const char* help) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

void histogram(std::ostringstream& os, const char* name, const char* help,
               const engine::Histogram& h, const std::string& labels) {
  header(os, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    os << name << "_bucket{" << labels << ",le=\"" << h.bounds[i] << "\"} " << cum << '\n';
  }
  cum += h.counts.back();
  os << name << "_bucket{" << labels << ",le=\"+Inf\"} " << cum << '\n';
  os << name << "_sum{" << labels << "} " << h.sum << '\n';
  os << name << "_count{" << labels << "} " << h.count << '\n';
}

}  // namespace

std::string prometheus_text(const engine::EngineStats& s, const std::string& model_name) {
  std::ostringstream os;
  os.precision(10);
  const std::string l = "model_name=\"" + esc(model_name) + "\"";
  auto gauge = [&](const char* name, const char* help, double v) {
    header(os, name, "gauge", help);
    os << name << '{' << l << "} " << v << '\n';
  };
  auto counter = [&](const char* name, const char* help, double v) {
    header(os, name, "counter", help);
    os << name << '{' << l << "} " << v << '\n';
  };
  gauge("sieve:num_requests_running", "Requests in the running batch.", double(s.num_running));
  gauge("sieve:num_requests_waiting",
        "Requests waiting to be scheduled (including preempted ones).", double(s.num_waiting));
  gauge("sieve:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", s.kv_usage);
  gauge("sieve:kv_cache_blocks_total",
        "KV cache blocks (each holds block_size tokens of every layer).", double(s.num_blocks));
  gauge("sieve:kv_cache_blocks_free", "KV cache blocks not held by any request.",
        double(s.num_free_blocks));
  gauge("sieve:kv_cache_blocks_used", "KV cache blocks held by requests.",
        double(s.num_blocks - s.num_free_blocks));
  counter("sieve:prompt_tokens_total", "Prompt tokens processed (counted once per request).",
          double(s.prompt_tokens));
  counter("sieve:generation_tokens_total", "Tokens generated.", double(s.generation_tokens));
  counter("sieve:num_preemptions_total",
          "Requests preempted (recomputed later) because the KV cache ran out.",
          double(s.preemptions));
  counter("sieve:engine_steps_total", "Engine steps run.", double(s.steps));
  counter("sieve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          double(s.prefix_query_tokens));
  counter("sieve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          double(s.prefix_hit_tokens));
  // The rate over any window is the ratio of the two counters' increases; this is since start.
  gauge("sieve:prefix_cache_hit_rate", "Fraction of looked-up prompt tokens found in the prefix cache since start.",
        s.prefix_query_tokens ? double(s.prefix_hit_tokens) / double(s.prefix_query_tokens) : 0.0);
  header(os, "sieve:request_success_total", "counter", "Finished requests by finish reason.");
  os << "sieve:request_success_total{" << l << ",finished_reason=\"stop\"} " << s.finished_stop
     << '\n';
  os << "sieve:request_success_total{" << l << ",finished_reason=\"length\"} " << s.finished_length
     << '\n';
  os << "sieve:request_success_total{" << l << ",finished_reason=\"abort\"} " << s.finished_abort
     << '\n';
  os << "sieve:request_success_total{" << l << ",finished_reason=\"error\"} " << s.finished_error
     << '\n';
  // Speculative decoding, by vLLM's names (prometheus_client exposes a counter NAME as
  // NAME_total), so dashboards made for vLLM read them.
  auto vllm_counter = [&](const char* name, const char* help, uint64_t v) {
    header(os, name, "counter", help);
    os << name << "_total{" << l << "} " << v << '\n';
  };
  vllm_counter("vllm:spec_decode_num_drafts", "Draft proposals checked by the target.", s.spec_num_drafts);
  vllm_counter("vllm:spec_decode_num_draft_tokens", "Draft tokens checked by the target.", s.spec_num_draft_tokens);
  vllm_counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens the target kept.", s.spec_num_accepted_tokens);
  header(os, "vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Draft tokens the target kept, by position.");
  for (size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i)
    os << "vllm:spec_decode_num_accepted_tokens_per_pos_total{" << l << ",position=\"" << i << "\"} "
       << s.spec_accepted_per_pos[i] << '\n';
  histogram(os, "sieve:time_to_first_token_seconds",
            "Time from arrival to the first generated token.", s.ttft, l);
  histogram(os, "sieve:inter_token_latency_seconds", "Time between consecutive generated tokens.",
            s.itl, l);
  histogram(os, "sieve:e2e_request_latency_seconds",
            "Time from arrival to the end of a finished request.", s.e2e, l);
  return os.str();
}

}  // namespace sieve::server
