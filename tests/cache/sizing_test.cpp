#include "cache/sizing.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace sieve::cache {

TEST(Sizing, ParsesByteSizes) {
  EXPECT_EQ(parse_bytes("1024", "--x"), 1024u);
  EXPECT_EQ(parse_bytes("512MiB", "--x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("512M", "--x"), 512ull << 20);
  EXPECT_EQ(parse_bytes("4G", "--x"), 4ull << 30);
  EXPECT_EQ(parse_bytes("1.5k", "--x"), 1536u);
  EXPECT_THROW(parse_bytes("lots", "--x"), Error);
  EXPECT_THROW(parse_bytes("12Q", "--x"), Error);
  EXPECT_THROW(parse_bytes("0", "--x"), Error);
}

TEST(Sizing, BlocksFromBytes) {
  EXPECT_EQ(blocks_for_bytes(1000, 100, "x"), 10);
  EXPECT_EQ(blocks_for_bytes(1099, 100, "x"), 10);
  EXPECT_THROW(blocks_for_bytes(99, 100, "x"), Error);
}

TEST(Sizing, GpuBudgetSubtractsMemoryInUse) {
  // 100 GB device, 30 GB in use, 0.9 -> 60 GB of cache.
  const size_t G = 1000000000;
  EXPECT_EQ(blocks_for_gpu(100 * G, 70 * G, 0.9, G), 60);
  EXPECT_THROW(blocks_for_gpu(100 * G, 70 * G, 0.2, G), Error);
  EXPECT_THROW(blocks_for_gpu(100 * G, 70 * G, 1.5, G), Error);
}

TEST(Sizing, SparseModelsNeedBlockSize128) {
  EXPECT_NO_THROW(check_block_size(128, 128, true));
  try {
    check_block_size(16, 128, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--block-size 128"), std::string::npos);
  }
  EXPECT_THROW(check_block_size(0, 128, false), Error);
}

}  // namespace sieve::cache
