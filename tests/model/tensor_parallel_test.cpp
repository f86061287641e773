// Tensor and expert parallelism on the CPU backend (thread ranks, engine/rank_group.h): the
// log-probs of tp 2 and tp 4 equal those of one rank within fp32 summation-order tolerance and the
// greedy continuations are the same, on tiny random models of three layouts (index top-k sharing;
// fewer kv heads than ranks, which replicates them); expert parallelism likewise; shapes that do
// not split, and a rank that fails or stalls, end in an Error instead of a hang.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/rank_group.h"
#include "engine/runner.h"
#include "io/tiny_model.h"
#include "model/model.h"
#include "parallel/rendezvous.h"
#include "parallel/thread_group.h"
#include "tp_util.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;

struct Layout {
  std::string name;
  TinyModelOptions opts;
  std::string overrides;
};

std::vector<Layout> layouts() {
  std::vector<Layout> v;
  Layout a;  // M3 in miniature: dense layer 0, then sparse + MoE with a shared expert
  a.name = "m3";
  a.opts.seed = 101;
  v.push_back(a);
  Layout b;  // every other sparse layer reuses the index top-k of the one before
  b.name = "shared_index";
  b.opts.seed = 202;
  b.opts.num_layers = 5;
  b.opts.num_kv_heads = 4;
  b.overrides = R"({"use_index_cache": true, "index_topk_freq": 2})";
  v.push_back(b);
  Layout c;  // one kv head for 8 query heads: replicated on every rank; no shared expert
  c.name = "one_kv_head";
  c.opts.seed = 303;
  c.opts.num_heads = 8;
  c.opts.num_kv_heads = 1;
  c.opts.sparse_layers = {0, 1, 1, 0};
  c.opts.moe_layers = {1, 0, 1, 1};
  c.opts.shared_intermediate = 0;
  c.opts.init_blocks = 1;
  c.opts.topk_blocks = 2;
  v.push_back(c);
  return v;
}

std::string write_model(const Layout& l) {
  fs::path p =
      fs::temp_directory_path() / ("sieve_tp_test_" + l.name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  write_tiny_model(l.opts, p.string());
  return p.string();
}

// A group of `tp` CPU ranks over the model in `dir` (tp 1: one rank, no communicator).
std::unique_ptr<engine::RankGroup> group(
    const std::string& dir, const std::string& overrides, int tp, bool ep = false,
    std::chrono::milliseconds timeout = std::chrono::minutes(2)) {
  engine::RankGroupOptions o;
  o.size = tp;
  o.timeout = timeout;
  return std::make_unique<engine::RankGroup>(std::move(o),
                                             [&](int r, const Device& dev, ops::Collective* c) {
                                               model::LoadOptions lo;
                                               lo.hf_overrides = overrides;
                                               lo.device = dev;
                                               lo.tp_size = tp;
                                               lo.tp_rank = r;
                                               lo.group = c;
                                               lo.expert_parallel = ep;
                                               return model::Model::load(dir, lo);
                                             });
}

struct Result {
  std::vector<float> logprobs;
  std::vector<int32_t> greedy;
};

Result run(engine::RankGroup& g, const std::vector<int32_t>& prompt) {
  model::CacheOptions co;
  co.kv_dtype = co.index_dtype = DType::F32;
  co.num_blocks = testing::kBlocks;
  g.leader().allocate_caches(co);
  Result r;
  // 300 tokens: 3 blocks of 128, of which sparse layers keep 2, so selection drops blocks.
  r.logprobs = testing::run_sequence(g.leader(), prompt, 113, 8, &r.greedy);
  return r;
}

void expect_same(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  double d = 0, scale = 0;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    ASSERT_FALSE(std::isnan(b.logprobs[i])) << what << " at " << i;
    d = std::max(d, double(std::fabs(a.logprobs[i] - b.logprobs[i])));
    scale = std::max(scale, double(std::fabs(a.logprobs[i])));
  }
  EXPECT_GT(scale, 1.0) << what << ": log-probs too flat to test anything";
  EXPECT_LT(d, 2e-4) << what << ": largest log-prob difference";
  EXPECT_EQ(a.greedy, b.greedy) << what << ": greedy continuations differ";
}

TEST(TensorParallel, ShardedRanksGiveTheLogProbsOfOneRank) {
  for (const Layout& l : layouts()) {
    const std::string dir = write_model(l);
    const auto prompt = testing::random_prompt(300, l.opts.vocab_size, l.opts.seed + 1);
    const Result one = run(*group(dir, l.overrides, 1), prompt);
    for (int tp : {2, 4}) {
      auto g = group(dir, l.overrides, tp);
      ASSERT_EQ(g->model(1).logits_shards(), tp);
      expect_same(one, run(*g, prompt), l.name + " tp " + std::to_string(tp));
    }
    fs::remove_all(dir);
  }
}

TEST(TensorParallel, AGroupOfOneEqualsNoGroupBitForBit) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  const auto prompt = testing::random_prompt(300, l.opts.vocab_size, 9);
  const Result plain = run(*group(dir, l.overrides, 1), prompt);
  parallel::ThreadGroup one(1);
  engine::RankGroupOptions o;
  engine::RankGroup g(std::move(o), [&](int, const Device&, ops::Collective*) {
    model::LoadOptions lo;
    lo.group = one.rank(0);  // its collectives run (the identity)
    return model::Model::load(dir, lo);
  });
  const Result grouped = run(g, prompt);
  ASSERT_EQ(plain.logprobs.size(), grouped.logprobs.size());
  EXPECT_EQ(std::memcmp(plain.logprobs.data(), grouped.logprobs.data(),
                        plain.logprobs.size() * sizeof(float)),
            0);
  EXPECT_EQ(plain.greedy, grouped.greedy);
  fs::remove_all(dir);
}

TEST(TensorParallel, ExpertParallelRanksGiveTheLogProbsOfOneRank) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  const auto prompt = testing::random_prompt(300, l.opts.vocab_size, 7);
  const Result one = run(*group(dir, l.overrides, 1), prompt);
  for (int tp : {2, 4})
    expect_same(one, run(*group(dir, l.overrides, tp, true), prompt), "ep " + std::to_string(tp));
  fs::remove_all(dir);
}

void expect_error(const std::function<void()>& fn, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one with \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Two "machines" in one process: a rank each, their collectives over a thread group, node 0's
// calls handed to node 1 over the rendezvous connection on loopback.
struct TwoNodes {
  parallel::ThreadGroup comms{2};
  std::unique_ptr<engine::RankGroup> node[2];

  explicit TwoNodes(const std::string& dir) {
    int port = 0;
    {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      socklen_t len = sizeof a;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
      ::close(fd);
    }
    parallel::Joined joined[2];
    std::thread t([&] {
      parallel::RendezvousOptions r{"127.0.0.1:" + std::to_string(port), 2, 1, "tp test",
                                    std::chrono::seconds(20)};
      joined[1] = parallel::rendezvous_links(r, "");
    });
    parallel::RendezvousOptions r{"127.0.0.1:" + std::to_string(port), 2, 0, "tp test",
                                  std::chrono::seconds(20)};
    joined[0] = parallel::rendezvous_links(r, "id");
    t.join();
    for (int n : {1, 0}) {
      engine::RankGroupOptions o;
      o.rank0 = n;
      o.world = 2;
      o.timeout = std::chrono::seconds(20);
      o.links = std::move(joined[n].links);
      o.comms = {comms.rank(n)};
      node[n] = std::make_unique<engine::RankGroup>(
          std::move(o), [&](int rank, const Device&, ops::Collective* c) {
            model::LoadOptions lo;
            lo.tp_size = 2;
            lo.tp_rank = rank;
            lo.group = c;
            return model::Model::load(dir, lo);
          });
    }
  }
};

TEST(TensorParallel, RanksOnTwoNodesGiveTheLogProbsOfOneRank) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  const auto prompt = testing::random_prompt(300, l.opts.vocab_size, 21);
  const Result one = run(*group(dir, l.overrides, 1), prompt);
  TwoNodes two(dir);
  EXPECT_FALSE(two.node[0]->follows_another_node());
  ASSERT_TRUE(two.node[1]->follows_another_node());
  std::string follow_error = "not returned";
  std::thread follower([&] {
    try {
      two.node[1]->follow();
      follow_error.clear();
    } catch (const std::exception& e) {
      follow_error = e.what();
    }
  });
  expect_same(one, run(*two.node[0], prompt), "two nodes");
  two.node[0].reset();  // ends the run: node 1's follow() returns
  follower.join();
  EXPECT_EQ(follow_error, "");
  fs::remove_all(dir);
}

TEST(TensorParallel, ARankThatFailsOnAnotherNodeStopsNodeZero) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  TwoNodes two(dir);
  two.node[1]->runner(0).set_phase_observer([](engine::Runner::Phase p) {
    if (p == engine::Runner::Phase::Computed) throw Error("injected failure");
  });
  std::string follow_error;
  std::thread follower([&] {
    try {
      two.node[1]->follow();
    } catch (const std::exception& e) {
      follow_error = e.what();
    }
  });
  expect_error([&] { run(*two.node[0], testing::random_prompt(40, l.opts.vocab_size, 3)); },
               "node 1: injected failure");
  follower.join();
  EXPECT_EQ(follow_error, "injected failure");
  two.node[0].reset();
  fs::remove_all(dir);
}

TEST(TensorParallel, ShapesThatDoNotSplitAreNamed) {
  Layout l = layouts()[0];
  l.opts.num_experts = 6;
  const std::string dir = write_model(l);
  expect_error([&] { group(dir, "", 3); }, "num_attention_heads = 4 does not split over 3");
  expect_error([&] { group(dir, "", 8); }, "num_attention_heads = 4 does not split over 8");
  expect_error([&] { group(dir, R"({"vocab_size": 510})", 4); }, "vocab_size = 510");
  expect_error([&] { group(dir, "", 4, true); }, "num_local_experts = 6 does not split over 4");
  fs::remove_all(dir);
}

TEST(TensorParallel, ARankThatFailsStopsTheGroup) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  auto g = group(dir, l.overrides, 2);
  const auto prompt = testing::random_prompt(40, l.opts.vocab_size, 3);
  g->runner(1).set_phase_observer([](engine::Runner::Phase p) {
    if (p == engine::Runner::Phase::Computed) throw Error("injected failure");
  });
  // Rank 1 fails after its forward, while rank 0 may still be in a collective.
  expect_error([&] { run(*g, prompt); }, "rank 1 failed: injected failure");
  EXPECT_NE(g->leader().broken(), "");
  expect_error([&] { run(*g, prompt); }, "stopped earlier");
  fs::remove_all(dir);
}

TEST(TensorParallel, ARankThatStallsTimesOut) {
  const Layout l = layouts()[0];
  const std::string dir = write_model(l);
  auto g = group(dir, l.overrides, 2, false, std::chrono::milliseconds(300));
  g->runner(1).set_phase_observer([](engine::Runner::Phase p) {
    if (p == engine::Runner::Phase::Begin) std::this_thread::sleep_for(std::chrono::seconds(2));
  });
  expect_error([&] { run(*g, testing::random_prompt(40, l.opts.vocab_size, 3)); },
               "in a collective for the other ranks");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sieve
