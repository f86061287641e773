// CUDA sample op vs the CPU reference (kernels/ops.h): greedy and skipped rows exactly, draws the
// same id or, where u falls within rounding of a boundary, an id whose interval of the rule's
// running sum holds u within 1e-12 of the total; filtered rows likewise (their min-p and top-p
// boundaries too); plain and shard layouts, the id map, rows without mass, and the op captured
// in a CUDA graph.
#include <gtest/gtest.h>

#include <functional>
#include <utility>

#include "cuda_test_util.h"
#include "sample_test_util.h"

namespace sieve::test {
namespace {

struct DevCase {
  Dev logits, row, map, out;
  ops::SampleParams p;
  explicit DevCase(const SampleCase& c)
      : logits(Dev::of(c.logits)), row(Dev::of(c.row)), map(Dev::of(c.id_map)), out(size_t(c.rows) * 4) {
    out.poison(0x5a);
    p.logits = logits.as<float>();
    p.rows = c.rows;
    p.vocab = c.vocab;
    p.shards = c.shards;
    p.row = row.as<ops::SampleRow>();
    p.id_map = c.id_map.empty() ? nullptr : map.as<int32_t>();
    p.out = out.as<int32_t>();
  }
};

// Compares the GPU's ids with the CPU's; returns how many draws differed (within tolerance).
int compare(const SampleCase& c, const std::vector<int32_t>& gpu, const std::vector<int32_t>& cpu) {
  int near_boundary = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const auto mode = ops::SampleMode(c.row[size_t(r)].mode);
    if (mode == ops::SampleMode::Filtered && gpu[size_t(r)] != cpu[size_t(r)]) {
      // (-1 only where the CPU gives it: a row without mass or with a NaN or +inf.)
      EXPECT_GE(gpu[size_t(r)], 0);
      EXPECT_EQ(check_filtered(c.rows_plain.data() + r * c.vocab, c.vocab, c.row[size_t(r)], unmap(c, gpu[size_t(r)]),
                               1e-12),
                "");
      ++near_boundary;
      continue;
    }
    if (mode != ops::SampleMode::Draw || gpu[size_t(r)] == cpu[size_t(r)] || cpu[size_t(r)] < 0) {
      EXPECT_EQ(gpu[size_t(r)], cpu[size_t(r)]);
      continue;
    }
    const int32_t id = unmap(c, gpu[size_t(r)]);
    EXPECT_EQ(check_draw(c.rows_plain.data() + r * c.vocab, c.vocab, c.row[size_t(r)].inv_t, c.row[size_t(r)].u, id,
                         1e-12),
              "");
    ++near_boundary;
  }
  return near_boundary;
}

// The op against the CPU on cases of 37, 1000 and 200,064 columns, plain and 8 shards, with and
// without a map, of 1, `mid` (not at 200,064) and 128 rows made by `make`; returns how many rows
// differed within tolerance and how many rows of mode `counted` there were.
std::pair<int, int> compare_layouts(const std::function<SampleCase(int64_t, int64_t, int, bool)>& make, int64_t mid,
                                    ops::SampleMode counted) {
  int differed = 0, rows_of_mode = 0;
  for (int64_t vocab : {int64_t(37), int64_t(1000), int64_t(200064)})
    for (int shards : {1, 8})
      for (bool map : {false, true})
        for (int64_t rows : {int64_t(1), mid, int64_t(128)}) {
          if (vocab % shards != 0 || (vocab > 100000 && rows == mid)) continue;
          SCOPED_TRACE("vocab " + std::to_string(vocab) + " shards " + std::to_string(shards) + " rows " +
                       std::to_string(rows) + (map ? " mapped" : ""));
          const SampleCase c = make(rows, vocab, shards, map);
          DevCase d(c);
          ops::sample(d.p, ops::Stream{kGpu, nullptr});
          const std::vector<int32_t> gpu = d.out.get<int32_t>(size_t(rows));
          differed += compare(c, gpu, run_sample_cpu(c));
          for (const auto& sr : c.row) rows_of_mode += sr.mode == int32_t(counted);
        }
  return {differed, rows_of_mode};
}

TEST(CudaSample, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [differed, draws] = compare_layouts(
      [](int64_t rows, int64_t vocab, int shards, bool map) {
        return make_sample_case(rows, vocab, shards, map, uint64_t(vocab + rows * 13 + shards + map));
      },
      45, ops::SampleMode::Draw);
  // Boundary cases are rare: most draws agree exactly.
  EXPECT_LE(differed * 100, draws) << differed << " of " << draws << " draws differed";
}

// Case c (plain layout) with u = 0 in row 0 and the largest double below 1 in row 1, on the GPU
// against the CPU; returns how many rows differed within tolerance.
int compare_with_the_ends(SampleCase& c) {
  c.row[0].u = 0.0;
  c.row[1].u = std::nextafter(1.0, 0.0);
  c.logits = c.rows_plain;
  DevCase d(c);
  ops::sample(d.p, ops::Stream{kGpu, nullptr});
  return compare(c, d.out.get<int32_t>(size_t(c.rows)), run_sample_cpu(c));
}

// Many draws of one flat row at u spread over [0, 1): every id is checked against the rule.
TEST(CudaSample, DrawsAcrossTheDistribution) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 200064, rows = 96;
  Rng rng(7);
  std::vector<float> one = random_vector(size_t(vocab), rng, -2.0f, 2.0f);
  for (int64_t i = 0; i < vocab; i += 17) one[size_t(i)] = -INFINITY;
  SampleCase c;
  c.rows = rows;
  c.vocab = vocab;
  c.row.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    c.rows_plain.insert(c.rows_plain.end(), one.begin(), one.end());
    c.row[size_t(r)] = {r % 2 ? 1.0 : 0.25, (double(r) + 0.5) / double(rows), int32_t(ops::SampleMode::Draw), 0};
  }
  EXPECT_LE(compare_with_the_ends(c), 2);
}

// Filtered rows (top-k, min-p, top-p) among greedy, draw and skipped ones: the CPU's ids, or where
// the device's exp moved a boundary by its last bit, an id the rule gives within 1e-12 of it.
TEST(CudaSample, FilteredMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [differed, filtered] = compare_layouts(
      [](int64_t rows, int64_t vocab, int shards, bool map) {
        return make_filtered_case(rows, vocab, shards, map, uint64_t(vocab * 3 + rows * 11 + shards + map));
      },
      54, ops::SampleMode::Filtered);
  EXPECT_LE(differed * 100, filtered + 100) << differed << " of " << filtered << " filtered rows and draws differed";
}

// One row of a 200k vocabulary drawn at u spread over [0, 1) under each filter: every id is
// checked against the rule, and they agree with the CPU's but for boundary cases.
TEST(CudaSample, FilteredDrawsAcrossTheDistribution) {
  SKIP_WITHOUT_GPU();
  const int64_t vocab = 200064, rows = 128;
  Rng rng(11);
  std::vector<float> one(static_cast<size_t>(vocab));
  for (auto& v : one) v = rng.normal(2.0f);
  for (int64_t i = 0; i < vocab; i += 13) one[size_t(i)] = -INFINITY;
  for (int64_t i = 5; i < vocab; i += 4001) one[size_t(i)] = 6.5f;  // ties at the top
  SampleCase c;
  c.rows = rows;
  c.vocab = vocab;
  c.row.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    c.rows_plain.insert(c.rows_plain.end(), one.begin(), one.end());
    ops::SampleRow& sr = c.row[size_t(r)];
    sr.mode = int32_t(ops::SampleMode::Filtered);
    sr.inv_t = r % 2 ? 1.0 : 1.0 / 0.7;
    sr.u = (double(r / 4) + 0.5) / double(rows / 4);
    sr.top_k = r % 4 == 0 ? 40 : (r % 4 == 1 ? ops::kMaxDeviceTopK : 50);
    sr.top_p = r % 4 == 2 ? 1.0 : 0.95;
    sr.min_p = r % 4 == 3 ? 0.05 : 0.0;
  }
  EXPECT_LE(compare_with_the_ends(c), 2);
}

TEST(CudaSample, GraphReplayGivesTheEagerIds) {
  SKIP_WITHOUT_GPU();
  const SampleCase c = make_filtered_case(33, 200064, 8, false, 99);
  DevCase d(c);
  void* stream = create_stream(kGpu);
  ops::sample(d.p, ops::Stream{kGpu, stream});  // sizes the scratch outside the capture
  device_synchronize(kGpu);
  const std::vector<int32_t> eager = d.out.get<int32_t>(size_t(c.rows));
  d.out.poison(0x5a);
  std::string why;
  Graph g = Graph::capture(kGpu, stream, [&] { ops::sample(d.p, ops::Stream{kGpu, stream}); }, &why);
  ASSERT_TRUE(g) << why;
  g.replay(stream);
  device_synchronize(kGpu);
  EXPECT_EQ(d.out.get<int32_t>(size_t(c.rows)), eager);
  destroy_stream(kGpu, stream);
}

}  // namespace
}  // namespace sieve::test
