#include "bench/runner.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <thread>

#include "bench/report.h"
#include "core/error.h"
#include "core/progress.h"

namespace sieve::bench {

bool is_chat_endpoint(const std::string& endpoint) {
  return endpoint.find("chat/completions") != std::string::npos;
}

nlohmann::json make_payload(const SampleRequest& r, const BenchConfig& c) {
  nlohmann::json p;
  p["model"] = c.model;
  if (is_chat_endpoint(c.endpoint)) {
    if (r.use_ids)
      throw Error(
          "--endpoint " + c.endpoint +
          " takes text prompts; token-id prompts need /v1/completions (or give --tokenizer)");
    p["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.text}}});
    p["max_completion_tokens"] = r.output_len;
  } else {
    if (r.use_ids)
      p["prompt"] = r.token_ids;
    else
      p["prompt"] = r.text;
    p["max_tokens"] = r.output_len;
  }
  if (c.temperature) p["temperature"] = *c.temperature;
  p["stream"] = true;
  p["stream_options"] = {{"include_usage", true}};
  if (c.ignore_eos) p["ignore_eos"] = true;
  return p;
}

std::vector<double> release_times(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(size_t(std::max(n, 0)), 0.0);
  if (n <= 0 || std::isinf(rate)) return t;
  if (!(rate > 0)) throw Error("--request-rate must be positive or inf");
  if (!(burstiness > 0)) throw Error("--burstiness must be positive");
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  double acc = 0;
  for (int i = 0; i < n; ++i) {
    double gap;
    if (std::isinf(burstiness)) {
      gap = 1.0 / rate;
    } else {
      std::gamma_distribution<double> g(burstiness, 1.0 / (rate * burstiness));
      gap = g(rng);
    }
    acc += gap;
    t[size_t(i)] = acc;
  }
  if (t.back() > 0) {
    double scale = (double(n) / rate) / t.back();
    for (double& x : t) x *= scale;
  }
  return t;
}

namespace {

void run_one(HttpSession& s, const SampleRequest& r, const BenchConfig& c, double arrival,
             const std::atomic<bool>* cancel, RequestRecord& rec) {
  rec.arrival_time = arrival;
  rec.prompt_len = r.prompt_len;
  StreamState st;
  st.chat = is_chat_endpoint(c.endpoint);
  std::string body = make_payload(r, c).dump();
  s.stream_post(c.endpoint, body, st, rec, cancel);
  if (rec.prompt_len == 0 && st.usage_prompt_tokens >= 0) rec.prompt_len = st.usage_prompt_tokens;
  if (rec.output_tokens < 0 && rec.success()) {
    // No usage in the stream: re-tokenize the text (vLLM's rule), or count chunks without a
    // tokenizer (vLLM would count 1).
    rec.fallback_output_tokens =
        c.tok ? int(c.tok->encode(rec.generated_text).size()) : int(rec.chunk_times.size());
  }
}

}  // namespace

BenchRun run_benchmark(const std::vector<SampleRequest>& reqs, const BenchConfig& c,
                       std::atomic<bool>* stop, std::ostream& log) {
  std::atomic<bool> never{false};
  std::atomic<bool>* cancel = stop ? stop : &never;
  const int n = int(reqs.size());
  BenchRun run;
  if (n == 0) return run;
  int workers = c.max_concurrency ? std::min(*c.max_concurrency, n) : n;
  workers = std::max(1, std::min(workers, 4096));

  if (c.num_warmups > 0) {
    log << "Warming up with " << c.num_warmups << " requests..." << std::endl;
    std::atomic<int> next{0};
    std::vector<std::thread> ts;
    int wn = std::max(1, std::min(workers, c.num_warmups));
    for (int w = 0; w < wn; ++w)
      ts.emplace_back([&] {
        HttpSession s(c.base_url, c.client);
        while (!cancel->load()) {
          int i = next++;
          if (i >= c.num_warmups) break;
          RequestRecord rec;
          run_one(s, reqs[0], c, now_s(), cancel, rec);
        }
      });
    for (auto& t : ts) t.join();
    log << "Warmup run completed." << std::endl;
  }

  log << "Starting main benchmark run..." << std::endl;
  log << "Traffic request rate: " << python_float(c.request_rate) << std::endl;
  log << "Burstiness factor: " << python_float(c.burstiness)
      << (c.burstiness == 1.0 ? " (Poisson process)" : " (Gamma distribution)") << std::endl;
  log << "Maximum request concurrency: "
      << (c.max_concurrency ? std::to_string(*c.max_concurrency) : std::string("None"))
      << std::endl;

  std::vector<double> rel = release_times(n, c.request_rate, c.burstiness, c.seed);
  std::vector<RequestRecord> recs(static_cast<size_t>(n));
  std::vector<char> finished(static_cast<size_t>(n), 0);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, double>> queue;  // (index, arrival time)
  bool closed = false;

  // On a terminal a bar, else a log line every few seconds (--disable-tqdm: neither).
  std::optional<Progress> bar;
  if (c.progress) bar.emplace(ProgressOptions{.label = "bench", .total = uint64_t(n), .unit = "req"});
  double t0 = 0;  // set once the workers exist, so that starting threads is not measured
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      HttpSession s(c.base_url, c.client);
      for (;;) {
        std::pair<int, double> job;
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return closed || !queue.empty(); });
          if (queue.empty()) return;
          job = queue.front();
          queue.pop_front();
        }
        if (cancel->load()) continue;
        RequestRecord& rec = recs[size_t(job.first)];
        run_one(s, reqs[size_t(job.first)], c, job.second, cancel, rec);
        bool cut = cancel->load() && !rec.success();
        finished[size_t(job.first)] = cut ? 0 : 1;
        if (bar) bar->add(1);
      }
    });

  t0 = now_s();

  for (int i = 0; i < n && !cancel->load(); ++i) {
    double due = t0 + rel[size_t(i)];
    while (!cancel->load()) {
      double wait = due - now_s();
      if (wait <= 0) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.05)));
    }
    if (cancel->load()) break;
    {
      std::lock_guard<std::mutex> lk(mu);
      queue.emplace_back(i, now_s());
    }
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    closed = true;
  }
  cv.notify_all();
  for (auto& t : pool) t.join();
  run.duration_s = now_s() - t0;
  bar.reset();
  run.interrupted = cancel->load();
  for (int i = 0; i < n; ++i)
    if (finished[size_t(i)]) {
      // Times in the saved result count from the benchmark start.
      RequestRecord r = std::move(recs[size_t(i)]);
      r.arrival_time -= t0;
      r.start_time -= t0;
      for (double& t : r.chunk_times) t -= t0;
      run.records.push_back(std::move(r));
    }
  return run;
}

}  // namespace sieve::bench
