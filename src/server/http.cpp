#include "server/http.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "server/protocol.h"
#include "server/responses.h"

namespace sieve::server {

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string addr_str(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    *port = ntohs(v6->sin6_port);
  } else {
    *port = -1;
  }
  return buf;
}

// The socket of this request's connection. httplib 0.11 does not hand it to handlers, and the
// only way to notice a client that went away while nothing is being written (a request still
// queued or prefilling, a non-streaming request) is to look at the socket itself.
int find_client_socket(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end != 0 || fd < 0) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    int lport = -1, pport = -1;
    addr_str(local, &lport);
    const std::string paddr = addr_str(peer, &pport);
    if (lport == req.local_port && pport == req.remote_port && paddr == req.remote_addr) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// httplib serves a connection on one pool thread for as long as it stays open (keep-alive
// included), so a fixed pool stalls new clients behind idle connections under load. This pool
// starts a thread whenever every thread is busy, up to a cap, as a thread-per-connection server
// with a bound would.
class GrowingPool : public httplib::TaskQueue {
 public:
  explicit GrowingPool(size_t max_threads) : max_(max_threads) {}
  ~GrowingPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_)
      threads_.emplace_back([this] { work(); });
    else
      cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock lk(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, and nothing left to run
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }
  size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& msg,
                const std::string& param) {
  send_json(res, status, error_json(status, msg, param));
}

ClientWatch::ClientWatch(const httplib::Request& req) : fd_(find_client_socket(req)) {}

// EOF or a socket error; pending bytes of a pipelined request mean the client is still there.
bool ClientWatch::gone() const {
  if (fd_ < 0) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;
}

Http::Http(HttpOptions o) : opts_(std::move(o)), http_(std::make_unique<httplib::Server>()) {
  const size_t threads = size_t(std::max(1, opts_.threads));
  http_->new_task_queue = [threads] { return new GrowingPool(threads); };
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_keep_alive_timeout(5);
  http_->set_read_timeout(60);
  http_->set_write_timeout(30);
  http_->set_tcp_nodelay(true);

  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + opts_.api_key) {
      res.set_header("Connection", "close");
      send_json(res, 401,
                error_json(401,
                           auth.empty() ? "Missing API key: send Authorization: Bearer <key>"
                                        : "Invalid API key",
                           {}, "authentication_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, 404, "Not Found: " + req.method + " " + req.path);
    else if (res.status == 413)
      send_error(res, 413, "the request body is larger than the server accepts");
    else if (res.status == 400)
      send_error(res, 400, "malformed HTTP request");
    else
      send_error(res, res.status, "HTTP error " + std::to_string(res.status));
  });
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg += std::string(": ") + e.what();
        } catch (...) {
        }
        send_error(res, 500, msg);
      });
}

Http::~Http() = default;

// ApiError -> its status; anything else -> 500; all as error objects.
Http::Handler Http::wrap(Handler h) {
  return [this, h](const httplib::Request& req, httplib::Response& res) {
    ++in_flight;
    try {
      h(req, res);
    } catch (const ApiError& e) {
      send_json(res, e.status, error_json(e.status, e.what(), e.param, e.type));
    } catch (const Error& e) {
      send_error(res, 400, e.what());
    } catch (const std::exception& e) {
      SIEVE_LOG(Error, req.method << ' ' << req.path << ": " << e.what());
      send_error(res, 500, std::string("internal error: ") + e.what());
    }
    --in_flight;
  };
}

void Http::get(const std::string& path, Handler h) {
  http_->Get(path, wrap(std::move(h)));
}

void Http::get_static(const std::string& path, std::string content_type, std::string body) {
  http_->Get(path,
             [type = std::move(content_type), body = std::move(body)](
                 const httplib::Request&, httplib::Response& r) { r.set_content(body, type); });
}

// POST routes read their body themselves: httplib's own reader caps bodies sent as
// application/x-www-form-urlencoded (curl -d's default) at 8 KiB, and a chunked body would
// not meet the size limit. The body is JSON whatever the Content-Type says, as in vLLM.
void Http::post(const std::string& path, BodyHandler h) {
  http_->Post(path, [this, h](const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) {
    if (req.get_header_value("Content-Type").rfind("multipart/", 0) == 0) {
      res.set_header("Connection", "close");
      send_error(res, 415, "multipart bodies are not accepted: send JSON");
      return;
    }
    std::string body;
    bool too_big = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > opts_.max_body_bytes) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    // httplib refuses a Content-Length over the limit before reading (status 413).
    if (too_big || (!ok && res.status == 413)) {
      res.set_header("Connection", "close");
      send_error(res, 413,
                 "the request body is larger than the server accepts (" +
                     std::to_string(opts_.max_body_bytes) + " bytes)");
      return;
    }
    if (!ok) {
      res.set_header("Connection", "close");
      send_error(res, 400, "could not read the request body");
      return;
    }
    wrap([&](const httplib::Request& q, httplib::Response& r) { h(q, body, r); })(req, res);
  });
}

void Http::respond_full(const httplib::Request& req, httplib::Response& res, GenerationWriter& w) {
  ClientWatch client(req);
  while (true) {
    if (std::optional<json> body = w.full_step(100ms)) {
      send_json(res, 200, *body);
      return;
    }
    if (client.gone()) {
      w.client_gone();
      res.set_header("Connection", "close");
      send_error(res, 499, "the client closed the connection");
      return;
    }
  }
}

void Http::respond_stream(const httplib::Request& req, httplib::Response& res,
                          std::shared_ptr<GenerationWriter> w) {
  auto client = std::make_shared<ClientWatch>(req);
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [w, client](size_t, httplib::DataSink& sink) {
        std::string out;
        try {
          out = w->stream_step(50ms);
        } catch (const std::exception& e) {
          // Headers are out: report in the stream, then end it.
          SIEVE_LOG(Error, "stream " << w->generation().id << ": " << e.what());
          out = w->stream_error(std::string("internal error: ") + e.what());
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          w->client_gone();
          return false;
        }
        if (w->done()) {
          sink.done();
        } else if (out.empty() && client->gone()) {
          w->client_gone();
          return false;
        }
        return true;
      },
      [this, w](bool) {
        // The client went away (or the server stops) before the end: free the blocks now.
        w->client_gone();
        --in_flight;
      });
  ++in_flight;  // until the stream is written out: shutdown waits for it
}

int Http::bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = http_->bind_to_any_port(host);
    if (bound <= 0) throw Error("cannot listen on " + host + " (any port)");
  } else if (!http_->bind_to_port(host, port)) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                " (address in use or not available)");
  }
  widen_listen_backlog(bound);
  return bound;
}

void Http::run() {
  http_->listen_after_bind();
}

void Http::stop() {
  http_->stop();
}

void widen_listen_backlog(int port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || fd < 0) continue;
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting)
      continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = addr.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
            : addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                         : -1;
    if (p == port) ::listen(int(fd), SOMAXCONN);
  }
  closedir(d);
}

}  // namespace sieve::server
