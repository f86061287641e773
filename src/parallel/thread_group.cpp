#include "parallel/thread_group.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"

namespace sieve::parallel {

class ThreadGroup::Rank final : public ops::Collective {
 public:
  Rank(ThreadGroup& g, int r) : g_(g), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return g_.size_; }

  void all_reduce_sum(void* data, DType dtype, int64_t count, const ops::Stream& s) override {
    SIEVE_CHECK(s.device.is_cpu(), "a thread group reduces host memory");
    if (dtype != DType::F32 && dtype != DType::BF16)
      throw Error("all_reduce: dtype " + std::string(dtype_name(dtype)) + " is not supported (F32 or BF16)");
    // 1. Publish the buffer. 2. Each rank sums its slice of the elements over all ranks, in rank
    // order, into the shared fp32 sum. 3. Each rank copies the whole sum back into its buffer.
    // The barrier at the start of the next collective keeps the sum alive until all have copied.
    {
      std::lock_guard lk(g_.mu_);
      if (r_ == 0) g_.sum_.assign(size_t(count), 0.0f);
      g_.out_[size_t(r_)] = data;
    }
    g_.arrive_and_wait(r_);
    const int n = g_.size_;
    const int64_t lo = count * r_ / n, hi = count * (r_ + 1) / n;
    for (int64_t i = lo; i < hi; ++i) {
      float acc = 0;
      for (int q = 0; q < n; ++q) acc += load_as_f32(g_.out_[size_t(q)], dtype, size_t(i));
      g_.sum_[size_t(i)] = acc;
    }
    g_.arrive_and_wait(r_);
    for (int64_t i = 0; i < count; ++i) store_from_f32(data, dtype, size_t(i), g_.sum_[size_t(i)]);
    g_.arrive_and_wait(r_);
  }

  void all_gather(const void* in, void* out, DType dtype, int64_t count, const ops::Stream& s) override {
    SIEVE_CHECK(s.device.is_cpu(), "a thread group gathers host memory");
    const size_t bytes = size_t(count) * dtype_size(dtype);
    {
      std::lock_guard lk(g_.mu_);
      g_.in_[size_t(r_)] = in;
    }
    g_.arrive_and_wait(r_);
    for (int q = 0; q < g_.size_; ++q)
      std::memcpy(static_cast<uint8_t*>(out) + size_t(q) * bytes, g_.in_[size_t(q)], bytes);
    g_.arrive_and_wait(r_);  // the inputs stay untouched until every rank has read them
  }

  void abort(const std::string& why) override { g_.abort(why); }

 private:
  ThreadGroup& g_;
  int r_;
};

ThreadGroup::ThreadGroup(int size, std::chrono::milliseconds timeout) : size_(size), timeout_(timeout) {
  if (size < 1) throw Error("a tensor-parallel group needs at least one rank, got " + std::to_string(size));
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  in_.assign(size_t(size), nullptr);
  out_.assign(size_t(size), nullptr);
}

ThreadGroup::~ThreadGroup() = default;

ops::Collective* ThreadGroup::rank(int r) const {
  SIEVE_CHECK(r >= 0 && r < size_, "rank outside the group");
  return ranks_[size_t(r)].get();
}

void ThreadGroup::abort(const std::string& why) {
  std::lock_guard lk(mu_);
  if (broken_.empty()) broken_ = why.empty() ? "a rank failed" : why;
  cv_.notify_all();
}

bool ThreadGroup::aborted() const {
  std::lock_guard lk(mu_);
  return !broken_.empty();
}

void ThreadGroup::arrive_and_wait(int rank) {
  std::unique_lock lk(mu_);
  if (!broken_.empty()) throw Error("tensor-parallel group stopped: " + broken_);
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  const bool done = cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || !broken_.empty(); });
  if (generation_ != gen) return;
  if (done) throw Error("tensor-parallel group stopped: " + broken_);
  broken_ = "rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
            " ms in a collective for the other ranks";
  cv_.notify_all();
  throw Error("tensor-parallel group stopped: " + broken_);
}

std::vector<std::string> run_on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(std::max(n, 0)));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace sieve::parallel
