// NCCL communicators on the GPU machine (label gpu): a group of one is the identity bit for bit,
// and with several GPUs the sums and gathers match the thread group's.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/memory.h"
#include "parallel/nccl_group.h"
#include "parallel/thread_group.h"

namespace sieve::parallel {
namespace {

TEST(Nccl, AGroupOfOneLeavesTheDataAsItIs) {
  if (cuda_device_count() == 0 || !have_nccl()) GTEST_SKIP() << "no CUDA device or no NCCL";
  Device dev{DeviceKind::CUDA, 0};
  auto c = nccl_collective(nccl_unique_id(), 0, 1, 0);
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 2);
  std::vector<float> h(4097);
  for (auto& v : h) v = d(rng);
  Buffer b(dev, h.size() * 4);
  copy_to_device(dev, b.data(), h.data(), h.size() * 4);
  ops::Stream s{dev, create_stream(dev)};
  ops::AllReduceParams p;
  p.data = b.data();
  p.count = int64_t(h.size());
  p.group = c.get();
  c->all_reduce_sum(p.data, DType::F32, p.count, s);
  Buffer g(dev, h.size() * 4);
  c->all_gather(b.data(), g.data(), DType::F32, p.count, s);
  device_synchronize(dev);
  std::vector<float> back(h.size()), gathered(h.size());
  copy_to_host(dev, back.data(), b.data(), h.size() * 4);
  copy_to_host(dev, gathered.data(), g.data(), h.size() * 4);
  EXPECT_EQ(std::memcmp(back.data(), h.data(), h.size() * 4), 0);
  EXPECT_EQ(std::memcmp(gathered.data(), h.data(), h.size() * 4), 0);
  destroy_stream(dev, s.cuda_stream);
}

TEST(Nccl, RanksOnSeveralGpusSumAndGather) {
  const int n = cuda_device_count();
  if (n < 2 || !have_nccl()) GTEST_SKIP() << "needs two CUDA devices and NCCL";
  const std::string id = nccl_unique_id();
  const int64_t count = 1000;
  std::vector<std::vector<float>> results(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(count)));
  const std::vector<std::string> errors = run_on_threads(n, [&](int r) {
    Device dev{DeviceKind::CUDA, r};
    auto c = nccl_collective(id, r, n, r);
    std::vector<float> h(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) h[size_t(i)] = float(r + 1) * float(i % 17);
    Buffer b(dev, h.size() * 4);
    copy_to_device(dev, b.data(), h.data(), h.size() * 4);
    ops::Stream s{dev, create_stream(dev)};
    c->all_reduce_sum(b.data(), DType::F32, count, s);
    device_synchronize(dev);
    copy_to_host(dev, results[size_t(r)].data(), b.data(), h.size() * 4);
    destroy_stream(dev, s.cuda_stream);
  });
  const float ranks_sum = float(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[size_t(r)], "");
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(results[size_t(r)][size_t(i)], ranks_sum * float(i % 17));
  }
}

TEST(Nccl, AGroupWhosePeerNeverJoinsTimesOut) {
  if (cuda_device_count() == 0 || !have_nccl()) GTEST_SKIP() << "no CUDA device or no NCCL";
  try {
    nccl_collective(nccl_unique_id(), 0, 2, 0, std::chrono::seconds(3));
    FAIL() << "a group of two formed with one rank";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not form"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sieve::parallel
