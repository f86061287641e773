// Tensor-parallel ranks as threads of one process, for the CPU backend: the collectives of
// kernels/ops.h (ops::Collective) over shared memory. Sums run in rank order in fp32, so every
// rank gets the same bits, and a run is reproducible whatever the threads' timing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace sieve::parallel {

class ThreadGroup {
 public:
  // `timeout`: how long a rank waits in a collective for the others before the whole group is
  // declared broken (a rank that died or went astray must not hang the rest).
  explicit ThreadGroup(int size, std::chrono::milliseconds timeout = std::chrono::minutes(10));
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const { return size_; }
  // The handle rank r uses (r in [0, size)); valid while the group lives.
  ops::Collective* rank(int r) const;

  // Breaks the group: every rank waiting in a collective, and every later collective, throws
  // Error with `why`. Called when one rank fails, so the others stop instead of waiting.
  void abort(const std::string& why);
  bool aborted() const;

 private:
  class Rank;
  friend class Rank;
  // Waits until every rank arrived at this barrier (or throws when the group breaks or times out).
  void arrive_and_wait(int rank);

  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string broken_;  // why the group broke ("" while it works)
  // The collective in flight: each rank's buffers, and the fp32 sum shared by all.
  std::vector<const void*> in_;
  std::vector<void*> out_;
  std::vector<float> sum_;
};

// Runs fn(r) for r in [0, n), each on a thread of its own, and joins them all; returns each
// rank's error text ("" where fn returned), so one rank's exception never leaves the others
// unjoined.
std::vector<std::string> run_on_threads(int n, const std::function<void(int)>& fn);

}  // namespace sieve::parallel
