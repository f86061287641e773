#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "core/error.h"

namespace sieve::parallel {

namespace {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<int64_t>(left, 1 << 30));
}

// Waits until fd is ready for `events`; false at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw Error(std::string("rendezvous: poll failed: ") + std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) throw Error("rendezvous: timed out sending to a peer");
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(std::string("rendezvous: send failed: ") + std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& who) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) throw Error("rendezvous: timed out waiting for " + who);
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) throw Error("rendezvous: " + who + " closed the connection");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error("rendezvous: receiving from " + who + " failed: " + std::strerror(errno));
    }
    p += r;
    n -= size_t(r);
  }
}

// A step's inputs fit easily (block tables of hundreds of sequences included).
constexpr uint32_t kMaxFrame = 1u << 30;

void send_frame(int fd, const std::string& s, Clock::time_point deadline) {
  const uint32_t len = htonl(uint32_t(s.size()));
  send_all(fd, &len, 4, deadline);
  send_all(fd, s.data(), s.size(), deadline);
}

std::string recv_frame(int fd, Clock::time_point deadline, const std::string& who) {
  uint32_t len = 0;
  recv_all(fd, &len, 4, deadline, who);
  len = ntohl(len);
  if (len > kMaxFrame) throw Error("rendezvous: " + who + " sent a frame of " + std::to_string(len) + " bytes");
  std::string s(len, '\0');
  recv_all(fd, s.data(), len, deadline, who);
  return s;
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw Error("--dist-init-addr: cannot resolve \"" + host + "\": " + ::gai_strerror(rc));
  return res;
}

std::string hello(const RendezvousOptions& o) { return std::to_string(o.node_rank) + "\n" + o.run_key; }

Joined serve(const RendezvousOptions& o, const std::string& host, int port, const std::string& payload) {
  const auto deadline = Clock::now() + o.timeout;
  addrinfo* ai = resolve(host, port, true);
  Fd lfd(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
  const int one = 1;
  ::setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = ::bind(lfd.get(), ai->ai_addr, ai->ai_addrlen);
  ::freeaddrinfo(ai);
  if (rc != 0)
    throw Error("--dist-init-addr: node 0 cannot listen on " + o.addr + ": " + std::strerror(errno));
  if (::listen(lfd.get(), 64) != 0) throw Error(std::string("rendezvous: listen failed: ") + std::strerror(errno));

  std::map<int, Fd> peers;  // node rank -> connection
  auto fail_all = [&](const std::string& why) {
    for (auto& [r, fd] : peers) {
      try {
        send_frame(fd.get(), "ERR " + why, Clock::now() + std::chrono::seconds(2));
      } catch (const Error&) {
      }
    }
    throw Error("rendezvous: " + why);
  };
  while (int(peers.size()) < o.nnodes - 1) {
    if (!wait_fd(lfd.get(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < o.nnodes; ++r)
        if (!peers.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail_all("node(s) " + missing + " did not join " + o.addr + " within " +
               std::to_string(o.timeout.count() / 1000) + " s");
    }
    Fd c(::accept(lfd.get(), nullptr, nullptr));
    if (c.get() < 0) continue;
    std::string msg;
    try {
      msg = recv_frame(c.get(), std::min(deadline, Clock::now() + std::chrono::seconds(10)), "a connecting node");
    } catch (const Error&) {
      continue;  // not a Sieve node (a port scan, a stray connection): ignore it
    }
    const size_t nl = msg.find('\n');
    int r = -1;
    try {
      r = std::stoi(msg.substr(0, nl));
    } catch (...) {
    }
    const std::string key = nl == std::string::npos ? "" : msg.substr(nl + 1);
    if (r < 1 || r >= o.nnodes || peers.count(r)) {
      const std::string why = "a node announced node rank " + msg.substr(0, nl) +
                              (peers.count(r) ? ", which another node already has" : ", outside 1.." +
                                                                                         std::to_string(o.nnodes - 1));
      send_frame(c.get(), "ERR " + why, deadline);
      fail_all(why);
    }
    if (key != o.run_key) {
      const std::string why = "node " + std::to_string(r) + " describes another run (\"" + key +
                              "\", node 0 has \"" + o.run_key + "\")";
      send_frame(c.get(), "ERR " + why, deadline);
      fail_all(why);
    }
    peers.emplace(r, std::move(c));
  }
  Joined j;
  j.payload = payload;
  for (auto& [r, fd] : peers) {
    send_frame(fd.get(), "OK " + payload, deadline);
    j.links.push_back(std::make_unique<NodeLink>(fd.release(), r));
  }
  return j;
}

Joined join(const RendezvousOptions& o, const std::string& host, int port) {
  const auto deadline = Clock::now() + o.timeout;
  std::string last_error = "no answer";
  for (;;) {
    addrinfo* ai = resolve(host, port, false);
    Fd fd(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
    const int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    ::freeaddrinfo(ai);
    if (rc == 0) {
      send_frame(fd.get(), hello(o), deadline);
      // Node 0 answers at the latest at its own deadline (naming a node that never came), which
      // may fall a little after this node's: wait a little longer for that answer.
      const std::string reply = recv_frame(fd.get(), deadline + std::chrono::seconds(5), "node 0 at " + o.addr);
      if (reply.rfind("OK ", 0) == 0) {
        Joined j;
        j.payload = reply.substr(3);
        j.links.push_back(std::make_unique<NodeLink>(fd.release(), 0));
        return j;
      }
      throw Error("rendezvous: node 0 refused node " + std::to_string(o.node_rank) + ": " +
                  (reply.rfind("ERR ", 0) == 0 ? reply.substr(4) : reply));
    }
    last_error = std::strerror(errno);
    if (ms_left(deadline) == 0)
      throw Error("rendezvous: node " + std::to_string(o.node_rank) + " could not reach node 0 at " + o.addr +
                  " within " + std::to_string(o.timeout.count() / 1000) + " s (" + last_error + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200, ms_left(deadline))));
  }
}

}  // namespace

void parse_host_port(const std::string& addr, std::string& host, int& port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())
    throw Error("--dist-init-addr: expected HOST:PORT, got \"" + addr + "\"");
  host = addr.substr(0, colon);
  try {
    size_t used = 0;
    port = std::stoi(addr.substr(colon + 1), &used);
    if (used != addr.size() - colon - 1) throw 0;
  } catch (...) {
    throw Error("--dist-init-addr: the port of \"" + addr + "\" is not a number");
  }
  if (port < 1 || port > 65535) throw Error("--dist-init-addr: port " + std::to_string(port) + " is outside 1..65535");
}

NodeLink::NodeLink(int fd, int node) : fd_(fd), node_(node) {}

NodeLink::~NodeLink() {
  if (fd_ >= 0) ::close(fd_);
}

void NodeLink::send(const std::string& frame) {
  send_frame(fd_, frame, Clock::now() + std::chrono::hours(24 * 365));
}

std::string NodeLink::recv(std::chrono::milliseconds timeout) {
  const auto deadline = timeout.count() < 0 ? Clock::now() + std::chrono::hours(24 * 365) : Clock::now() + timeout;
  return recv_frame(fd_, deadline, "node " + std::to_string(node_));
}

void NodeLink::close() { ::shutdown(fd_, SHUT_RDWR); }

std::string rendezvous(const RendezvousOptions& o, const std::string& payload) {
  return rendezvous_links(o, payload).payload;
}

Joined rendezvous_links(const RendezvousOptions& o, const std::string& payload) {
  if (o.nnodes < 1) throw Error("--nnodes must be at least 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw Error("--node-rank " + std::to_string(o.node_rank) + " is outside 0.." + std::to_string(o.nnodes - 1));
  if (o.nnodes == 1) return Joined{payload, {}};
  std::string host;
  int port = 0;
  parse_host_port(o.addr, host, port);
  return o.node_rank == 0 ? serve(o, host, port, payload) : join(o, host, port);
}

}  // namespace sieve::parallel
