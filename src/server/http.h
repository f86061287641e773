// HTTP plumbing of the server: the listener and its limits, the API key, errors answered as
// OpenAI error objects, and routes (JSON bodies read under the size limit, static content).
// Route handlers throw ApiError for what the client got wrong.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace sieve::server {

class GenerationWriter;

struct HttpOptions {
  size_t max_body_bytes = 32u << 20;  // larger bodies get 413
  int threads = 256;                  // most connection threads
  std::string api_key;                // empty: no authentication on /v1 routes
};

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param = {});

// True when the client of `req` has closed its connection (a request still queued or
// prefilling, a non-streaming request: nothing is written that would notice).
class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req);
  bool gone() const;

 private:
  int fd_ = -1;
};

class Http {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  using BodyHandler =
      std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;

  explicit Http(HttpOptions o);
  ~Http();

  void get(const std::string& path, Handler h);
  // The body is read here (under max_body_bytes); it is JSON whatever the Content-Type says.
  void post(const std::string& path, BodyHandler h);
  // GET `path` answers `body` as `content_type`.
  void get_static(const std::string& path, std::string content_type, std::string body);

  // A generation's answer through `w`: whole (this handler waits for it; a client that goes away
  // meanwhile aborts it) or as a chunked event stream written as tokens come.
  void respond_full(const httplib::Request& req, httplib::Response& res, GenerationWriter& w);
  void respond_stream(const httplib::Request& req, httplib::Response& res,
                      std::shared_ptr<GenerationWriter> w);

  // Binds (port 0: any free port); returns the port. Throws Error when the address is not usable.
  int bind(const std::string& host, int port);
  void run();  // serves until stop()
  void stop();
  // Handlers and streams still running (shutdown waits for them).
  std::atomic<int> in_flight{0};
  httplib::Server& raw() { return *http_; }

 private:
  Handler wrap(Handler h);
  HttpOptions opts_;
  std::unique_ptr<httplib::Server> http_;
};

// cpp-httplib 0.11 listens with a backlog of 5, so a burst of simultaneous connections (a
// benchmark releasing 64 requests at once) sees resets. This re-listens on this process's
// listening socket bound to `port` with the system maximum backlog.
void widen_listen_backlog(int port);

}  // namespace sieve::server
