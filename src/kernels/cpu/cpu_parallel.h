// Internal to kernels/cpu: a tiny fork-join helper for the CPU reference ops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace sieve::cpu::detail {

// At most this many threads per op (the CPU oracle must stay cheap to run next to a test suite).
constexpr int kMaxThreads = 2;

inline int cpu_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return std::max(1, std::min<int>(kMaxThreads, hw == 0 ? 1 : int(hw)));
}

// Calls fn(begin, end) on disjoint chunks of [0, n) (chunk bounds multiples of `align`), on up to
// cpu_threads() threads when `work` (a rough flop count) exceeds `min_work`; inline otherwise.
template <class Fn>
void parallel_for(int64_t n, double work, Fn&& fn, int64_t align = 1, double min_work = 1e6) {
  int nt = cpu_threads();
  if (n <= 0) return;
  if (nt <= 1 || work <= min_work || n < 2 * align) {
    fn(int64_t(0), n);
    return;
  }
  int64_t units = (n + align - 1) / align;
  nt = int(std::min<int64_t>(nt, units));
  std::vector<std::thread> threads;
  int64_t begin = 0;
  for (int i = 0; i < nt; ++i) {
    int64_t end = std::min(n, ((units * (i + 1)) / nt) * align);
    if (i == nt - 1) end = n;
    if (i + 1 < nt) {
      threads.emplace_back([&fn, begin, end] { fn(begin, end); });
    } else {
      fn(begin, end);
    }
    begin = end;
  }
  for (auto& th : threads) th.join();
}

}  // namespace sieve::cpu::detail
