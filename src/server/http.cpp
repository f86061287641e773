#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "server/protocol.h"

namespace sieve::server {

using json = nlohmann::json;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string error_body(int status, const std::string& message, const std::string& param = {},
                       const std::string& type = {}) {
  return error_json(status, message, param, type)
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string response_head(int status, const std::string& content_type, size_t length, bool close,
                          const std::string& extra = {}) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (status != 304 && status != 204) h += "Content-Length: " + std::to_string(length) + "\r\n";
  if (close) h += "Connection: close\r\n";
  h += extra;
  h += "\r\n";
  return h;
}

// The media type of a Content-Type value is JSON: application/json or application/*+json.
bool json_media_type(std::string_view ct) {
  std::string m(ct.substr(0, ct.find(';')));
  while (!m.empty() && (m.back() == ' ' || m.back() == '\t')) m.pop_back();
  for (char& c : m) c = char(std::tolower(uint8_t(c)));
  return m == "application/json" ||
         (m.rfind("application/", 0) == 0 && m.size() > 5 && m.substr(m.size() - 5) == "+json");
}

constexpr size_t kReadChunk = 64 << 10;
// While a request is being answered, bytes a client sends ahead (pipelining) are kept up to this.
constexpr size_t kMaxReadAhead = 1 << 20;
// A client that does not read its answer: dropped past this much unsent output.
constexpr size_t kMaxUnsent = 16u << 20;
// After an error answer the connection reads and drops what the client still sends for this
// long before closing, so that the answer is not lost to a reset.
constexpr double kLingerS = 1.0;
// Requests or refused heads at least this large mark memory to return to the system.
constexpr size_t kBigRequest = 1 << 20;

}  // namespace

// One client connection. The event loop owns its socket and parser; answers come in through
// `out` under `mu` from any thread.
struct Connection {
  Connection(int f, uint32_t i, const HttpLimits& limits) : fd(f), id(i), parser(limits) {}
  int fd;
  uint32_t id;  // tells this connection's epoll events from those of an earlier one on the same fd
  enum class Phase { Reading, Handling, Closing } phase = Phase::Reading;
  // Loop thread only.
  std::string in;
  size_t in_pos = 0;
  RequestParser parser;
  bool head_checked = false;
  bool keep_alive = true;
  bool got_bytes = false;   // of the current request
  bool idle = false;        // between requests of a keep-alive connection
  double deadline = 0;      // 0: none
  int deadline_status = 0;  // answer at the deadline (0: close silently)
  std::string wbuf;
  size_t wpos = 0;
  double write_since = 0;  // when wbuf last made progress
  uint32_t events = 0;     // registered with epoll
  bool registered = false;
  bool reading = true;
  bool answer_done = false;  // the exchange's last bytes are in wbuf
  bool counted = false;      // counts in Http::in_flight
  bool big = false;          // the request being answered was large (kBigRequest)
  std::shared_ptr<Exchange> ex;
  // Shared with the threads that answer.
  std::mutex mu;
  std::string out;
  bool out_done = false;
  bool close_after = false;
  size_t unsent = 0;
  std::atomic<bool> closed{false}, peer_gone{false};
};

// ---------------------------------------------------------------------------------------------
// TaskPool

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this] {
      std::unique_lock lk(mu_);
      while (true) {
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        auto fn = std::move(jobs_.front());
        jobs_.pop_front();
        lk.unlock();
        fn();
        lk.lock();
      }
    });
}

TaskPool::~TaskPool() { stop(); }

void TaskPool::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void TaskPool::post(std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

// ---------------------------------------------------------------------------------------------
// Exchange

Exchange::Exchange(Http& http, std::shared_ptr<Connection> conn, HttpRequest req)
    : http_(http), conn_(std::move(conn)), req_(std::move(req)) {}

Exchange::~Exchange() {
  // A handler that ended without an answer (a bug): the client still gets one.
  if (!answered_.load()) reply_error(500, "internal error: the request was not answered");
}

bool Exchange::gone() const {
  return conn_->closed.load() || conn_->peer_gone.load();
}

void Exchange::on_gone(std::function<void()> fn) {
  {
    std::lock_guard lk(gone_mu_);
    if (!gone_called_ && !gone()) {
      on_gone_ = std::move(fn);
      return;
    }
    if (gone_called_) return;
    gone_called_ = true;
  }
  fn();
}

void Exchange::notify_gone() {
  std::function<void()> fn;
  {
    std::lock_guard lk(gone_mu_);
    if (gone_called_) return;
    gone_called_ = true;
    fn = std::move(on_gone_);
  }
  if (fn) fn();
}

void Exchange::send(std::string bytes, bool last) {
  Connection& c = *conn_;
  {
    std::lock_guard lk(c.mu);
    if (c.closed.load()) return;
    c.out += bytes;
    c.unsent += bytes.size();
    if (last) c.out_done = true;
  }
  http_.wake(conn_);
}

void Exchange::reply(int status, const std::string& content_type, const std::string& body,
                     const std::vector<std::pair<std::string, std::string>>& headers) {
  if (answered_.exchange(true)) return;
  bool close = !conn_->keep_alive;
  {
    std::lock_guard lk(conn_->mu);
    if (close) conn_->close_after = true;
    close = conn_->close_after;
  }
  std::string extra;
  for (const auto& [k, v] : headers) extra += k + ": " + v + "\r\n";
  std::string bytes = response_head(status, content_type, body.size(), close, extra);
  if (req_.method != "HEAD") bytes += body;
  send(std::move(bytes), true);
}

void Exchange::reply_json(int status, const json& body) {
  reply(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void Exchange::reply_error(int status, const std::string& message, const std::string& param,
                           const std::string& type) {
  reply(status, "application/json", error_body(status, message, param, type));
}

void Exchange::start_stream(const std::string& content_type) {
  if (answered_.exchange(true)) return;
  streaming_ = true;
  std::string h =
      "HTTP/1.1 200 OK\r\nContent-Type: " + content_type + "\r\nCache-Control: no-cache\r\n";
  if (req_.minor_version == 0) {
    // HTTP/1.0 has no chunked coding: the end of the stream is the end of the connection.
    h += "Connection: close\r\n";
    std::lock_guard lk(conn_->mu);
    conn_->close_after = true;
  } else {
    h += "Transfer-Encoding: chunked\r\n";
    if (!conn_->keep_alive) h += "Connection: close\r\n";
  }
  send(h + "\r\n", false);
}

bool Exchange::write(const std::string& piece) {
  if (gone()) return false;
  if (piece.empty()) return true;
  {
    std::lock_guard lk(conn_->mu);
    if (conn_->unsent > kMaxUnsent) return false;  // the client does not read
  }
  if (req_.minor_version == 0) {
    send(piece, false);
  } else {
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
    send(size + piece + "\r\n", false);
  }
  return !gone();
}

void Exchange::end() {
  send(req_.minor_version == 0 ? std::string() : std::string("0\r\n\r\n"), true);
}

// ---------------------------------------------------------------------------------------------
// Http

namespace {
int default_threads() {
  return std::clamp(int(std::thread::hardware_concurrency()), 2, 16);
}
}  // namespace

Http::Http(HttpOptions o)
    : opts_(std::move(o)),
      pool_(std::make_unique<TaskPool>(opts_.threads > 0 ? opts_.threads : default_threads())) {}

Http::~Http() {
  // Stopped before it is released: a job still running may post another (unique_ptr::reset
  // nulls the pointer before the pool's destructor joins).
  pool_->stop();
  pool_.reset();
  for (auto& [fd, c] : conns_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

void Http::get(const std::string& path, Handler h) {
  get_[path] = Route{std::move(h), false};
}

void Http::post(const std::string& path, Handler h, bool json_body) {
  post_[path] = Route{std::move(h), json_body};
}

void Http::get_prefix(const std::string& prefix, Handler h) {
  get_prefixes_.emplace_back(prefix, Route{std::move(h), false});
}

void Http::get_static(const std::string& path, std::string content_type, std::string body) {
  get(path, [type = std::move(content_type), body = std::move(body)](
                const std::shared_ptr<Exchange>& ex) { ex->reply(200, type, body); });
}

int Http::bind(const std::string& host, int port) {
  // Each connection is a descriptor: allow as many as the hard limit lets.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      opts_.max_connections + 64 > rl.rlim_cur) {
    opts_.max_connections = rl.rlim_cur > 128 ? size_t(rl.rlim_cur) - 64 : 64;
    SIEVE_LOG(Warn, "open files are limited to " << rl.rlim_cur << ": at most "
                                                 << opts_.max_connections
                                                 << " connections (raise ulimit -n for more)");
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string where = host + ":" + std::to_string(port);
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw Error("cannot listen on " + where + " (unknown address)");
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) throw Error("cannot listen on " + where + " (address in use or not available)");
  sockaddr_storage addr{};
  socklen_t alen = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen);
  const int bound = addr.ss_family == AF_INET6
                        ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  listen_fd_ = fd;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || event_fd_ < 0)
    throw Error(std::string("cannot start the event loop: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = uint32_t(listen_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = uint32_t(event_fd_);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  return bound;
}

void Http::run() {
  double last_check = now_s();
  while (!stop_.load()) {
    loop_once(100);
    if (const double t = now_s(); t - last_check >= 0.1) {
      check_deadlines();
      last_check = t;
    }
  }
  // Stopped: every connection goes (their answers were given or abandoned).
  for (auto& [fd, c] : std::map<int, std::shared_ptr<Connection>>(conns_)) close(c);
}

void Http::stop() {
  stop_ = true;
  if (event_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
  }
}

void Http::wake(const std::shared_ptr<Connection>& c) {
  bool first;
  {
    std::lock_guard lk(dirty_mu_);
    first = dirty_.empty();
    dirty_.push_back(c);
  }
  if (first) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
  }
}

void Http::loop_once(int timeout_ms) {
  epoll_event events[256];
  const int n = epoll_wait(epoll_fd_, events, 256, timeout_ms);
  for (int i = 0; i < n; ++i) {
    const int fd = int(uint32_t(events[i].data.u64));
    const uint32_t id = uint32_t(events[i].data.u64 >> 32);
    if (id == 0 && fd == listen_fd_) {
      accept_all();
      continue;
    }
    if (id == 0 && fd == event_fd_) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = ::read(event_fd_, &v, sizeof v);
      std::vector<std::shared_ptr<Connection>> dirty;
      {
        std::lock_guard lk(dirty_mu_);
        dirty.swap(dirty_);
      }
      for (auto& c : dirty)
        if (!c->closed.load()) flush(c);
      continue;
    }
    auto it = conns_.find(fd);
    if (it == conns_.end() || it->second->id != id)
      continue;  // an event of a connection closed since
    std::shared_ptr<Connection> c = it->second;
    const uint32_t e = events[i].events;
    if (e & (EPOLLERR | EPOLLHUP)) {
      close(c);  // reset, or shut in both directions
      continue;
    }
    if (e & (EPOLLIN | EPOLLRDHUP)) on_readable(c);
    if (!c->closed.load() && (e & EPOLLOUT)) on_writable(c);
  }
}

void Http::accept_all() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE)
        SIEVE_LOG(Warn, "out of file descriptors: new connections wait in the listen queue");
      return;
    }
    if (conns_.size() >= opts_.max_connections) {
      // Over the cap: say so at once rather than let the client wait.
      const std::string body =
          error_body(503, "too many open connections (at most " +
                              std::to_string(opts_.max_connections) + "); retry later");
      const std::string r =
          response_head(503, "application/json", body.size(), true, "Retry-After: 1\r\n") + body;
      [[maybe_unused]] ssize_t w = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_shared<Connection>(fd, ++next_id_, opts_.limits);
    c->deadline = now_s() + opts_.head_timeout_s;
    c->deadline_status = 0;  // a connection that never says anything is closed silently
    conns_[fd] = c;
    open_ = conns_.size();
    update_interest(c);
  }
}

void Http::update_interest(const std::shared_ptr<Connection>& c) {
  uint32_t want = c->peer_gone.load() ? 0u : uint32_t(EPOLLRDHUP);
  if (c->reading) want |= EPOLLIN;
  if (c->wpos < c->wbuf.size()) want |= EPOLLOUT;
  if (c->registered && want == c->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = (uint64_t(c->id) << 32) | uint32_t(c->fd);
  epoll_ctl(epoll_fd_, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev);
  c->registered = true;
  c->events = want;
}

void Http::on_readable(const std::shared_ptr<Connection>& c) {
  bool eof = false;
  while (c->reading) {
    if (c->phase == Connection::Phase::Handling && c->in.size() - c->in_pos > kMaxReadAhead) {
      c->reading = false;  // enough read ahead; EPOLLRDHUP still tells of a hang-up
      break;
    }
    const size_t old = c->in.size();
    c->in.resize(old + kReadChunk);
    const ssize_t n = ::recv(c->fd, c->in.data() + old, kReadChunk, 0);
    c->in.resize(old + size_t(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      if (c->phase == Connection::Phase::Closing) c->in.clear(), c->in_pos = 0;  // dropped
      if (size_t(n) < kReadChunk) break;
      continue;
    }
    if (n == 0)
      eof = true;
    else if (errno == EINTR)
      continue;
    else if (errno != EAGAIN && errno != EWOULDBLOCK)
      eof = true;
    break;
  }
  if (c->phase == Connection::Phase::Reading) process(c);
  if (c->closed.load()) return;
  if (eof) {
    c->reading = false;
    c->peer_gone = true;
    if (c->phase == Connection::Phase::Handling && c->ex) {
      // The client hung up (or shut its side) before its answer: whatever produces it stops
      // (aborted requests free their blocks); what still comes goes out if the socket takes it,
      // then the connection closes.
      {
        std::lock_guard lk(c->mu);
        c->close_after = true;
      }
      c->ex->notify_gone();
      update_interest(c);
      return;
    }
    close(c);
    return;
  }
  update_interest(c);
}

void Http::on_writable(const std::shared_ptr<Connection>& c) {
  flush(c);
}

void Http::process(const std::shared_ptr<Connection>& c) {
  while (c->phase == Connection::Phase::Reading && !c->closed.load()) {
    if (c->in_pos < c->in.size() && !c->got_bytes) {
      // The head's deadline runs from its first byte (an idle keep-alive connection waits longer).
      c->got_bytes = true;
      c->idle = false;
      c->deadline = now_s() + opts_.head_timeout_s;
      c->deadline_status = 408;
    }
    const RequestParser::State st = c->parser.feed(c->in, &c->in_pos);
    if (st == RequestParser::State::Error) {
      fail(c, c->parser.error_status(), c->parser.error_message());
      return;
    }
    if (st == RequestParser::State::Head) break;
    if (st == RequestParser::State::Body && !c->head_checked) {
      c->head_checked = true;
      if (!head_checks(c)) return;
      c->deadline = now_s() + opts_.body_timeout_s;
      c->deadline_status = 408;
      continue;
    }
    if (st == RequestParser::State::Body) break;
    dispatch(c);
  }
  // Keep the buffer small: drop what was consumed.
  if (c->in_pos > 0 && (c->in_pos == c->in.size() || c->in_pos > (256 << 10))) {
    c->in.erase(0, c->in_pos);
    c->in_pos = 0;
    if (c->in.empty() && c->in.capacity() > (256 << 10)) std::string().swap(c->in);
  }
}

// Checks that need only the head, so a request refused for them is refused before its body is read.
bool Http::head_checks(const std::shared_ptr<Connection>& c) {
  const HttpRequest& req = c->parser.request();
  c->keep_alive = req.keep_alive;
  const bool has_body = c->parser.chunked() || c->parser.content_length() > 0;
  if (!opts_.api_key.empty() && req.path.rfind("/v1", 0) == 0 &&
      req.header("Authorization") != "Bearer " + opts_.api_key) {
    const bool missing = req.header("Authorization").empty();
    fail(c, 401, missing ? "Missing API key: send Authorization: Bearer <key>" : "Invalid API key");
    return false;
  }
  if (req.method == "POST") {
    auto it = post_.find(req.path);
    if (it != post_.end() && it->second.json_body) {
      if (!req.has_length) {
        fail(c, 411, "a request body is required: send it with Content-Length (or chunked)");
        return false;
      }
      const std::string_view ct = req.header("Content-Type");
      if (!ct.empty() && !json_media_type(ct)) {
        fail(c, 415,
             "Content-Type " + std::string(ct.substr(0, 100)) +
                 " is not accepted: send application/json");
        return false;
      }
    }
    if (it == post_.end() && has_body) {
      fail(c, get_.count(req.path) ? 405 : 404, "Not Found: POST " + req.path);
      return false;
    }
  }
  if (req.expect_continue && has_body && req.minor_version == 1) {
    c->wbuf += "HTTP/1.1 100 Continue\r\n\r\n";
    flush(c);
  }
  return true;
}

void Http::dispatch(const std::shared_ptr<Connection>& c) {
  HttpRequest req = std::move(c->parser.request());
  c->parser.reset();
  c->big = req.body.size() >= kBigRequest;
  c->head_checked = false;
  c->got_bytes = false;
  c->deadline = 0;
  c->phase = Connection::Phase::Handling;
  c->answer_done = false;
  {
    std::lock_guard lk(c->mu);
    c->out_done = false;
  }
  c->counted = true;
  ++in_flight;
  const std::string method = req.method, path = req.path;
  auto ex = std::make_shared<Exchange>(*this, c, std::move(req));
  c->ex = ex;
  const Route* route = nullptr;
  if (method == "GET" || method == "HEAD") {
    if (auto it = get_.find(path); it != get_.end()) route = &it->second;
    for (const auto& [prefix, r] : get_prefixes_)
      if (!route && path.rfind(prefix, 0) == 0) route = &r;
  } else if (method == "POST") {
    if (auto it = post_.find(path); it != post_.end()) route = &it->second;
  }
  if (!route) {
    const bool other = get_.count(path) || post_.count(path);
    ex->reply_error(other ? 405 : 404,
                    (other ? "Method Not Allowed: " : "Not Found: ") + method + " " + path);
    return;
  }
  Handler h = route->handler;
  pool_->post([h, ex] {
    try {
      h(ex);
    } catch (const ApiError& e) {
      ex->reply_error(e.status, e.what(), e.param, e.type);
    } catch (const Error& e) {
      ex->reply_error(400, e.what());
    } catch (const std::exception& e) {
      SIEVE_LOG(Error, ex->request().method << ' ' << ex->request().path << ": " << e.what());
      ex->reply_error(500, std::string("internal error: ") + e.what());
    }
  });
}

void Http::fail(const std::shared_ptr<Connection>& c, int status, const std::string& message) {
  if (c->in.capacity() >= kBigRequest) trim_pending_ = true;
  const std::string body = error_body(status, message);
  c->wbuf += response_head(status, "application/json", body.size(), true) + body;
  c->phase = Connection::Phase::Closing;
  c->deadline = now_s() + opts_.write_timeout_s;
  c->deadline_status = 0;
  std::string().swap(c->in);
  c->in_pos = 0;
  flush(c);
}

void Http::flush(const std::shared_ptr<Connection>& c) {
  if (c->closed.load()) return;
  {
    std::lock_guard lk(c->mu);
    if (!c->out.empty()) {
      if (c->wpos == c->wbuf.size()) {
        c->wbuf.clear();
        c->wpos = 0;
      }
      c->wbuf += c->out;
      c->out.clear();
    }
    if (c->out_done) {
      c->answer_done = true;
      c->out_done = false;
    }
  }
  const size_t before = c->wbuf.size() - c->wpos;
  while (c->wpos < c->wbuf.size()) {
    const ssize_t n =
        ::send(c->fd, c->wbuf.data() + c->wpos, c->wbuf.size() - c->wpos, MSG_NOSIGNAL);
    if (n > 0) {
      c->wpos += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // The client is gone (close() tells whoever produces the answer).
    c->peer_gone = true;
    close(c);
    return;
  }
  const size_t left = c->wbuf.size() - c->wpos;
  {
    std::lock_guard lk(c->mu);
    c->unsent = left + c->out.size();
  }
  if (left < before || left == 0) c->write_since = now_s();
  if (left == 0) {
    if (c->wbuf.capacity() > (256 << 10))
      std::string().swap(c->wbuf);
    else
      c->wbuf.clear();
    c->wpos = 0;
    if (c->phase == Connection::Phase::Closing) {
      // Lingering close: the client may still be sending what we refused.
      ::shutdown(c->fd, SHUT_WR);
      c->deadline = std::min(c->deadline, now_s() + kLingerS);
    } else if (c->phase == Connection::Phase::Handling && c->answer_done) {
      // The answer is out.
      c->ex.reset();
      if (c->big) trim_pending_ = true;
      if (c->counted) {
        c->counted = false;
        --in_flight;
      }
      bool close_after;
      {
        std::lock_guard lk(c->mu);
        close_after = c->close_after;
      }
      if (close_after || !c->keep_alive || stop_.load()) {
        c->phase = Connection::Phase::Closing;
        c->deadline = now_s() + kLingerS;
        ::shutdown(c->fd, SHUT_WR);
      } else {
        c->phase = Connection::Phase::Reading;
        c->reading = true;
        c->idle = true;
        c->deadline = now_s() + opts_.idle_timeout_s;
        c->deadline_status = 0;
        process(c);
        if (c->closed.load()) return;
      }
    }
  }
  update_interest(c);
}

void Http::close(const std::shared_ptr<Connection>& c) {
  if (c->closed.exchange(true)) return;
  {
    std::lock_guard lk(c->mu);
    c->out.clear();
  }
  if (c->counted) {
    c->counted = false;
    --in_flight;
  }
  if (c->ex) {
    // The answer will not be written: whoever produces it is told.
    c->ex->notify_gone();
    c->ex.reset();
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  conns_.erase(c->fd);
  open_ = conns_.size();
}

void Http::check_deadlines() {
  const double t = now_s();
  // glibc keeps what large requests freed (a 10 MB prompt, a refused megabyte of headers) in its
  // arenas; hand it back, at most once a second, off the loop thread.
  if (trim_pending_ && t - last_trim_ >= 1.0) {
    trim_pending_ = false;
    last_trim_ = t;
    pool_->post([] { malloc_trim(0); });
  }
  std::vector<std::shared_ptr<Connection>> late;
  for (auto& [fd, c] : conns_) {
    const bool stalled = c->wpos < c->wbuf.size() && t - c->write_since > opts_.write_timeout_s;
    if ((c->deadline > 0 && t > c->deadline) || stalled) late.push_back(c);
  }
  for (auto& c : late) {
    if (c->closed.load()) continue;
    const bool stalled = c->wpos < c->wbuf.size() && t - c->write_since > opts_.write_timeout_s;
    if (stalled || c->phase != Connection::Phase::Reading || c->deadline_status == 0) {
      close(c);
      continue;
    }
    const bool head = c->parser.state() == RequestParser::State::Head;
    fail(c, 408,
         head ? "the request head did not arrive within " +
                    std::to_string(int(opts_.head_timeout_s)) + " s"
              : "the request body did not arrive within " +
                    std::to_string(int(opts_.body_timeout_s)) + " s");
  }
}

}  // namespace sieve::server
