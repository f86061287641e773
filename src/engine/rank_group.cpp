#include "engine/rank_group.h"

#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kernels/memory.h"
#include "parallel/nccl_group.h"
#include "parallel/rendezvous.h"
#include "parallel/thread_group.h"

namespace sieve::engine {

namespace {

void throw_first(const std::vector<std::string>& errors, int n) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      throw Error(n > 1 ? "tensor-parallel rank " + std::to_string(r) + ": " + errors[r]
                        : errors[r]);
}

// Little-endian fixed-width fields and length-prefixed arrays.
class Writer {
 public:
  template <class T>
  void put(T v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    s_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <class T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, s_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  template <class T>
  void get(std::vector<T>& v) {
    const uint64_t n = get<uint64_t>();
    need(n * sizeof(T));
    v.resize(n);
    if (n) std::memcpy(v.data(), s_.data() + at_, n * sizeof(T));  // an empty vector's data() may be null
    at_ += n * sizeof(T);
  }
  void done() const {
    if (at_ != s_.size())
      throw Error("a step from node 0 has " + std::to_string(s_.size() - at_) + " bytes too many");
  }

 private:
  void need(uint64_t n) const {
    if (n > s_.size() - at_)
      throw Error("a step from node 0 is cut short (another version of sieve?)");
  }
  const std::string& s_;
  size_t at_ = 0;
};

constexpr uint32_t kCommandMagic = 0x53544550;  // "STEP", and the layout's version below

}  // namespace

std::string encode_command(const RankCommand& c) {
  Writer w;
  w.put<uint32_t>(kCommandMagic);
  w.put<uint8_t>(uint8_t(c.kind));
  const StepInputs& in = c.in;
  for (const auto* v : {&in.token_ids, &in.positions, &in.query_start_loc, &in.seq_lens,
                        &in.block_tables, &in.logits_indices, &in.hidden_rows, &in.draft_rows})
    w.put(*v);
  w.put(in.slot_mapping);
  w.put<int32_t>(in.max_blocks_per_seq);
  const model::CacheOptions& co = c.caches;
  w.put<uint8_t>(uint8_t(co.kv_dtype));
  w.put<uint8_t>(uint8_t(co.index_dtype));
  w.put<int64_t>(co.num_blocks);
  w.put<uint8_t>(co.dense);
  w.put<uint8_t>(co.compare_index);
  w.put<uint8_t>(uint8_t(co.compare_index_dtype));
  w.put<int64_t>(c.max_tokens);
  w.put<int64_t>(c.max_seqs);
  return w.take();
}

RankCommand decode_command(const std::string& bytes) {
  Reader r(bytes);
  if (r.get<uint32_t>() != kCommandMagic)
    throw Error("node 0 sent something that is not a step of this version");
  RankCommand c;
  const uint8_t kind = r.get<uint8_t>();
  if (kind > uint8_t(RankCommand::Kind::Reserve)) throw Error("node 0 sent an unknown call");
  c.kind = RankCommand::Kind(kind);
  StepInputs& in = c.in;
  for (auto* v : {&in.token_ids, &in.positions, &in.query_start_loc, &in.seq_lens, &in.block_tables,
                  &in.logits_indices, &in.hidden_rows, &in.draft_rows})
    r.get(*v);
  r.get(in.slot_mapping);
  in.max_blocks_per_seq = r.get<int32_t>();
  model::CacheOptions& co = c.caches;
  co.kv_dtype = DType(r.get<uint8_t>());
  co.index_dtype = DType(r.get<uint8_t>());
  co.num_blocks = r.get<int64_t>();
  co.dense = r.get<uint8_t>() != 0;
  co.compare_index = r.get<uint8_t>() != 0;
  co.compare_index_dtype = DType(r.get<uint8_t>());
  c.max_tokens = r.get<int64_t>();
  c.max_seqs = r.get<int64_t>();
  r.done();
  return c;
}

RankGroup::RankGroup(RankGroupOptions opts, const ShardLoader& load) : opts_(std::move(opts)) {
  const RankGroupOptions& o = opts_;
  const int n = o.size;
  if (n < 1) throw Error("--tensor-parallel-size must be at least 1, got " + std::to_string(n));
  if (opts_.world == 0) opts_.world = n;
  const int world = opts_.world, rank0 = opts_.rank0;
  ranks_.resize(size_t(n));
  if (!o.comms.empty()) {
    SIEVE_CHECK(int(o.comms.size()) == n, "one communicator per rank");
    for (int r = 0; r < n; ++r) ranks_[size_t(r)].comm = o.comms[size_t(r)];
  } else if (world > 1 && o.device.is_cuda()) {
    const int gpus = cuda_device_count();
    if (gpus < n)
      throw Error("--tensor-parallel-size " + std::to_string(n) + " needs " + std::to_string(n) +
                  " CUDA devices (one per rank), but this machine has " + std::to_string(gpus));
    if (!parallel::have_nccl())
      throw Error("--tensor-parallel-size " + std::to_string(n) +
                  " on CUDA devices needs NCCL, which this build lacks");
    // Every rank joins at once (NCCL's initialisation waits for all of them, on every node).
    const std::string id = o.nccl_id.empty() ? parallel::nccl_unique_id() : o.nccl_id;
    nccl_.resize(size_t(n));
    throw_first(parallel::run_on_threads(n,
                                         [&](int r) {
                                           nccl_[size_t(r)] =
                                               parallel::nccl_collective(id, rank0 + r, world, r, o.timeout);
                                         }),
                n);
    for (int r = 0; r < n; ++r) ranks_[size_t(r)].comm = nccl_[size_t(r)].get();
  } else if (world > 1) {
    if (world != n) throw Error("tensor-parallel ranks on other machines need CUDA devices (NCCL)");
    threads_ = std::make_unique<parallel::ThreadGroup>(n, o.timeout);
    for (int r = 0; r < n; ++r) ranks_[size_t(r)].comm = threads_->rank(r);
  }
  // The shards load in parallel (reading the checkpoint and filling a device each).
  throw_first(parallel::run_on_threads(n,
                                       [&](int r) {
                                         Device dev = o.device;
                                         if (dev.is_cuda() && world > 1) dev.index = r;
                                         Rank& k = ranks_[size_t(r)];
                                         k.model = load(rank0 + r, dev, world > 1 ? k.comm : nullptr);
                                         k.runner = std::make_unique<Runner>(*k.model, o.runner);
                                       }),
              n);
  if (world == 1) return;
  for (int r = 1; r < n; ++r) ranks_[size_t(r)].thread = std::thread([this, r] { drive(r); });
  if (rank0 == 0) {
    for (size_t i = 0; i < opts_.links.size(); ++i)
      listeners_.emplace_back([this, i] { listen(i); });
    ranks_[0].runner->set_followers(this);
  } else if (n > 1) {
    ranks_[0].runner->set_followers(this);  // this node's leader drives its own ranks
  }
  SIEVE_LOG(Info,
            "tensor parallelism: ranks "
                << rank0 << ".." << rank0 + n - 1 << " of " << world << " on "
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
  // Node 0: the other nodes' follow() returns; their answers' readers end with the links.
  if (opts_.rank0 == 0)
    for (auto& l : opts_.links) {
      try {
        l->send("STOP");
      } catch (const Error&) {
      }
      l->close();
    }
  for (auto& t : listeners_) t.join();
  // The runners and models go before the communicators they use.
  for (auto& k : ranks_) {
    k.runner.reset();
    k.model.reset();
  }
}

void RankGroup::drive(int r) {
  uint64_t seen = 0;
  for (;;) {
    RankCommand job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    try {
      ranks_[size_t(r)].runner->apply(job);
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

void RankGroup::start(const RankCommand& c) {
  const bool remote = opts_.rank0 == 0 && !opts_.links.empty();
  {
    std::lock_guard lk(mu_);
    SIEVE_CHECK(pending_ == 0, "a tensor-parallel job started before the last one finished");
    if (size() > 1) job_ = c;
    ++job_gen_;
    pending_ = size() - 1 + (remote ? int(opts_.links.size()) : 0);
  }
  cv_.notify_all();
  if (!remote) return;
  const std::string frame = encode_command(c);
  for (auto& l : opts_.links) {
    try {
      l->send(frame);
    } catch (const Error& e) {
      fail(-1, "node " + std::to_string(l->node()) + ": " + e.what());
    }
  }
}

void RankGroup::listen(size_t i) {
  parallel::NodeLink& l = *opts_.links[i];
  for (;;) {
    std::string answer;
    try {
      answer = l.recv();
    } catch (const Error& e) {
      bool stopping;
      {
        std::lock_guard lk(mu_);
        stopping = stop_;
      }
      if (!stopping) fail(-1, "node " + std::to_string(l.node()) + " went away: " + e.what());
      // Its part of the call in flight will not come: count it as done.
      std::lock_guard lk(mu_);
      if (pending_ > 0) pending_ = 0;
      cv_.notify_all();
      return;
    }
    if (answer != "OK")
      fail(-1, "node " + std::to_string(l.node()) + ": " + answer.substr(answer.find(' ') + 1));
    {
      std::lock_guard lk(mu_);
      --pending_;
    }
    cv_.notify_all();
  }
}

void RankGroup::follow() {
  SIEVE_CHECK(opts_.rank0 > 0 && opts_.links.size() == 1,
              "follow() is for the processes of nodes 1, 2, ...");
  parallel::NodeLink& l = *opts_.links[0];
  for (;;) {
    const std::string frame = l.recv();  // Error when node 0 went away
    if (frame == "STOP") return;
    try {
      leader().apply(decode_command(frame));
      l.send("OK");
    } catch (const std::exception& e) {
      l.send(std::string("ERR ") + e.what());
      throw;
    }
  }
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
  job_ = RankCommand{};
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
    error_ = rank >= 0 ? "rank " + std::to_string(opts_.rank0 + rank) + " failed: " + what
                       : "group failed: " + what;
  }
  SIEVE_LOG(Error, "tensor-parallel " << error_);
  for (auto& k : ranks_)
    if (k.comm) k.comm->abort(error_);
}

}  // namespace sieve::engine
