// Tensor-parallel ranks in one process: one model shard, one Runner and one driver thread per
// rank, in lockstep. The engine sees one runner, rank 0's (leader()): every step, cache
// allocation and reservation it is given is repeated at the same time by the other ranks' runners
// on their own shards, with the same inputs, so their collectives meet; the logits the engine
// reads are rank 0's (whole, gathered by the model). CPU ranks talk through a ThreadGroup
// (threads, shared memory); CUDA ranks are one GPU each (device r for rank r) and talk through
// NCCL: one process, one thread per GPU, so that a step is handed to the ranks as a function
// call, CUDA graphs capture each rank's collectives, and nothing but NCCL crosses between GPUs.
// A rank that throws breaks the group: the communicators are aborted (no rank waits for it),
// the leader's call throws the first rank's error, and every later call throws at once.
//
// Across machines (--nnodes): each machine's process holds a group of its own ranks (global ranks
// rank0 .. rank0 + size - 1 of `world`). Node 0's leader sends every call, as a RankCommand, over
// the rendezvous connections to the other nodes, whose process runs follow(): its leader repeats
// the call on its ranks and answers when done (or with its error, which breaks node 0's group).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/runner.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/rendezvous.h"

namespace sieve::parallel {
class ThreadGroup;
}

namespace sieve::engine {

struct RankGroupOptions {
  int size = 1;   // tensor-parallel ranks (all in this process)
  Device device;  // CPU: thread ranks; CUDA: ranks on devices 0 .. size - 1
  // How long a rank waits for the others (forming the NCCL group, a collective on the CPU)
  // before the group is declared broken.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  RunnerOptions runner;
  // Several machines: this process's ranks are global ranks rank0 .. rank0 + size - 1 of world
  // (world 0: size), the NCCL group's id comes from the rendezvous, and `links` are its
  // connections (node 0: to every other node; another node: to node 0).
  int rank0 = 0, world = 0;
  std::string nccl_id;
  std::vector<std::unique_ptr<parallel::NodeLink>> links;
  // Tests: communicators made elsewhere (one per local rank, not owned); none: made here.
  std::vector<ops::Collective*> comms;
};

// One call as bytes (the frames node 0 sends the other nodes), and back.
std::string encode_command(const RankCommand& c);
RankCommand decode_command(const std::string& bytes);

// Makes global rank `rank`'s model on `device`, talking through `group` (LoadOptions::group).
using ShardLoader = std::function<std::unique_ptr<model::Model>(int rank, const Device& device,
                                                                ops::Collective* group)>;

class RankGroup final : public Followers {
 public:
  // Forms the communicators, loads the shards (in parallel, one thread per rank) and starts the
  // driver threads. Throws Error when the ranks do not fit the machine (more ranks than GPUs) or
  // a rank's load fails (naming the rank).
  RankGroup(RankGroupOptions opts, const ShardLoader& load);
  ~RankGroup() override;
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return int(ranks_.size()); }
  // Rank 0's runner: what the engine drives.
  Runner& leader() { return *ranks_[0].runner; }
  model::Model& model(int rank = 0) { return *ranks_[size_t(rank)].model; }
  Runner& runner(int rank) { return *ranks_[size_t(rank)].runner; }
  ops::Collective* collective(int rank) const { return ranks_[size_t(rank)].comm; }
  // Another node's process (rank0 > 0): runs node 0's calls on this node's ranks until node 0
  // ends the run (returns) or goes away or a call fails (throws Error).
  bool follows_another_node() const { return opts_.rank0 > 0; }
  void follow();

  // Followers (Runner calls these; see runner.h).
  void start(const RankCommand& c) override;
  void finish(const std::string& leader_error) override;
  std::string broken() const override;

 private:
  struct Rank {
    ops::Collective* comm = nullptr;
    std::unique_ptr<model::Model> model;
    std::unique_ptr<Runner> runner;
    std::thread thread;
  };
  void drive(int rank);
  // Node 0: reads the other nodes' answers (one thread per link).
  void listen(size_t link);
  // Records the first failure and aborts the communicators so that no rank waits any longer.
  void fail(int rank, const std::string& what);

  RankGroupOptions opts_;
  std::unique_ptr<parallel::ThreadGroup> threads_;      // CPU ranks' communicator
  std::vector<std::unique_ptr<ops::Collective>> nccl_;  // CUDA ranks' communicators
  std::vector<Rank> ranks_;
  std::vector<std::thread> listeners_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RankCommand job_;
  uint64_t job_gen_ = 0;
  int pending_ = 0;  // followers (local ranks and other nodes) still running the current job
  bool stop_ = false;
  std::string error_;  // the first failure ("rank r: ..."), "" while the group works
};

}  // namespace sieve::engine
