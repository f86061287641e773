#include "engine/rank_group.h"

#include "core/error.h"
#include "core/log.h"
#include "kernels/memory.h"
#include "parallel/nccl_group.h"
#include "parallel/thread_group.h"

namespace sieve::engine {

namespace {

// Runs fn(r) for every rank on a thread of its own; the errors by rank ("" where none).
std::vector<std::string> on_every_rank(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
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

void throw_first(const std::vector<std::string>& errors, int n) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      throw Error(n > 1 ? "tensor-parallel rank " + std::to_string(r) + ": " + errors[r] : errors[r]);
}

}  // namespace

RankGroup::RankGroup(const RankGroupOptions& o, const ShardLoader& load) : opts_(o) {
  const int n = o.size;
  if (n < 1) throw Error("--tensor-parallel-size must be at least 1, got " + std::to_string(n));
  ranks_.resize(size_t(n));
  if (n > 1 && o.device.is_cuda()) {
    const int gpus = cuda_device_count();
    if (gpus < n)
      throw Error("--tensor-parallel-size " + std::to_string(n) + " needs " + std::to_string(n) +
                  " CUDA devices (one per rank), but this machine has " + std::to_string(gpus));
    if (!parallel::have_nccl())
      throw Error("--tensor-parallel-size " + std::to_string(n) + " on CUDA devices needs NCCL, which this build lacks");
    // Every rank joins at once (NCCL's initialisation waits for all of them).
    const std::string id = parallel::nccl_unique_id();
    nccl_.resize(size_t(n));
    throw_first(on_every_rank(n, [&](int r) { nccl_[size_t(r)] = parallel::nccl_collective(id, r, n, r, o.timeout); }), n);
    for (int r = 0; r < n; ++r) ranks_[size_t(r)].comm = nccl_[size_t(r)].get();
  } else if (n > 1) {
    threads_ = std::make_unique<parallel::ThreadGroup>(n, o.timeout);
    for (int r = 0; r < n; ++r) ranks_[size_t(r)].comm = threads_->rank(r);
  }
  // The shards load in parallel (reading the checkpoint and filling a device each).
  throw_first(on_every_rank(n,
                            [&](int r) {
                              Device dev = o.device;
                              if (dev.is_cuda() && n > 1) dev.index = r;
                              Rank& k = ranks_[size_t(r)];
                              k.model = load(r, dev, n > 1 ? k.comm : nullptr);
                              k.runner = std::make_unique<Runner>(*k.model, o.runner);
                            }),
              n);
  if (n == 1) return;
  for (int r = 1; r < n; ++r) ranks_[size_t(r)].thread = std::thread([this, r] { drive(r); });
  ranks_[0].runner->set_followers(this);
  SIEVE_LOG(Info, "tensor parallelism: " << n << " ranks on "
                                         << (o.device.is_cuda() ? "CUDA devices 0.." + std::to_string(n - 1) + " (NCCL)"
                                                                : std::string("CPU threads")));
}

RankGroup::~RankGroup() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& k : ranks_)
    if (k.thread.joinable()) k.thread.join();
  // The runners and models go before the communicators they use.
  for (auto& k : ranks_) {
    k.runner.reset();
    k.model.reset();
  }
}

void RankGroup::drive(int r) {
  uint64_t seen = 0;
  for (;;) {
    std::function<void(Runner&)> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    try {
      job(*ranks_[size_t(r)].runner);
    } catch (const std::exception& e) {
      fail(r, e.what());
    }
    {
      std::lock_guard lk(mu_);
      --pending_;
    }
    cv_.notify_all();
  }
}

void RankGroup::start(std::function<void(Runner&)> job) {
  {
    std::lock_guard lk(mu_);
    SIEVE_CHECK(pending_ == 0, "a tensor-parallel job started before the last one finished");
    job_ = std::move(job);
    ++job_gen_;
    pending_ = size() - 1;
  }
  cv_.notify_all();
}

void RankGroup::finish(const std::string& leader_error) {
  if (!leader_error.empty()) fail(0, leader_error);
  std::unique_lock lk(mu_);
  // A follower stuck outside any collective (which would have timed out) past the timeout breaks
  // the group; it is then left behind, and the process is expected to stop.
  if (!cv_.wait_for(lk, opts_.timeout + std::chrono::seconds(30), [&] { return pending_ == 0; })) {
    lk.unlock();
    fail(-1, "a rank did not finish its part of a step within " +
                 std::to_string(opts_.timeout.count() / 1000) + " s");
    lk.lock();
  }
  job_ = nullptr;
  if (!error_.empty()) throw Error("tensor-parallel " + error_);
}

std::string RankGroup::broken() const {
  std::lock_guard lk(mu_);
  return error_;
}

void RankGroup::fail(int rank, const std::string& what) {
  {
    std::lock_guard lk(mu_);
    if (!error_.empty()) return;  // a consequence of the first failure
    error_ = rank >= 0 ? "rank " + std::to_string(rank) + " failed: " + what : "group failed: " + what;
  }
  SIEVE_LOG(Error, "tensor-parallel " << error_);
  for (auto& k : ranks_)
    if (k.comm) k.comm->abort(error_);
}

}  // namespace sieve::engine
