// The OpenAI-compatible HTTP server (vLLM's routes and response shapes) over one Engine.
// One event-loop thread handles the connections; a bounded pool of HTTP worker threads parses,
// tokenizes, detokenizes and matches stop strings; the engine thread only runs steps. A client
// that goes away aborts its request, which frees its blocks.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/protocol.h"
#include "text/tokenizer.h"

namespace sieve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see port())
  std::vector<std::string> served_model_names = {"sieve"};
  std::string model_dir;              // reported as the model's root
  std::string api_key;                // empty: no authentication
  size_t max_body_bytes = 32u << 20;  // larger bodies get 413
  std::string profiler_dir;           // empty: /start_profile is refused
  int http_threads = 0;               // HTTP worker threads (handlers); 0: from the machine's cores
  size_t max_connections = 10000;     // open connections beyond this get 503 at once
  // Deadlines (http.h): the request head after its first byte, the body after the head, an idle
  // keep-alive connection.
  double head_timeout_s = 10, body_timeout_s = 60, idle_timeout_s = 5;
  double shutdown_grace_s = 1.5;  // in-flight requests may finish this long
  RequestDefaults defaults;       // what requests leave out (generation config, --max-logprobs)
  std::string reasoning_parser;   // --reasoning-parser (reasoning_parser_names()); empty: off
  std::string tool_parser;        // --tool-call-parser with --enable-auto-tool-choice; empty: off
  bool web_ui = true;             // the chat page at / and the dashboard (--disable-web-ui: off)
  nlohmann::json ui_info;         // more facts for the page's /ui/info (cache dtypes, device)
};

// Prometheus text exposition of the engine's counters, gauges and histograms.
std::string prometheus_text(const engine::EngineStats& s, const std::string& model_name);

class Server {
 public:
  Server(engine::Engine& engine, const text::Tokenizer& tok, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // GET `path` answers `body` as `content_type` (pages, scripts, styles); call before run().
  void add_static(const std::string& path, std::string content_type, std::string body);
  // Binds the listening socket; throws Error when the address cannot be used.
  void bind();
  int port() const { return port_; }
  // Serves until shutdown(); returns then.
  void run();
  // Stops accepting, lets in-flight requests finish for up to shutdown_grace_s, aborts the rest,
  // and makes run() return. Safe to call from any thread, more than once.
  void shutdown();
  bool draining() const { return draining_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::mutex shutdown_mu_;
};

}  // namespace sieve::server
