#pragma once
// splitmix64: a tiny, fully specified generator, so the same seed gives the same values with any
// standard library (std::normal_distribution is implementation-defined). Tiny models, EAGLE3
// drafts and dummy weights are drawn from it.

#include <cmath>
#include <cstdint>

namespace sieve {

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  // Box-Muller; one value per call keeps the stream simple.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace sieve
