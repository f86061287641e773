// HTTP plumbing of the server: one event-loop thread owns every connection (accepting, reading,
// parsing, writing, deadlines); route handlers run on a bounded pool of worker threads and answer
// through an Exchange from any thread. No thread waits on an idle or streaming connection, so
// slow clients cost a socket and a buffer, not a thread. Limits (docs/serving.md):
//  - the request head: 64 KiB and 200 header fields (431), the request line 8 KiB (414);
//  - the body: --max-request-bytes (413, refused from its Content-Length or as soon as chunks
//    pass it, before the rest is read); JSON routes need a length (411) and a JSON content type
//    (415 for any other);
//  - deadlines: the head within head_timeout_s of its first byte (a new connection's, of the
//    connect), the body within body_timeout_s of the head (408); an idle keep-alive connection
//    is closed after idle_timeout_s; a client that reads nothing for write_timeout_s is dropped;
//  - at most max_connections open at once: beyond, a 503 at once and the connection closed.
// Errors are OpenAI error objects; route handlers throw ApiError for what the client got wrong.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/http_parser.h"

namespace sieve::server {

struct HttpOptions {
  HttpLimits limits;
  size_t max_connections = 10000;
  double head_timeout_s = 10, body_timeout_s = 60, idle_timeout_s = 5, write_timeout_s = 30;
  int threads = 0;      // worker threads for route handlers; 0: from the machine's cores (2..16)
  std::string api_key;  // empty: no authentication on /v1 routes
};

// A bounded pool of threads running tasks in order of arrival.
class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  void post(std::function<void()> fn);
  // Runs what is queued (and what those jobs post) and joins the threads; the pool stays valid
  // meanwhile, so a running job may still post.
  void stop();
  int size() const { return int(threads_.size()); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

struct Connection;
class Http;

// The answer to one request, given once, from any thread: whole (reply) or as a stream of pieces
// (start_stream, write, end). A client that goes away before the answer is out makes gone()
// true and runs the on_gone callback once.
class Exchange {
 public:
  Exchange(Http& http, std::shared_ptr<Connection> conn, HttpRequest req);
  ~Exchange();
  const HttpRequest& request() const { return req_; }

  void reply(int status, const std::string& content_type, const std::string& body,
             const std::vector<std::pair<std::string, std::string>>& headers = {});
  void reply_json(int status, const nlohmann::json& body);
  void reply_error(int status, const std::string& message, const std::string& param = {},
                   const std::string& type = {});
  void start_stream(const std::string& content_type);
  // False when the client is gone.
  bool write(const std::string& piece);
  void end();
  bool answered() const { return answered_.load(); }
  bool gone() const;
  // Called once, from the event loop, if the client goes away before the answer is complete;
  // at once when it already has.
  void on_gone(std::function<void()> fn);

 private:
  friend class Http;
  void send(std::string bytes, bool last);
  void notify_gone();  // the event loop: the client went away
  Http& http_;
  std::shared_ptr<Connection> conn_;
  HttpRequest req_;
  std::atomic<bool> answered_{false};
  bool streaming_ = false;
  std::mutex gone_mu_;
  std::function<void()> on_gone_;
  bool gone_called_ = false;
};

class Http {
 public:
  using Handler = std::function<void(const std::shared_ptr<Exchange>&)>;

  explicit Http(HttpOptions o);
  ~Http();

  void get(const std::string& path, Handler h);
  // JSON routes need a length and a JSON content type; others take any body (or none).
  void post(const std::string& path, Handler h, bool json_body = true);
  // GET paths that start with `prefix` (and have no route of their own).
  void get_prefix(const std::string& prefix, Handler h);
  // GET `path` answers `body` as `content_type`.
  void get_static(const std::string& path, std::string content_type, std::string body);

  // Binds (port 0: any free port); returns the port. Throws Error when the address is not usable.
  int bind(const std::string& host, int port);
  void run();  // the event loop, until stop()
  void stop();
  // Runs `fn` on a worker thread.
  void post_task(std::function<void()> fn) { pool_->post(std::move(fn)); }

  // Answers not yet written out (shutdown waits for them).
  std::atomic<int> in_flight{0};
  size_t open_connections() const { return open_.load(); }
  int worker_threads() const { return pool_->size(); }

 private:
  friend class Exchange;
  struct Route {
    Handler handler;
    bool json_body = false;
  };
  void loop_once(int timeout_ms);
  void accept_all();
  void on_readable(const std::shared_ptr<Connection>& c);
  void on_writable(const std::shared_ptr<Connection>& c);
  void process(const std::shared_ptr<Connection>& c);
  bool head_checks(const std::shared_ptr<Connection>& c);
  void dispatch(const std::shared_ptr<Connection>& c);
  void fail(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void flush(const std::shared_ptr<Connection>& c);
  void close(const std::shared_ptr<Connection>& c);
  void update_interest(const std::shared_ptr<Connection>& c);
  void check_deadlines();
  void wake(const std::shared_ptr<Connection>& c);

  HttpOptions opts_;
  std::map<std::string, Route> get_, post_;
  std::vector<std::pair<std::string, Route>> get_prefixes_;
  int listen_fd_ = -1, epoll_fd_ = -1, event_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> open_{0};
  std::map<int, std::shared_ptr<Connection>> conns_;  // loop thread only
  uint32_t next_id_ = 0;
  bool trim_pending_ = false;  // loop thread only
  double last_trim_ = 0;
  std::mutex dirty_mu_;
  std::vector<std::shared_ptr<Connection>> dirty_;  // connections with output or an ended answer
  // Last, and reset first on destruction: its tasks may still write to connections.
  std::unique_ptr<TaskPool> pool_;
};

}  // namespace sieve::server
