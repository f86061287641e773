#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace sieve {
namespace {

TEST(TensorView, ContiguousStrides) {
  float buf[24];
  TensorView t(buf, DType::F32, {2, 3, 4});
  EXPECT_EQ(t.strides, (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.shape_str(), "[2, 3, 4]");
  t.strides = {1, 2, 6};
  EXPECT_FALSE(t.is_contiguous());
}

TEST(Error, CheckThrowsWithLocation) {
  try {
    SIEVE_CHECK(1 == 2, "numbers differ");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("numbers differ"), std::string::npos);
  }
}

}  // namespace
}  // namespace sieve
