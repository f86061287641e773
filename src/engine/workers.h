// A small pool of threads for the engine's per-request work of a step (sampling: a masked,
// filtered draw over the whole vocabulary for each request, independent of the others).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sieve::engine {

class Workers {
 public:
  // `threads` helpers besides the caller (0: everything runs on the caller).
  explicit Workers(int threads);
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Calls fn(i) for every i in [0, n), on the helpers and the caller, and returns when all are
  // done. Each i runs once; the order across threads is unspecified. The first exception fn
  // throws is rethrown here once all are done. Not reentrant.
  void run(int64_t n, const std::function<void(int64_t)>& fn);

  int threads() const { return int(pool_.size()); }

  // Helpers for this machine: one fewer than its hardware threads, at most `cap`.
  static int default_threads(int cap = 15);

 private:
  void work();
  void drain(std::unique_lock<std::mutex>& lk);

  std::vector<std::thread> pool_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace sieve::engine
