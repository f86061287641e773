// The server under a hostile client (issue: the server holds under abuse): malformed requests are
// answered at once, slow and idle clients cannot lock others out, connections and threads are
// bounded, and clients that go away free their blocks. "At once" is checked against a client
// timeout far below the server's own deadlines, so a stall shows as no answer at all.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "server_rig.h"

namespace sieve::server {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A raw client connection with a receive timeout.
struct Raw {
  int fd = -1;
  Raw(int port, int timeout_s = 5) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    timeval tv{timeout_s, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Raw() {
    if (fd >= 0) ::close(fd);
  }
  bool send(const std::string& s) {
    return fd >= 0 && ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size());
  }
  // Everything until the peer closes, the timeout passes, or a whole response (by Content-Length)
  // is in.
  std::string read_response() {
    std::string got;
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, size_t(n));
      const size_t end = got.find("\r\n\r\n");
      if (end != std::string::npos) {
        const size_t cl = got.find("Content-Length: ");
        if (cl != std::string::npos && cl < end &&
            got.size() >= end + 4 + std::stoul(got.substr(cl + 16)))
          break;
      }
    }
    return got;
  }
};

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;  // 0: no answer
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  const size_t e = response.find("\r\n\r\n");
  return e == std::string::npos ? std::string() : response.substr(e + 4);
}

int answer(int port, const std::string& request) {
  Raw r(port);
  r.send(request);
  return status_of(r.read_response());
}

int threads_now() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

const char* kPost =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

TEST(ServerAbuse, MalformedFramingIsAnsweredAtOnce) {
  Rig rig;
  const int port = rig.srv->port();
  // Each of these stalled until the 60 s read timeout before.
  EXPECT_EQ(answer(port, std::string(kPost) + "\r\n"), 411);
  EXPECT_EQ(answer(port, std::string(kPost) + "Content-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(answer(port, std::string(kPost) + "Content-Length: twelve\r\n\r\n"), 400);
  EXPECT_EQ(answer(port, std::string(kPost) + "Transfer-Encoding: chunked\r\n\r\n-5\r\n"), 400);
  EXPECT_EQ(answer(port, std::string(kPost) + "Transfer-Encoding: chunked\r\n\r\nxyz\r\n"), 400);
  EXPECT_EQ(answer(port, "GARBAGE\x01\x02 / HTTP/1.1\r\n\r\n"), 400);
  // The error is an OpenAI error object naming the problem.
  Raw r(port);
  r.send(std::string(kPost) + "Content-Length: -1\r\n\r\n");
  const json e = json::parse(body_of(r.read_response()))["error"];
  EXPECT_EQ(e["code"], 400);
  EXPECT_NE(e["message"].get<std::string>().find("Content-Length"), std::string::npos) << e;
  // And the server goes on.
  EXPECT_EQ(rig.client().Get("/health")->status, 200);
}

TEST(ServerAbuse, HeaderBlocksOverTheLimitsAre431) {
  Rig rig;
  const int port = rig.srv->port();
  std::string many = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 1000; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(answer(port, many + "\r\n"), 431);
  EXPECT_EQ(
      answer(port, "GET /health HTTP/1.1\r\nX-Big: " + std::string(100 << 10, 'a') + "\r\n\r\n"),
      431);
  std::string fine = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 150; ++i) fine += "X-H" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(answer(port, fine + "\r\n"), 200);
}

TEST(ServerAbuse, LargeBodiesAreRefusedBeforeTheyAreRead) {
  ServerOptions o;
  o.max_body_bytes = 4096;
  Rig rig(o);
  const int port = rig.srv->port();
  // The length alone decides: no body byte is sent, yet the answer comes.
  EXPECT_EQ(answer(port, std::string(kPost) + "Content-Length: 5000\r\n\r\n"), 413);
  EXPECT_EQ(
      answer(port, std::string(kPost) + "Content-Length: 5000\r\nExpect: 100-continue\r\n\r\n"),
      413);
  // Chunks: refused as soon as they pass the limit.
  EXPECT_EQ(answer(port, std::string(kPost) + "Transfer-Encoding: chunked\r\n\r\n1000\r\n" +
                             std::string(4096, 'a') + "\r\n10\r\n"),
            413);
  // Expect: 100-continue within the limit: the server says continue, then answers.
  Raw r(port);
  const std::string body = R"({"prompt":[1,2],"max_tokens":2})";
  r.send(std::string(kPost) + "Content-Length: " + std::to_string(body.size()) +
         "\r\nExpect: 100-continue\r\n\r\n");
  char buf[64] = {};
  ASSERT_GT(::recv(r.fd, buf, sizeof buf - 1, 0), 0);
  EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << buf;
  r.send(body);
  EXPECT_EQ(status_of(r.read_response()), 200);
}

TEST(ServerAbuse, NonJsonBodiesAre415AndToolsNeedAFunction) {
  Rig rig;
  auto c = rig.client();
  auto r = c.Post("/v1/completions", R"({"prompt":[1],"max_tokens":1})", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 415) << r->body;
  r = c.Post("/v1/completions", R"({"prompt":[1],"max_tokens":1})",
             "application/json; charset=utf-8");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = c.Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"tools":[{"type":"function"}]})",
      "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  auto e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], "tools");
  EXPECT_NE(e["message"].get<std::string>().find("tools[0].function"), std::string::npos) << e;
}

// Slow clients: hundreds of connections trickling partial heads hold no thread, so normal
// requests are answered meanwhile; the head deadline then ends them with 408.
TEST(ServerAbuse, SlowHeadersDoNotLockOthersOut) {
  ServerOptions o;
  o.head_timeout_s = 2;
  Rig rig(o);
  const int port = rig.srv->port();
  std::vector<std::unique_ptr<Raw>> slow;
  for (int i = 0; i < 400; ++i) {
    slow.push_back(std::make_unique<Raw>(port, 10));
    slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ");
  }
  // Before: about as many connections as threads (256 for this rig) locked everyone out.
  for (int i = 0; i < 3; ++i) {
    for (auto& s : slow) s->send("a");
    auto c = rig.client();
    c.set_read_timeout(3, 0);
    auto r = c.Post("/v1/completions", R"({"prompt":[1,2],"max_tokens":2})", "application/json");
    ASSERT_TRUE(r) << "a normal request got no answer while slow clients were connected";
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_LT(threads_now(), 64);
  // A client that keeps trickling cannot hold its connection: the head deadline answers 408.
  int timed_out = 0;
  for (auto& s : slow) timed_out += status_of(s->read_response()) == 408;
  EXPECT_EQ(timed_out, 400);
}

TEST(ServerAbuse, ConnectionsOverTheCapGet503AtOnce) {
  ServerOptions o;
  o.max_connections = 40;
  Rig rig(o);
  const int port = rig.srv->port();
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<Raw>(port));
  std::this_thread::sleep_for(200ms);  // let the loop accept them
  Raw over(port);
  over.send("GET /health HTTP/1.1\r\n\r\n");
  const std::string got = over.read_response();
  EXPECT_EQ(status_of(got), 503) << got;
  idle.clear();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(answer(port, "GET /health HTTP/1.1\r\n\r\n"), 200);
}

// Many concurrent streams over a cache too small for them (preemption) and a few bounded
// threads: every stream ends with a finish reason and [DONE], and the cache is empty after.
TEST(ServerAbuse, ManyStreamsWithPreemptionAndBoundedThreads) {
  ServerOptions o;
  Rig rig(o, 256, 24, false, 64);
  const int port = rig.srv->port();
  const int n = 600;
  std::atomic<int> done{0};
  std::atomic<int> peak{0};
  std::vector<std::thread> clients;
  std::atomic<bool> watching{true};
  std::thread watch([&] {
    while (watching) {
      peak = std::max(peak.load(), threads_now());
      std::this_thread::sleep_for(20ms);
    }
  });
  // Few client threads, each with many open streams (select over raw sockets).
  for (int t = 0; t < 8; ++t)
    clients.emplace_back([&, t] {
      std::vector<std::unique_ptr<Raw>> conns;
      for (int i = t; i < n; i += 8) {
        conns.push_back(std::make_unique<Raw>(port, 60));
        const std::string body =
            R"({"prompt":[)" + std::to_string(1 + i % 250) +
            R"(,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"max_tokens":40,"ignore_eos":true,"stream":true})";
        conns.back()->send(std::string(kPost) + "Content-Length: " + std::to_string(body.size()) +
                           "\r\n\r\n" + body);
      }
      for (auto& c : conns) {
        std::string got;
        char buf[65536];
        while (got.find("data: [DONE]") == std::string::npos) {
          const ssize_t k = ::recv(c->fd, buf, sizeof buf, 0);
          if (k <= 0) break;
          got.append(buf, size_t(k));
        }
        if (got.find("data: [DONE]") != std::string::npos &&
            got.find("\"finish_reason\":\"length\"") != std::string::npos)
          ++done;
      }
    });
  for (auto& c : clients) c.join();
  watching = false;
  watch.join();
  EXPECT_EQ(done.load(), n);
  EXPECT_GT(rig.engine->stats().preemptions, 0);
  EXPECT_TRUE(rig.engine->wait_idle(5s));
  EXPECT_EQ(rig.engine->stats().num_free_blocks, 24);
  // One event loop, a few HTTP workers, the engine and its step workers, these clients.
  EXPECT_LT(peak.load(), 64) << "threads grew with the streams";
}

// A disconnect storm: streams dropped mid-way (and requests dropped while queued) are aborted,
// and every block comes back.
TEST(ServerAbuse, DisconnectStormFreesEveryBlock) {
  ServerOptions o;
  Rig rig(o, 256, 32, false, 16);
  rig.model.delay_us = 2000;
  const int port = rig.srv->port();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<Raw>> conns;
    for (int i = 0; i < 150; ++i) {
      conns.push_back(std::make_unique<Raw>(port));
      const std::string body = R"({"prompt":[1,2,3],"max_tokens":200,"ignore_eos":true,"stream":)" +
                               std::string(i % 3 ? "true" : "false") + "}";
      conns.back()->send(std::string(kPost) + "Content-Length: " + std::to_string(body.size()) +
                         "\r\n\r\n" + body);
    }
    std::this_thread::sleep_for(300ms);
    for (size_t i = 0; i < conns.size(); ++i) {
      if (i % 2) {
        linger l{1, 0};  // a reset, as a killed client
        ::setsockopt(conns[i]->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      }
    }
    conns.clear();
    EXPECT_TRUE(rig.engine->wait_idle(10s));
    EXPECT_EQ(rig.engine->stats().num_free_blocks, 32);
    EXPECT_EQ(rig.engine->stats().num_running, 0);
  }
  EXPECT_EQ(rig.client().Get("/health")->status, 200);
}

}  // namespace
}  // namespace sieve::server
