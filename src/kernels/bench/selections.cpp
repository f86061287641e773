#include "kernels/bench/selections.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace sieve::kernels_bench {

namespace {

int distance_bucket(int d) {
  int b = 0;
  while (b + 1 < kDistanceBuckets && d >= (2 << b)) ++b;
  return b;
}

// A uniform double in [0, 1) from the generator's bits (the same on every standard library).
double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace

void LocalityAccum::add_rows(const int32_t* ids, int rows, int topk, int first_pos, int block_size,
                             int local_blocks) {
  SIEVE_CHECK(topk > 0 && block_size > 0 && local_blocks >= 0 && rows >= 0, "locality: bad shape");
  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(rows));
  std::vector<char> chooses(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    const int n_blk = (first_pos + r) / block_size + 1;
    auto& s = sel[size_t(r)];
    for (int k = 0; k < topk; ++k)
      if (ids[size_t(r) * topk + k] >= 0) s.push_back(ids[size_t(r) * topk + k]);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    chooses[size_t(r)] = n_blk > topk;
    if (!chooses[size_t(r)]) continue;
    ++tokens_;
    const int first_local = n_blk - local_blocks;
    for (const int32_t b : s) {
      ++picks_;
      if (b >= first_local) {
        ++local_;
        continue;
      }
      ++nonlocal_;
      if (b == 0) ++block0_;
      ++dist_[distance_bucket(first_local - b)];
    }
    if (r > 0 && chooses[size_t(r) - 1]) {
      const auto& p = sel[size_t(r) - 1];
      std::vector<int32_t> both;
      std::set_intersection(s.begin(), s.end(), p.begin(), p.end(), std::back_inserter(both));
      shared_sum_ += double(both.size()) / topk;
      ++pairs_;
    }
  }
  for (int ti = 0; ti < 3; ++ti) {
    const int w = kLocalityTiles[ti];
    for (int r0 = (w - first_pos % w) % w; r0 + w <= rows; r0 += w) {
      bool all = true;
      std::vector<int32_t> u;
      for (int r = r0; r < r0 + w && all; ++r) {
        all = chooses[size_t(r)];
        u.insert(u.end(), sel[size_t(r)].begin(), sel[size_t(r)].end());
      }
      if (!all) continue;
      std::sort(u.begin(), u.end());
      u.erase(std::unique(u.begin(), u.end()), u.end());
      union_sum_[ti] += double(u.size()) / topk;
      ++tiles_[ti];
    }
  }
}

namespace {

// A set of block ids as bits (blocks < 64 x words).
struct BlockBits {
  std::vector<uint64_t> w;
  explicit BlockBits(size_t words) : w(words) {}
  void add(int32_t b) { w[size_t(b) >> 6] |= uint64_t(1) << (b & 63); }
  void unite(const BlockBits& o) {
    for (size_t k = 0; k < w.size(); ++k) w[k] |= o.w[k];
  }
  int count() const {
    int n = 0;
    for (const uint64_t x : w) n += __builtin_popcountll(x);
    return n;
  }
  int common(const BlockBits& o) const {
    int n = 0;
    for (size_t k = 0; k < w.size(); ++k) n += __builtin_popcountll(w[k] & o.w[k]);
    return n;
  }
};

// The fewest (half, block) passes of 8 tokens split into two halves of 4 (token t[0] in the first
// half: the 35 distinct splits).
int best_split_passes(const std::vector<BlockBits>& sel, const int* t) {
  const size_t words = sel[size_t(t[0])].w.size();
  int best = 1 << 30;
  for (int m = 0; m < (1 << kPassTile); ++m) {
    if (__builtin_popcount(unsigned(m)) != kPassTile / 2 || !(m & 1)) continue;
    BlockBits a(words), b(words);
    for (int i = 0; i < kPassTile; ++i) ((m >> i) & 1 ? a : b).unite(sel[size_t(t[i])]);
    best = std::min(best, a.count() + b.count());
  }
  return best;
}

}  // namespace

void TilePassAccum::add_rows(const int32_t* ids, int rows, int topk, int first_pos, int block_size, int window) {
  SIEVE_CHECK(topk > 0 && block_size > 0 && rows >= 0 && window >= kPassTile, "tile passes: bad shape");
  const size_t words = size_t((first_pos + rows) / block_size + 1 + 63) / 64;
  std::vector<BlockBits> sel(static_cast<size_t>(rows), BlockBits(words));
  std::vector<char> chooses(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    chooses[size_t(r)] = (first_pos + r) / block_size + 1 > topk;
    for (int k = 0; k < topk; ++k)
      if (const int32_t b = ids[size_t(r) * topk + k]; b >= 0) {
        SIEVE_CHECK(b <= (first_pos + r) / block_size, "tile passes: row " + std::to_string(r) + " selects block " +
                                                            std::to_string(b) + ", past its own");
        sel[size_t(r)].add(b);
      }
  }
  const double norm = 2.0 * topk;
  // Consecutive tiles, aligned to their size, all of whose tokens choose.
  for (int r0 = (kPassTile - first_pos % kPassTile) % kPassTile; r0 + kPassTile <= rows; r0 += kPassTile) {
    bool all = true;
    for (int r = r0; r < r0 + kPassTile; ++r) all = all && chooses[size_t(r)];
    if (!all) continue;
    int t[kPassTile];
    for (int i = 0; i < kPassTile; ++i) t[i] = r0 + i;
    sum_ += best_split_passes(sel, t) / norm;
    ++tiles_;
  }
  // Greedy regrouping within aligned windows.
  for (int w0 = -(first_pos % window); w0 < rows; w0 += window) {
    std::vector<int> left;
    for (int r = std::max(0, w0); r < std::min(rows, w0 + window); ++r)
      if (chooses[size_t(r)]) left.push_back(r);
    while (int(left.size()) >= kPassTile) {
      int t[kPassTile] = {left.front()};
      left.erase(left.begin());
      BlockBits u = sel[size_t(t[0])];
      for (int i = 1; i < kPassTile; ++i) {
        size_t pick = 0;
        int most = -1;
        for (size_t j = 0; j < left.size(); ++j)
          if (const int shared = u.common(sel[size_t(left[j])]); shared > most) most = shared, pick = j;
        t[i] = left[pick];
        left.erase(left.begin() + std::ptrdiff_t(pick));
        u.unite(sel[size_t(t[i])]);
      }
      regrouped_sum_ += best_split_passes(sel, t) / norm;
      ++regrouped_tiles_;
    }
  }
}

void TilePassAccum::merge(const TilePassAccum& o) {
  tiles_ += o.tiles_, regrouped_tiles_ += o.regrouped_tiles_;
  sum_ += o.sum_, regrouped_sum_ += o.regrouped_sum_;
}

LocalityStats LocalityAccum::result() const {
  LocalityStats s;
  s.tokens = tokens_;
  for (int ti = 0; ti < 3; ++ti) s.tile_union[ti] = tiles_[ti] ? union_sum_[ti] / double(tiles_[ti]) : 0;
  s.shared_prev = pairs_ ? shared_sum_ / double(pairs_) : 0;
  s.local_share = picks_ ? double(local_) / double(picks_) : 0;
  s.block0_share = nonlocal_ ? double(block0_) / double(nonlocal_) : 0;
  for (int b = 0; b < kDistanceBuckets; ++b) s.distance[b] = nonlocal_ ? double(dist_[b]) / double(nonlocal_) : 0;
  return s;
}

LocalityStats locality(const int32_t* ids, int rows, int topk, int first_pos, int block_size, int local_blocks) {
  LocalityAccum a;
  a.add_rows(ids, rows, topk, first_pos, block_size, local_blocks);
  return a.result();
}

LocalityStats trained_target() {
  LocalityStats s;
  s.tokens = 15360;
  s.tile_union[0] = 1.49, s.tile_union[1] = 1.66, s.tile_union[2] = 2.07;
  s.shared_prev = 0.837;
  s.local_share = 0.062;
  s.block0_share = 0.014;
  const double dist[kDistanceBuckets] = {0.066, 0.133, 0.258, 0.319, 0.164, 0.060};
  std::copy(dist, dist + kDistanceBuckets, s.distance);
  return s;
}

TrainedLike trained_like() { return TrainedLike{0.74, 2.0, 0.21}; }

void generate_selections(const TrainedLike& rule, int topk, int block_size, int local_blocks, int first_pos,
                         int rows, uint64_t seed, int32_t* out) {
  SIEVE_CHECK(topk >= local_blocks && block_size > 0 && local_blocks >= 1 && first_pos >= 0 && rows >= 0,
              "selections: need topk >= local_blocks >= 1, block_size >= 1 and positions >= 0");
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  std::vector<int32_t> prev, cur;
  std::vector<char> in;             // membership of the current row, by block id
  std::vector<double> cdf;          // cumulative weights of blocks 1 .. first_local - 1 (by distance)
  int cdf_blocks = 0;
  for (int r = 0; r < rows; ++r) {
    const int n_blk = (first_pos + r) / block_size + 1;
    const int k = std::min(topk, n_blk);
    const int first_local = std::max(0, n_blk - local_blocks);
    cur.clear();
    in.assign(size_t(n_blk), 0);
    auto take = [&](int b) {
      if (in[size_t(b)] || int(cur.size()) >= k) return;
      in[size_t(b)] = 1;
      cur.push_back(b);
    };
    for (int b = first_local; b < n_blk; ++b) take(b);
    if (n_blk <= topk) {
      for (int b = 0; b < n_blk; ++b) take(b);
    } else {
      std::shuffle(prev.begin(), prev.end(), rng);
      for (const int32_t b : prev)
        if (b < first_local && uniform(rng) < rule.keep) take(b);
      if (!in[0] && uniform(rng) < rule.sink) take(0);
      // The others: d^-recency over blocks 0 .. first_local - 1 (d = first_local - b), drawn by
      // inverse CDF and redrawn when taken; the CDF depends only on first_local.
      if (cdf_blocks != first_local) {
        cdf.assign(size_t(first_local), 0);
        double acc = 0;
        for (int d = 1; d <= first_local; ++d) cdf[size_t(d - 1)] = acc += std::pow(double(d), -rule.recency);
        cdf_blocks = first_local;
      }
      int misses = 0;
      while (int(cur.size()) < k) {
        if (misses > 64) {  // nearly every candidate is taken: the lowest free ones
          for (int b = first_local - 1; b >= 0 && int(cur.size()) < k; --b) take(b);
          break;
        }
        const double u = uniform(rng) * cdf.back();
        const int d = int(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin()) + 1;
        const int b = first_local - std::min(d, first_local);
        if (in[size_t(b)]) {
          ++misses;
          continue;
        }
        take(b);
      }
    }
    std::sort(cur.begin(), cur.end());
    int32_t* row = out + size_t(r) * topk;
    for (int i = 0; i < topk; ++i) row[i] = i < int(cur.size()) ? cur[size_t(i)] : -1;
    prev = cur;
  }
}

TrainedLike fit_trained_like(const LocalityStats& target, double sink, int topk, int block_size,
                             int local_blocks, int first_pos, int rows, uint64_t seed) {
  std::vector<int32_t> ids(size_t(rows) * topk);
  TrainedLike best{};
  double best_err = INFINITY;
  for (int ki = 0; ki <= 50; ++ki)
    for (int ri = 0; ri <= 12; ++ri) {
      const TrainedLike t{ki / 50.0, ri * 0.25, sink};
      generate_selections(t, topk, block_size, local_blocks, first_pos, rows, seed, ids.data());
      const LocalityStats s = locality(ids.data(), rows, topk, first_pos, block_size, local_blocks);
      double err = std::pow(s.shared_prev - target.shared_prev, 2);
      // Tiles of 8 and 16 (the prefill kernel's); a 64-token tile's union may exceed what the
      // shape's blocks allow when the target was measured with more of them.
      for (int ti = 0; ti < 2; ++ti) err += std::pow((s.tile_union[ti] - target.tile_union[ti]) / target.tile_union[ti], 2);
      if (err < best_err) best_err = err, best = t;
    }
  return best;
}

}  // namespace sieve::kernels_bench
