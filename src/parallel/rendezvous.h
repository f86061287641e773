// Rendezvous of the nodes of a multi-node run over TCP (SGLang's --nnodes / --node-rank /
// --dist-init-addr): node 0 listens at HOST:PORT, every other node connects to it; once all have
// joined, node 0 sends each of them the same bytes (the NCCL unique id of the run). Each side
// checks that the others describe the same run (`run_key`, e.g. "tp=8 nnodes=2 model=..."), so a
// node started with other flags is refused with a message instead of joining a wrong group.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace sieve::parallel {

struct RendezvousOptions {
  std::string addr;      // HOST:PORT of node 0 (node 0 binds to it; IPv4 or a host name)
  int nnodes = 1;
  int node_rank = 0;     // 0 .. nnodes-1
  std::string run_key;   // must be equal on every node
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// A TCP connection between node 0 and another node, kept after the rendezvous: node 0 hands the
// other nodes each step of a multi-node run over it (engine/rank_group.h). Frames are
// length-prefixed byte strings.
class NodeLink {
 public:
  NodeLink(int fd, int node);
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;
  int node() const { return node_; }  // the node at the other end
  // Throws Error when the other end is gone.
  void send(const std::string& frame);
  // Waits up to `timeout` (forever when negative); Error at the timeout or when the other end
  // closed the connection.
  std::string recv(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  // Ends the connection from any thread (a recv waiting on it returns with an Error).
  void close();

 private:
  int fd_;
  int node_;
};

struct Joined {
  std::string payload;                            // node 0's
  std::vector<std::unique_ptr<NodeLink>> links;  // node 0: to nodes 1..n-1; others: to node 0
};

// The rendezvous, keeping the connections open (none with one node).
Joined rendezvous_links(const RendezvousOptions& o, const std::string& payload);

// Node 0: waits for the other nnodes-1 nodes, then sends them `payload` and returns it.
// Other nodes: connect (retrying until the timeout), announce themselves, return node 0's payload.
// A node that never joins, a duplicate node rank, or a different run_key: Error naming it.
std::string rendezvous(const RendezvousOptions& o, const std::string& payload);

// "HOST:PORT" -> host, port; Error naming the flag when malformed.
void parse_host_port(const std::string& addr, std::string& host, int& port);

}  // namespace sieve::parallel
