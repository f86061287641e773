#include "parallel/rendezvous.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "core/error.h"

namespace sieve::parallel {
namespace {

// A port nobody listens on right now (bound, read, released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct Outcome {
  std::string payload, error;
};

std::vector<Outcome> run_nodes(int nnodes, const std::vector<std::string>& keys, const std::vector<int>& node_ranks,
                               std::chrono::milliseconds timeout,
                               std::chrono::milliseconds joiner_timeout = std::chrono::milliseconds(0)) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Outcome> out(node_ranks.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < node_ranks.size(); ++i)
    ts.emplace_back([&, i] {
      RendezvousOptions o;
      o.addr = addr;
      o.nnodes = nnodes;
      o.node_rank = node_ranks[i];
      o.run_key = keys[i];
      o.timeout = node_ranks[i] != 0 && joiner_timeout.count() > 0 ? joiner_timeout : timeout;
      try {
        out[i].payload = rendezvous(o, node_ranks[i] == 0 ? std::string("id\0with\nbytes", 13) : "");
      } catch (const Error& e) {
        out[i].error = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return out;
}

TEST(Rendezvous, EveryNodeGetsNodeZerosPayloadOverLoopback) {
  const std::string key = "tp=8 nnodes=4 model=m3";
  // Nodes start in any order; the joiners retry until node 0 listens.
  auto out = run_nodes(4, {key, key, key, key}, {3, 1, 0, 2}, std::chrono::seconds(20));
  for (const auto& o : out) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.payload, std::string("id\0with\nbytes", 13));
  }
}

TEST(Rendezvous, ANodeThatNeverJoinsIsNamedAfterTheTimeout) {
  // Node 1 waits longer than node 0, so what it reports is node 0's verdict, not its own clock.
  auto out = run_nodes(3, {"k", "k"}, {0, 1}, std::chrono::milliseconds(500), std::chrono::seconds(20));
  EXPECT_NE(out[0].error.find("node(s) 2 did not join"), std::string::npos) << out[0].error;
  EXPECT_NE(out[1].error.find("did not join"), std::string::npos) << out[1].error;
}

TEST(Rendezvous, ANodeOfAnotherRunIsRefusedOnBothSides) {
  auto out = run_nodes(2, {"tp=8", "tp=4"}, {0, 1}, std::chrono::seconds(20));
  EXPECT_NE(out[0].error.find("describes another run"), std::string::npos) << out[0].error;
  EXPECT_NE(out[1].error.find("refused"), std::string::npos) << out[1].error;
}

TEST(Rendezvous, NodeZeroThatNeverComesEndsInATimeout) {
  auto out = run_nodes(2, {"k"}, {1}, std::chrono::milliseconds(600));
  EXPECT_NE(out[0].error.find("could not reach node 0"), std::string::npos) << out[0].error;
}

TEST(Rendezvous, BadFlagsAreNamed) {
  std::string host;
  int port = 0;
  EXPECT_THROW(parse_host_port("nohost", host, port), Error);
  EXPECT_THROW(parse_host_port("h:99999", host, port), Error);
  EXPECT_THROW(parse_host_port("h:12x", host, port), Error);
  parse_host_port("10.0.0.1:29500", host, port);
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 29500);
  RendezvousOptions o;
  o.nnodes = 2;
  o.node_rank = 2;
  o.addr = "127.0.0.1:1";
  try {
    rendezvous(o, "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--node-rank"), std::string::npos);
  }
}

}  // namespace
}  // namespace sieve::parallel
