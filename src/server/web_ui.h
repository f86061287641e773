// The chat page and dashboard behind one call that any HTTP layer can route to: GET paths in,
// status, headers and body out. Serves the embedded files (static_files.h), the facts the page
// needs to set itself up (/ui/info) and the metrics history the dashboard draws (/ui/metrics).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/metrics_history.h"
#include "server/server.h"

namespace sieve::server {

struct WebResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class WebUi {
 public:
  // Starts sampling the engine's metrics for the dashboard.
  WebUi(const engine::Engine& engine, const ServerOptions& opts);
  ~WebUi();
  WebUi(const WebUi&) = delete;
  WebUi& operator=(const WebUi&) = delete;

  // The paths get() answers, as one regular expression (for pattern routers).
  static constexpr const char* kRoutePattern =
      R"(/|/dashboard|/assets/[A-Za-z0-9._-]+|/ui/info|/ui/metrics)";

  // Answers GET `path`: `since` is the query parameter of /ui/metrics (unix seconds; empty: the
  // whole history), `if_none_match` the request header. nullopt: not a path of the page.
  std::optional<WebResponse> get(std::string_view path, std::string_view since,
                                 std::string_view if_none_match) const;

  // /ui/info: the server's settings the page shows and sets itself up by (model, whether an API
  // key is needed, parsers, limits, cache layout).
  nlohmann::json info() const;

  MetricsHistory& history() { return history_; }

 private:
  const engine::Engine& engine_;
  const ServerOptions& opts_;
  MetricsHistory history_;
};

}  // namespace sieve::server
