// A small blocking HTTP client for OpenAI-compatible servers (cpp-httplib underneath). One
// session per thread; streamed POSTs fill a RequestRecord chunk by chunk.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "bench/metrics.h"
#include "bench/stream.h"

namespace sieve::bench {

struct ClientOptions {
  double connect_timeout_s = 10;
  // Longest silence allowed while reading a response (vLLM's client allows 6 hours in total).
  double read_timeout_s = 6 * 3600;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// Seconds on the steady clock; every time in a RequestRecord uses it.
double now_s();

class HttpSession {
 public:
  // base_url: "http://host:port" optionally followed by a path prefix ("http://h:8000/api").
  HttpSession(const std::string& base_url, ClientOptions opts = {});
  ~HttpSession();
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  // POSTs `body` to `path` and reads the SSE stream into `rec` (start_time is set just before
  // the request is sent). Network failures, non-200 answers, errors inside the stream and
  // streams without any choice chunk become rec.error; nothing throws. `cancel` (optional)
  // aborts the read when it becomes true.
  void stream_post(const std::string& path, const std::string& body, StreamState& st,
                   RequestRecord& rec, const std::atomic<bool>* cancel = nullptr);

  // Plain requests; throw Error when the server cannot be reached.
  HttpResponse get(const std::string& path);
  HttpResponse post_json(const std::string& path, const std::string& body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The first model id of GET /v1/models; throws Error naming the URL when there is none.
std::string first_model(const std::string& base_url, ClientOptions opts = {});

}  // namespace sieve::bench
