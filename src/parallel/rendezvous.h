// Rendezvous of the nodes of a multi-node run over TCP (SGLang's --nnodes / --node-rank /
// --dist-init-addr): node 0 listens at HOST:PORT, every other node connects to it; once all have
// joined, node 0 sends each of them the same bytes (the NCCL unique id of the run). Each side
// checks that the others describe the same run (`run_key`, e.g. "tp=8 nnodes=2 model=..."), so a
// node started with other flags is refused with a message instead of joining a wrong group.
#pragma once

#include <chrono>
#include <string>

namespace sieve::parallel {

struct RendezvousOptions {
  std::string addr;      // HOST:PORT of node 0 (node 0 binds to it; IPv4 or a host name)
  int nnodes = 1;
  int node_rank = 0;     // 0 .. nnodes-1
  std::string run_key;   // must be equal on every node
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// Node 0: waits for the other nnodes-1 nodes, then sends them `payload` and returns it.
// Other nodes: connect (retrying until the timeout), announce themselves, return node 0's payload.
// A node that never joins, a duplicate node rank, or a different run_key: Error naming it.
std::string rendezvous(const RendezvousOptions& o, const std::string& payload);

// "HOST:PORT" -> host, port; Error naming the flag when malformed.
void parse_host_port(const std::string& addr, std::string& host, int& port);

}  // namespace sieve::parallel
