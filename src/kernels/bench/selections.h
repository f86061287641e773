// Block selections as tiled sparse attention sees them: their locality statistics (how many
// distinct blocks a tile of consecutive query tokens touches) and a generator of selections with
// a trained indexer's locality for the kernel benchmark. Host code only: the benchmark, the CPU
// tests and `sieve eval selections` (which measures the bundled model) share it.
#pragma once

#include <cstdint>
#include <vector>

namespace sieve::kernels_bench {

// Tile sizes (consecutive query tokens of one kv head) the statistics report.
inline constexpr int kLocalityTiles[3] = {8, 16, 64};
// Distance buckets of the non-local picks (d = blocks below the first forced local block, >= 1):
// d = 1, 2-3, 4-7, 8-15, 16-31, >= 32.
inline constexpr int kDistanceBuckets = 6;

struct LocalityStats {
  int64_t tokens = 0;         // tokens that choose (more candidate blocks than topk)
  double tile_union[3] = {};  // mean |union of a tile's blocks| / topk, per kLocalityTiles
  double shared_prev = 0;     // mean |S(t) ∩ S(t-1)| / topk
  double local_share = 0;     // share of the selected blocks that are the forced local blocks
  double block0_share = 0;    // share of the non-local picks that are block 0
  double distance[kDistanceBuckets] = {};  // shares of the non-local picks by distance bucket
};

// Accumulates the selections of one kv head over consecutive query tokens; several sequences
// (heads, layers) may be added, each with its own add_rows call.
class LocalityAccum {
 public:
  // ids: [rows, topk] block ids of positions first_pos .. first_pos + rows - 1 (any order,
  // entries < 0 are padding). Tokens with at most topk candidate blocks select them all and are
  // left out; a tile counts when all its tokens choose (tiles aligned to multiples of their size).
  void add_rows(const int32_t* ids, int rows, int topk, int first_pos, int block_size, int local_blocks);
  LocalityStats result() const;

 private:
  int64_t tokens_ = 0, pairs_ = 0, picks_ = 0, nonlocal_ = 0, block0_ = 0, local_ = 0;
  int64_t tiles_[3] = {};
  double union_sum_[3] = {}, shared_sum_ = 0;
  int64_t dist_[kDistanceBuckets] = {};
};

LocalityStats locality(const int32_t* ids, int rows, int topk, int first_pos, int block_size, int local_blocks);

// What the tiled sparse prefill attention (one TP4 rank: tiles of 8 consecutive tokens, two
// warpgroups of 4) pays for a head's selections: each tile split over the two halves the way (of
// 35) with the fewest (half, block) passes, as the kernel splits it; and, for comparison, what it
// would pay if the tokens of each aligned window of `window` tokens were first regrouped into
// tiles of 8 greedily by shared blocks (a tile starts from the window's earliest token left and
// takes, seven times, the token sharing most blocks with its union, the earliest on ties).
// Passes are relative to 2 x topk: 1.0 when each half's tokens select the same blocks, 4.0 when
// they share none. Tokens with at most topk candidate blocks are left out, as in LocalityAccum;
// regrouped windows' last tiles of fewer than 8 tokens too.
inline constexpr int kPassTile = 8;

class TilePassAccum {
 public:
  void add_rows(const int32_t* ids, int rows, int topk, int first_pos, int block_size, int window);
  void merge(const TilePassAccum& other);  // what other has accumulated, added to this
  int64_t tiles() const { return tiles_; }
  double passes() const { return tiles_ ? sum_ / double(tiles_) : 0; }
  int64_t regrouped_tiles() const { return regrouped_tiles_; }
  double regrouped_passes() const { return regrouped_tiles_ ? regrouped_sum_ / double(regrouped_tiles_) : 0; }

 private:
  int64_t tiles_ = 0, regrouped_tiles_ = 0;
  double sum_ = 0, regrouped_sum_ = 0;
};

// The generator's rule (a Markov chain over consecutive tokens of one head). Each token selects
// its forced local blocks, keeps each non-local block of the previous token's selection with
// probability `keep` (in random order, while room is left), and fills the rest by drawing
// without replacement among its causal blocks: block 0 first with probability `sink` when
// absent, then the others with weight d^-recency (d = blocks below the first local block).
struct TrainedLike {
  double keep = 0;
  double recency = 0;
  double sink = 0;
};

// What `sieve eval selections --tokens 2048 --block-size 32 --topk 16 --fit` measured on the
// bundled model (models/minimax-m3-tiny over data/heldout/heldout.txt: its trained context, 64
// blocks, as the benchmark's 8192 tokens have in blocks of 128; docs/kernels.md) and the rule
// fitted to it at the benchmark's shape (blocks of 128, topk 16, 8192 tokens).
LocalityStats trained_target();
TrainedLike trained_like();

// Fills out [rows, topk] for positions first_pos .. first_pos + rows - 1: the ids of each row
// sorted ascending and unique, min(topk, blocks) of them, then -1 padding; block ids are
// causal (< position / block_size + 1) and include the forced local blocks. Deterministic in seed.
void generate_selections(const TrainedLike& rule, int topk, int block_size, int local_blocks, int first_pos,
                         int rows, uint64_t seed, int32_t* out);

// The rule whose selections at the given shape best match target's unions of 8 and 16 tokens
// and shared share (a grid search over keep and recency, sink given).
TrainedLike fit_trained_like(const LocalityStats& target, double sink, int topk, int block_size,
                             int local_blocks, int first_pos, int rows, uint64_t seed);

}  // namespace sieve::kernels_bench
