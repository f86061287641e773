#include "engine/workers.h"

#include <algorithm>
#include <csignal>
#include <utility>

#include <pthread.h>

namespace sieve::engine {

Workers::Workers(int threads) {
  // The helpers take no signals (a server waits for SIGTERM on a thread of its own): they start
  // with every signal blocked, the caller's mask restored after.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  for (int i = 0; i < threads; ++i) pool_.emplace_back([this] { work(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Workers::~Workers() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : pool_) t.join();
}

int Workers::default_threads(int cap) {
  const int hw = int(std::thread::hardware_concurrency());
  return std::clamp(hw - 1, 0, cap);
}

// Takes indices of the current batch until none is left; lk holds mu_ and is released around
// each call of fn.
void Workers::drain(std::unique_lock<std::mutex>& lk) {
  while (fn_ && next_ < n_) {
    const int64_t i = next_++;
    const auto* fn = fn_;
    lk.unlock();
    std::exception_ptr err;
    try {
      (*fn)(i);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (err && !error_) error_ = err;
    if (++finished_ == n_) done_.notify_all();
  }
}

void Workers::work() {
  std::unique_lock lk(mu_);
  uint64_t seen = generation_;
  while (true) {
    wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    drain(lk);
  }
}

void Workers::run(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (pool_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::unique_lock lk(mu_);
  fn_ = &fn;
  n_ = n;
  next_ = 0;
  finished_ = 0;
  error_ = nullptr;
  ++generation_;
  wake_.notify_all();
  drain(lk);
  done_.wait(lk, [&] { return finished_ == n_; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace sieve::engine
