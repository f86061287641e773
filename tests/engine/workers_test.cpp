// The engine's worker pool: every index once per run, across many runs; the caller's exception
// comes back; no helpers means the caller does it all.
#include "engine/workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace sieve::engine {
namespace {

TEST(Workers, EveryIndexOnceAcrossRuns) {
  for (int threads : {0, 1, 3}) {
    Workers w(threads);
    EXPECT_EQ(w.threads(), threads);
    for (int run = 0; run < 200; ++run) {
      const int n = run % 37;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      w.run(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " " << run << " " << i;
    }
  }
}

TEST(Workers, AnExceptionComesBackAfterTheRest) {
  Workers w(2);
  std::atomic<int> done{0};
  EXPECT_THROW(w.run(50,
                     [&](int64_t i) {
                       if (i == 7) throw std::runtime_error("seven");
                       done.fetch_add(1);
                     }),
               std::runtime_error);
  EXPECT_EQ(done.load(), 49);
  // The pool still works.
  done = 0;
  w.run(10, [&](int64_t) { done.fetch_add(1); });
  EXPECT_EQ(done.load(), 10);
}

}  // namespace
}  // namespace sieve::engine
