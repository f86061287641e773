#include "parallel/thread_group.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace sieve::parallel {
namespace {

class ThreadGroupSizes : public ::testing::TestWithParam<int> {};

TEST_P(ThreadGroupSizes, AllReduceSumsInRankOrderOnEveryRank) {
  const int n = GetParam();
  std::mt19937 rng(1234 + n);
  std::normal_distribution<float> d(0, 3);
  for (int64_t count : {1, 127, 128, 1000, 4099}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      ThreadGroup g(n);
      std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n), std::vector<uint8_t>(size_t(count) * dtype_size(dt)));
      for (auto& b : bufs)
        for (int64_t i = 0; i < count; ++i) store_from_f32(b.data(), dt, size_t(i), d(rng));
      std::vector<float> want(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        float acc = 0;
        for (int r = 0; r < n; ++r) acc += load_as_f32(bufs[size_t(r)].data(), dt, size_t(i));
        want[size_t(i)] = dt == DType::BF16 ? round_bf16(acc) : acc;
      }
      auto errors = run_on_threads(n, [&](int r) {
        for (int rep = 0; rep < 3; ++rep) {  // the same buffer reduced again must keep working
          if (rep > 0) std::fill(bufs[size_t(r)].begin(), bufs[size_t(r)].end(), 0);
          if (rep > 0 && r == 0)
            for (int64_t i = 0; i < count; ++i) store_from_f32(bufs[0].data(), dt, size_t(i), want[size_t(i)]);
          g.rank(r)->all_reduce_sum(bufs[size_t(r)].data(), dt, count, ops::Stream::cpu());
        }
      });
      for (const auto& e : errors) ASSERT_EQ(e, "");
      for (int r = 0; r < n; ++r)
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(load_as_f32(bufs[size_t(r)].data(), dt, size_t(i)), want[size_t(i)])
              << "rank " << r << " element " << i << " count " << count;
    }
  }
}

TEST_P(ThreadGroupSizes, AllGatherConcatenatesInRankOrder) {
  const int n = GetParam();
  const int64_t count = 301;
  ThreadGroup g(n);
  std::vector<std::vector<int32_t>> in(static_cast<size_t>(n), std::vector<int32_t>(static_cast<size_t>(count)));
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n), std::vector<int32_t>(size_t(n * count), -7));
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) in[size_t(r)][size_t(i)] = int32_t(r * 100000 + i * 7 + 3);
  auto errors = run_on_threads(n, [&](int r) {
    g.rank(r)->all_gather(in[size_t(r)].data(), out[size_t(r)].data(), DType::I32, count, ops::Stream::cpu());
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out[size_t(r)][size_t(q * count + i)], in[size_t(q)][size_t(i)]);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadGroupSizes, ::testing::Values(1, 2, 3, 4, 8));

TEST(ThreadGroup, AFailedRankStopsTheOthersWithItsReason) {
  ThreadGroup g(4);
  std::vector<float> bufs(4 * 16, 1.0f);
  auto errors = run_on_threads(4, [&](int r) {
    if (r == 2) {
      g.abort("rank 2 failed: out of memory");
      throw Error("rank 2 failed: out of memory");
    }
    g.rank(r)->all_reduce_sum(bufs.data() + r * 16, DType::F32, 16, ops::Stream::cpu());
  });
  for (int r = 0; r < 4; ++r) EXPECT_NE(errors[size_t(r)].find("out of memory"), std::string::npos) << errors[size_t(r)];
  EXPECT_TRUE(g.aborted());
}

TEST(ThreadGroup, ARankThatNeverComesEndsInATimeoutNotAHang) {
  ThreadGroup g(3, std::chrono::milliseconds(200));
  std::vector<float> bufs(3 * 8, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = run_on_threads(3, [&](int r) {
    if (r == 1) return;  // never joins
    g.rank(r)->all_reduce_sum(bufs.data() + r * 8, DType::F32, 8, ops::Stream::cpu());
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_NE(errors[0].find("waited"), std::string::npos) << errors[0];
  EXPECT_NE(errors[2].find("stopped"), std::string::npos) << errors[2];
}

TEST(ThreadGroup, RefusesDtypesItCannotSum) {
  ThreadGroup g(1);
  int32_t x = 3;
  EXPECT_THROW(g.rank(0)->all_reduce_sum(&x, DType::I32, 1, ops::Stream::cpu()), Error);
  EXPECT_THROW(ThreadGroup(0), Error);
}

TEST(ThreadGroup, OpsDispatchSkipsGroupsOfOne) {
  ThreadGroup g(1);
  float x[3] = {1, 2, 3};
  ops::AllReduceParams p;
  p.data = x;
  p.count = 3;
  p.group = g.rank(0);
  ops::all_reduce(p, ops::Stream::cpu());
  EXPECT_EQ(x[2], 3.0f);
  p.group = nullptr;
  ops::all_reduce(p, ops::Stream::cpu());
  EXPECT_EQ(x[0], 1.0f);
}

}  // namespace
}  // namespace sieve::parallel
